"""Which tenant (domain) a room belongs to: the access check needs it for every message.

A room names its tenant in a state event (`TENANT_STATE_EVENT_TYPE`, empty state key,
`{"domain": ...}`). The sync teaches it as the state goes by; a room not seen yet is asked
of the homeserver once. A room without one falls back to `DEFAULT_DOMAIN` (or None).
"""

from __future__ import annotations

from typing import Any

from nio import AsyncClient, RoomGetStateEventResponse


def _domain_in(content: dict[str, Any] | None) -> str | None:
    domain = content.get("domain") if content is not None else None
    return domain if isinstance(domain, str) and domain else None


class Tenants:
    def __init__(self, client: AsyncClient, state_type: str, default_domain: str | None) -> None:
        self.client, self.state_type, self.default_domain = client, state_type, default_domain
        self._rooms: dict[str, str | None] = {}

    def learn(self, room_id: str, events: list[Any]) -> None:
        """Remember the room's tenant from its state events (the last one wins)."""
        for e in events:
            src = getattr(e, "source", {}) or {}
            if src.get("type") == self.state_type and src.get("state_key", "") == "":
                self._rooms[room_id] = _domain_in(src.get("content") or {})

    async def domain(self, room_id: str) -> str | None:
        if room_id not in self._rooms:
            resp = await self.client.room_get_state_event(room_id, self.state_type, "")
            content = resp.content if isinstance(resp, RoomGetStateEventResponse) else None
            self._rooms[room_id] = _domain_in(content)
        return self._rooms[room_id] or self.default_domain
