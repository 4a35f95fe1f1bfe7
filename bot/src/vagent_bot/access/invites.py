"""Who may invite the bot into a room? A pure decision over the INVITE_ALLOWLIST."""

from __future__ import annotations


def invite_allowed(inviter: str, allowlist: list[str], own_server: str) -> bool:
    """Entries are user ids (`@u:server`), server names (`example.org`) or `*`.

    An empty list admits users of the bot's own server only.
    """
    if not inviter.startswith("@") or ":" not in inviter:
        return False
    server = inviter.split(":", 1)[1]
    entries = [e.strip() for e in allowlist if e.strip()] or [own_server]
    for entry in entries:
        if entry == "*" or entry == inviter:
            return True
        if not entry.startswith("@") and entry.lstrip(":").lower() == server.lower():
            return True
    return False
