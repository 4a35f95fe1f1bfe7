"""How a credential is applied and how long it may be cached: pure parts of services/credentials.py."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from vagent_graph.services.credentials import (
    CredentialDenied,
    CredentialMissing,
    CredentialUnavailable,
    cache_seconds,
    credential_auth,
)
from vagent_graph.workflow.tool_calls import credential_failure_text
from vagent_shared.credentials import CredentialResponse

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def cred(kind: str, secret: str = "s3cr3t-value", expires: datetime | None = None) -> CredentialResponse:  # noqa: S107
    return CredentialResponse.model_validate(
        {"credential_type": kind, "credential": secret, "expires_at": expires}
    )


def applied(auth: httpx.Auth) -> httpx.Request:
    request = httpx.Request("GET", "http://tickets.invalid/")
    return next(auth.sync_auth_flow(request))


def test_each_standard_type_has_its_http_form() -> None:
    assert applied(credential_auth(cred("api_key"))).headers["X-API-Key"] == "s3cr3t-value"
    assert (
        applied(credential_auth(cred("api_key"), api_key_header="X-Token")).headers["X-Token"]
        == "s3cr3t-value"
    )
    assert applied(credential_auth(cred("bearer_token"))).headers["Authorization"] == "Bearer s3cr3t-value"
    assert applied(credential_auth(cred("jwt", "a.b.c"))).headers["Authorization"] == "Bearer a.b.c"
    basic = applied(credential_auth(cred("basic_auth", "alice:pa:ss"))).headers["Authorization"]
    assert base64.b64decode(basic.removeprefix("Basic ")) == b"alice:pa:ss"


def test_custom_and_malformed_basic_credentials_are_refused_without_quoting_them() -> None:
    with pytest.raises(ValueError) as custom:
        credential_auth(cred("custom"))
    with pytest.raises(ValueError) as basic:
        credential_auth(cred("basic_auth", "no-colon-here"))
    assert "s3cr3t" not in str(custom.value) and "no-colon-here" not in str(basic.value)


def test_the_secret_never_shows_in_a_repr() -> None:
    c = cred("api_key")
    assert "s3cr3t" not in repr(c) and "s3cr3t" not in str(c) and "s3cr3t" not in c.model_dump_json()
    assert "s3cr3t" not in repr(credential_auth(c))
    assert c.to_wire()["credential"] == "s3cr3t-value"  # only the registry writes it out


def test_naive_timestamps_are_utc_and_expiry_respects_the_margin() -> None:
    c = cred("api_key", expires=datetime(2026, 11, 24, 12, 5))
    assert c.expires_at is not None and c.expires_at.tzinfo is not None
    assert not c.expired(NOW) and c.expired(NOW, margin_seconds=300) and c.expired(NOW + timedelta(minutes=6))
    assert not cred("api_key").expired(NOW + timedelta(days=3650))


@pytest.mark.parametrize(
    ("expires_in", "expected"),
    [
        (None, 900),
        (timedelta(hours=2), 900),
        (timedelta(minutes=10), 540),
        (timedelta(seconds=30), 0),
        (timedelta(seconds=-5), 0),
    ],
)
def test_cache_lifetime(expires_in: timedelta | None, expected: int) -> None:
    c = cred("api_key", expires=NOW + expires_in if expires_in is not None else None)
    assert cache_seconds(c, NOW, margin=60, longest=900) == expected


def test_failure_texts_tell_the_user_what_to_do_and_name_no_secret() -> None:
    missing, denied, down = (
        credential_failure_text("create_ticket", exc("x"), "Ask Kim in IT.")
        for exc in (CredentialMissing, CredentialDenied, CredentialUnavailable)
    )
    assert "no credential is configured" in missing and "Ask Kim in IT." in missing
    assert "Access denied" in denied and "NOT run" in denied
    assert "unavailable" in down
