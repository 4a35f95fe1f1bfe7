"""A room's tenant: learned from its state event as the sync goes by, asked for once otherwise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from nio import AsyncClient, RoomGetStateEventError, RoomGetStateEventResponse

from vagent_bot.matrix.tenants import Tenants

TYPE = "io.vagent.tenant"


def state(content: dict[str, Any], state_key: str = "", etype: str = TYPE) -> SimpleNamespace:
    return SimpleNamespace(source={"type": etype, "state_key": state_key, "content": content})


class FakeClient:
    def __init__(self, resp: Any) -> None:
        self.resp, self.asked = resp, 0

    async def room_get_state_event(self, room_id: str, event_type: str, state_key: str) -> Any:
        assert (event_type, state_key) == (TYPE, "")
        self.asked += 1
        return self.resp


def tenants(resp: Any = None, default: str | None = None) -> tuple[Tenants, FakeClient]:
    client = FakeClient(resp)
    return Tenants(cast(AsyncClient, client), TYPE, default), client


async def test_learned_from_state_without_asking() -> None:
    t, client = tenants()
    t.learn(
        "!r",
        [state({"domain": "old.org"}), state({"domain": "x"}, state_key="k"), state({"domain": "a.org"})],
    )
    t.learn("!r", [SimpleNamespace(), state({"domain": "b.org"}, etype="m.room.topic")])  # nothing to learn
    assert await t.domain("!r") == "a.org"
    assert client.asked == 0


@pytest.mark.parametrize("content", [{}, {"domain": ""}, {"domain": 7}])
async def test_an_empty_or_odd_domain_falls_back_to_the_default(content: dict[str, Any]) -> None:
    t, _ = tenants(default="default.org")
    t.learn("!r", [state(content)])
    assert await t.domain("!r") == "default.org"


async def test_an_unknown_room_is_asked_for_once() -> None:
    t, client = tenants(RoomGetStateEventResponse({"domain": "c.org"}, TYPE, "", "!r"))
    assert await t.domain("!r") == "c.org"
    assert await t.domain("!r") == "c.org"
    assert client.asked == 1


async def test_a_room_without_tenant_has_none_or_the_default() -> None:
    missing = RoomGetStateEventError("not found", "M_NOT_FOUND")
    t, client = tenants(missing)
    assert await t.domain("!r") is None
    t, client = tenants(missing, default="default.org")
    assert await t.domain("!r") == "default.org"
    assert await t.domain("!r") == "default.org"
    assert client.asked == 1
