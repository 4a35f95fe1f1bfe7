"""The graph's service-token check (middleware.token_matches): what counts as the token."""

from __future__ import annotations

import pytest

from vagent_graph.http.middleware import token_matches

TOKEN = b"s3cret-token"


@pytest.mark.parametrize("header", [b"Bearer s3cret-token", b"bearer s3cret-token", b"BEARER s3cret-token "])
def test_the_token_in_a_bearer_header_passes(header: bytes) -> None:
    assert token_matches(header, TOKEN)


@pytest.mark.parametrize(
    "header",
    [
        None,
        b"",
        b"Bearer",
        b"Bearer ",
        b"s3cret-token",
        b"Basic s3cret-token",
        b"Bearer s3cret-token-and-more",
        b"Bearer s3cret-toke",
        b"Bearer S3CRET-TOKEN",
        b"Bearers3cret-token",
    ],
)
def test_anything_else_is_refused(header: bytes | None) -> None:
    assert not token_matches(header, TOKEN)
