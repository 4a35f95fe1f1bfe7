"""Auto-join is limited to an allow-list of inviting users/servers."""

from __future__ import annotations

import pytest

from vagent_bot.access.invites import invite_allowed


@pytest.mark.parametrize(
    "inviter,allow,expected",
    [
        ("@alice:localhost", [], True),  # default: own server only
        ("@eve:evil.org", [], False),
        ("@eve:evil.org", ["*"], True),
        ("@bob:partner.org", ["partner.org"], True),
        ("@bob:PARTNER.org", ["partner.org"], True),
        ("@bob:partner.org.evil", ["partner.org"], False),
        ("@carol:other.org", ["@carol:other.org"], True),
        ("@dave:other.org", ["@carol:other.org"], False),
        ("@alice:localhost", ["partner.org"], False),  # an explicit list replaces the default
        ("@x:localhost:8448", ["localhost:8448"], True),
        ("not-a-user", ["*"], False),
    ],
)
def test_invite_allowlist(inviter: str, allow: list[str], expected: bool) -> None:
    assert invite_allowed(inviter, allow, "localhost") is expected
