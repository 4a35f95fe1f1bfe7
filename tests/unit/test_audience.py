"""The room audience without servers: who counts as another reader (`plan_audience`), and the
resolver run with in-process fetch functions (fail closed, bounded, no caching, one log line)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from nio import AsyncClient, JoinedMembersError, JoinedMembersResponse, RoomMember

from vagent_bot.access.audience import (
    AudiencePlan,
    RoomAudience,
    audience_applies,
    execute_plan,
    fetch_members,
    joined_members,
    plan_audience,
)
from vagent_bot.observability.metrics import AUDIENCE_FALLBACKS, AUDIENCE_UNRESOLVED
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience, AudienceMember
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest

BOT, ALICE, BOB, CAROL, DAVE = (f"@{n}:example.org" for n in ("vagent", "alice", "bob", "carol", "dave"))
DOMAIN = "example.org"


def ac(user: str, *instances: str) -> AcContext:
    return AcContext.model_validate(
        {
            "userId": user,
            "activeAclDomain": DOMAIN,
            "activeRoles": ["r"],
            "superuserGroups": [],
            "roles": {DOMAIN: [{"name": "r", "instances": list(instances) or ["document_tag:public"]}]},
        }
    )


def plan(
    joined: list[str], *, is_dm: bool = False, enabled: bool = True, max_members: int = 50
) -> AudiencePlan:
    return plan_audience(joined, bot=BOT, sender=ALICE, is_dm=is_dm, enabled=enabled, max_members=max_members)


class Provider:
    """An in-process stand-in for `AccessProvider.context`: answers from `contexts`, counts
    calls and the most lookups in flight at once."""

    def __init__(self, contexts: dict[str, AcContext | None], delay: float = 0.0) -> None:
        self.contexts, self.delay = contexts, delay
        self.calls: list[str] = []
        self.in_flight = self.max_in_flight = 0

    async def fetch(self, user_id: str) -> AcContext | None:
        self.calls.append(user_id)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return self.contexts.get(user_id)
        finally:
            self.in_flight -= 1


# --------------------------------------------------------------------------- the plan


def test_a_dm_has_no_audience() -> None:
    assert plan([BOT, ALICE], is_dm=True) == AudiencePlan("none")
    assert not audience_applies(is_dm=True, enabled=True)


def test_filter_off_sends_no_audience_even_in_a_group_room() -> None:
    assert plan([BOT, ALICE, BOB, CAROL], enabled=False) == AudiencePlan("none")
    assert not audience_applies(is_dm=False, enabled=False)


def test_group_room_resolves_everyone_but_the_bot_and_the_sender() -> None:
    assert audience_applies(is_dm=False, enabled=True)
    assert plan([ALICE, BOB, BOT, CAROL]) == AudiencePlan("resolve", member_count=4, user_ids=(BOB, CAROL))


def test_a_member_listed_twice_counts_once() -> None:
    assert plan([BOB, ALICE, BOB, BOT]) == AudiencePlan("resolve", member_count=3, user_ids=(BOB,))


def test_a_group_room_where_the_others_left_has_an_empty_audience() -> None:
    assert plan([ALICE, BOT]) == AudiencePlan("resolve", member_count=2, user_ids=())


def test_too_many_members_means_public_documents_only() -> None:
    crowd = [BOT, ALICE] + [f"@u{i}:example.org" for i in range(49)]
    assert plan(crowd) == AudiencePlan("public_only", member_count=51)
    assert plan(crowd[:50]).mode == "resolve"  # exactly the maximum is still checked member by member


# --------------------------------------------------------------------------- executing a plan


async def test_every_other_member_gets_their_own_context() -> None:
    provider = Provider({BOB: ac(BOB), CAROL: ac(CAROL, "document_category:hr")})
    audience = await execute_plan(plan([ALICE, BOB, CAROL, BOT]), provider.fetch, concurrency=8, within=1)
    assert audience == Audience(
        members=[
            AudienceMember(user_id=BOB, ac_context=ac(BOB)),
            AudienceMember(user_id=CAROL, ac_context=ac(CAROL, "document_category:hr")),
        ],
        member_count=4,
    )
    assert sorted(provider.calls) == [BOB, CAROL]


async def test_no_plan_and_public_only_ask_the_provider_nothing() -> None:
    provider = Provider({})
    assert await execute_plan(AudiencePlan("none"), provider.fetch, concurrency=8, within=1) is None
    crowded = await execute_plan(AudiencePlan("public_only", 80), provider.fetch, concurrency=8, within=1)
    assert crowded == Audience(public_only=True, members=[], member_count=80)
    assert provider.calls == []


async def test_each_resolution_asks_afresh() -> None:
    """No caching beyond one message: a revoked grant counts on the next message."""
    provider = Provider({BOB: ac(BOB, "document_category:hr")})
    first = await fetch_members((BOB,), provider.fetch, concurrency=8, within=1)
    provider.contexts[BOB] = None  # bob's access is revoked
    second = await fetch_members((BOB,), provider.fetch, concurrency=8, within=1)
    assert first[0].ac_context is not None and second[0].ac_context is None
    assert provider.calls == [BOB, BOB]


async def test_failures_leave_members_unresolved_and_never_raise() -> None:
    async def fetch(user_id: str) -> AcContext | None:
        if user_id == BOB:
            raise RuntimeError("provider exploded")
        if user_id == CAROL:
            return ac("@mallory:example.org")  # an answer about somebody else
        if user_id == DAVE:
            return None  # 403/404/timeout inside the provider client
        return ac(user_id)

    members = await fetch_members((BOB, CAROL, DAVE, "@erin:example.org"), fetch, concurrency=2, within=1)
    assert [(m.user_id, m.ac_context is not None) for m in members] == [
        (BOB, False),
        (CAROL, False),
        (DAVE, False),
        ("@erin:example.org", True),
    ]


async def test_lookups_in_flight_are_bounded() -> None:
    provider = Provider({}, delay=0.02)
    users = tuple(f"@u{i}:example.org" for i in range(20))
    members = await fetch_members(users, provider.fetch, concurrency=3, within=5)
    assert provider.max_in_flight == 3 and len(provider.calls) == 20
    assert [m.user_id for m in members] == list(users)


async def test_many_slow_members_take_one_timeout_not_one_per_member() -> None:
    fast = ac(BOB)

    async def fetch(user_id: str) -> AcContext | None:
        if user_id == BOB:
            return fast
        await asyncio.sleep(30)
        return ac(user_id)

    users = (BOB, *(f"@slow{i}:example.org" for i in range(40)))
    start = time.monotonic()
    members = await fetch_members(users, fetch, concurrency=4, within=0.3)
    assert time.monotonic() - start < 5  # one per member would be 10 rounds x 30 s
    assert members[0].ac_context == fast
    assert all(m.ac_context is None for m in members[1:])


async def test_a_cancelled_resolution_cancels_its_lookups() -> None:
    provider = Provider({}, delay=30)
    task = asyncio.create_task(fetch_members((BOB, CAROL), provider.fetch, concurrency=8, within=60))
    await asyncio.sleep(0.05)
    assert provider.in_flight == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.in_flight == 0


# --------------------------------------------------------------------------- a room, end to end


def room_audience(joined: list[str] | None, provider: Provider, max_members: int = 50) -> RoomAudience:
    async def list_joined(room_id: str) -> list[str] | None:
        assert room_id == "!room:example.org"
        return joined

    async def fetch(user_id: str, domain: str) -> AcContext | None:
        assert domain == DOMAIN
        return await provider.fetch(user_id)

    return RoomAudience(
        list_joined=list_joined, fetch=fetch, max_members=max_members, concurrency=8, timeout=1
    )


async def resolve(room: RoomAudience) -> Audience:
    return await room.resolve("!room:example.org", bot=BOT, sender=ALICE, domain=DOMAIN)


def _count(metric: Any, *labels: str) -> float:
    return float((metric.labels(*labels) if labels else metric)._value.get())


async def test_a_room_that_cannot_be_listed_gets_public_documents_only() -> None:
    provider = Provider({BOB: ac(BOB)})
    before = _count(AUDIENCE_FALLBACKS, "listing_failed")
    assert await resolve(room_audience(None, provider)) == Audience(public_only=True, member_count=0)
    assert _count(AUDIENCE_FALLBACKS, "listing_failed") == before + 1
    assert provider.calls == []


async def test_a_crowded_room_asks_nobody() -> None:
    provider = Provider({})
    crowd = [BOT, ALICE, *(f"@u{i}:example.org" for i in range(10))]
    before = _count(AUDIENCE_FALLBACKS, "too_many_members")
    audience = await resolve(room_audience(crowd, provider, max_members=5))
    assert audience == Audience(public_only=True, members=[], member_count=12)
    assert _count(AUDIENCE_FALLBACKS, "too_many_members") == before + 1
    assert provider.calls == []


async def test_one_summary_line_per_message_and_unresolved_members_counted(
    capsys: pytest.CaptureFixture[str], json_logs: Callable[[], None]
) -> None:
    json_logs()
    provider = Provider({BOB: ac(BOB)})  # carol and dave: no usable answer
    before = _count(AUDIENCE_UNRESOLVED)
    audience = await resolve(room_audience([ALICE, BOB, CAROL, DAVE, BOT], provider))
    assert [m.user_id for m in audience.members if m.ac_context is None] == [CAROL, DAVE]
    assert _count(AUDIENCE_UNRESOLVED) == before + 2
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    summary = [ln for ln in lines if ln["event"] == "audience_resolved"]
    assert len(summary) == 1
    assert {
        "member_count": 5,
        "members": 3,
        "unresolved": 2,
        "unresolved_users": [CAROL, DAVE],
        "public_only": False,
        "fallback": None,
    }.items() <= summary[0].items()
    assert summary[0]["level"] == "info" and summary[0]["duration_ms"] >= 0
    assert not any(ln["event"] == "access_denied" for ln in lines)  # sitting in a room is no request


# --------------------------------------------------------------------------- listing the room


class Homeserver:
    """Stands in for nio's `joined_members` (the real one is exercised end to end)."""

    def __init__(self, answer: Any = None, delay: float = 0.0, error: Exception | None = None) -> None:
        self.answer, self.delay, self.error = answer, delay, error

    async def joined_members(self, room_id: str) -> Any:
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return self.answer


async def listed(server: Homeserver, within: float = 1.0) -> list[str] | None:
    return await joined_members(cast(AsyncClient, server), "!room:example.org", within=within)


async def test_the_homeservers_member_list_is_used() -> None:
    members = [RoomMember(u, None, None) for u in (ALICE, BOB, BOT)]
    assert await listed(Homeserver(JoinedMembersResponse(members, "!room:example.org"))) == [ALICE, BOB, BOT]


@pytest.mark.parametrize(
    "server",
    [
        Homeserver(JoinedMembersError("forbidden", "M_FORBIDDEN")),
        Homeserver(error=ConnectionResetError("gone")),
        Homeserver(SimpleNamespace(members=[]), delay=5),
    ],
    ids=["error_answer", "connection_lost", "hangs"],
)
async def test_no_member_list_is_none_in_bounded_time(server: Homeserver) -> None:
    start = time.monotonic()
    assert await listed(server, within=0.2) is None
    assert time.monotonic() - start < 4  # the hanging server would take 5 s


def test_the_audience_reaches_the_graph_intact() -> None:
    """What the bot sends is what the graph parses: each member's context, and who has none."""
    audience = Audience(
        members=[AudienceMember(user_id=BOB, ac_context=ac(BOB)), AudienceMember(user_id=CAROL)],
        member_count=4,
    )
    sid = f"!room:example.org:main:{ALICE}"
    req = ProcessMessageRequest(
        session_id=sid,
        room_id="!room:example.org",
        user_id=ALICE,
        message="hi",
        ac_context=ac(ALICE),
        audience=audience,
    )
    wire = json.loads(req.model_dump_json())
    assert [m["ac_context"] is not None for m in wire["audience"]["members"]] == [True, False]
    assert ProcessMessageRequest.model_validate(wire).audience == audience
    feedback = FeedbackRequest(session_id=sid, response="yes", audience=audience)
    assert FeedbackRequest.model_validate_json(feedback.model_dump_json()).audience == audience
