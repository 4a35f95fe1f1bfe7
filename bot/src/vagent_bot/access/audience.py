"""The room audience: who else reads an answer posted into a group room (docs/knowledge.md).

Why: an answer in a room is read by everyone in it, so documents may be used only if EVERY
joined member may read them. The bot knows the room, the graph knows the documents: the bot
sends the other members' AcContexts (`ProcessMessageRequest.audience`), the graph intersects.

Fail closed throughout: a member whose AcContext cannot be fetched goes along without one
(the graph lets them read nothing); a room whose members cannot be listed, or that is too
large to check, gets only public documents. Nothing here raises, nothing is cached.

Pure decisions (`plan_audience`) are separate from the I/O (`fetch_members`, `RoomAudience`),
which gets its edges (listing the room, asking the provider) injected.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Literal

import structlog
from nio import AsyncClient, JoinedMembersResponse

from vagent_bot.observability.metrics import (
    AUDIENCE_FALLBACKS,
    AUDIENCE_MEMBERS,
    AUDIENCE_SECONDS,
    AUDIENCE_UNRESOLVED,
)
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience, AudienceMember

log = structlog.get_logger(__name__)

#: Longest wait for the homeserver's member list (nio itself would retry for minutes).
LIST_TIMEOUT_SECONDS: Final = 10.0
#: The provider client's own timeout fires first (and is logged and counted as the
#: provider's), the resolver's deadline just after it.
DEADLINE_GRACE_SECONDS: Final = 0.25
#: Unresolved members named in the summary log line (a huge room must not make a huge line).
LOGGED_USERS: Final = 20

TOO_MANY_MEMBERS: Final = "too_many_members"
LISTING_FAILED: Final = "listing_failed"

#: `user_id` -> their AcContext, or None when the provider gives no usable answer.
Fetch = Callable[[str], Awaitable[AcContext | None]]
#: `(user_id, domain)` -> their AcContext in that domain (`AccessProvider.context`).
FetchIn = Callable[[str, str], Awaitable[AcContext | None]]
#: `room_id` -> its currently joined members, or None when they cannot be listed.
ListJoined = Callable[[str], Awaitable[list[str] | None]]


def audience_applies(*, is_dm: bool, enabled: bool) -> bool:
    """DMs have no other reader; AUDIENCE_FILTER=off accepts that a room sees what the asker may."""
    return enabled and not is_dm


@dataclass(frozen=True)
class AudiencePlan:
    """What to send as the audience: `none` (no audience at all), `public_only` (too many
    members to check), or `resolve` the AcContexts of `user_ids` (the other joined members)."""

    mode: Literal["none", "public_only", "resolve"]
    member_count: int = 0
    user_ids: tuple[str, ...] = ()


def plan_audience(
    joined: list[str], *, bot: str, sender: str, is_dm: bool, enabled: bool, max_members: int
) -> AudiencePlan:
    """Decide from the room's joined members (the bot and the sender included), without I/O."""
    if not audience_applies(is_dm=is_dm, enabled=enabled):
        return AudiencePlan("none")
    members = list(dict.fromkeys(joined))  # the homeserver's answer, once per user
    if len(members) > max_members:
        return AudiencePlan("public_only", member_count=len(members))
    others = tuple(u for u in members if u not in (bot, sender))
    return AudiencePlan("resolve", member_count=len(members), user_ids=others)


async def fetch_members(
    user_ids: tuple[str, ...], fetch: Fetch, *, concurrency: int, within: float
) -> list[AudienceMember]:
    """Every member's AcContext, at most `concurrency` lookups at once, all of it within
    `within` seconds (the provider timeout): whoever is not answered by then (or fails) goes
    along without one. Never raises (except when cancelled), so a bad provider can neither
    stall nor break a message."""
    found: dict[str, AcContext] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(user_id: str) -> None:
        async with gate:
            try:
                async with asyncio.timeout(within):
                    ac = await fetch(user_id)
            except Exception as exc:  # a timeout or a broken fetch: this member stays unresolved
                log.debug("audience_member_failed", user_id=user_id, error_type=type(exc).__name__)
                return
        if ac is not None and ac.user_id == user_id:  # an answer about somebody else is no answer
            found[user_id] = ac

    try:
        async with asyncio.timeout(within), asyncio.TaskGroup() as group:
            for user_id in user_ids:
                group.create_task(one(user_id))
    except TimeoutError:
        pass  # the lookups still waiting were cancelled: those members stay unresolved
    return [AudienceMember(user_id=u, ac_context=found.get(u)) for u in user_ids]


async def execute_plan(
    plan: AudiencePlan, fetch: Fetch, *, concurrency: int, within: float
) -> Audience | None:
    """The audience a plan stands for; only `resolve` asks the provider (via `fetch`)."""
    if plan.mode == "none":
        return None
    if plan.mode == "public_only":
        return Audience(public_only=True, member_count=plan.member_count)
    members = await fetch_members(plan.user_ids, fetch, concurrency=concurrency, within=within)
    return Audience(members=members, member_count=plan.member_count)


async def joined_members(
    client: AsyncClient, room_id: str, within: float = LIST_TIMEOUT_SECONDS
) -> list[str] | None:
    """The room's currently joined members, asked of the homeserver: the sync lazy-loads
    members, so nio's local lists may be incomplete. None when there is no list."""
    try:
        async with asyncio.timeout(within):
            resp = await client.joined_members(room_id)
    except Exception as exc:  # timeout, connection lost, not logged in
        log.warning("audience_listing_failed", room_id=room_id, error_type=type(exc).__name__)
        return None
    if not isinstance(resp, JoinedMembersResponse):
        status = getattr(resp, "status_code", None)
        log.warning("audience_listing_failed", room_id=room_id, error=status or type(resp).__name__)
        return None
    return [str(m.user_id) for m in resp.members]


class RoomAudience:
    """Resolves a group room's audience afresh for every message (members come and go, grants
    change). `list_joined(room_id)` and `fetch(user_id, domain)` are the I/O edges; `timeout`
    bounds all the provider lookups of one message together."""

    def __init__(
        self, *, list_joined: ListJoined, fetch: FetchIn, max_members: int, concurrency: int, timeout: float
    ) -> None:
        self.list_joined, self.fetch = list_joined, fetch
        self.max_members, self.concurrency, self.timeout = max_members, concurrency, timeout

    async def resolve(self, room_id: str, *, bot: str, sender: str, domain: str) -> Audience:
        """The audience of `bot`'s answer to `sender` in the group room `room_id` (tenant `domain`)."""
        start = time.perf_counter()
        audience = Audience(public_only=True, member_count=0)  # fail closed: public documents only
        fallback: str | None = LISTING_FAILED
        joined = await self.list_joined(room_id)
        if joined is not None:
            plan = plan_audience(
                joined,
                bot=bot,
                sender=sender,
                is_dm=False,
                enabled=True,
                max_members=self.max_members,
            )
            fallback = TOO_MANY_MEMBERS if plan.mode == "public_only" else None
            resolved = await execute_plan(
                plan,
                lambda user_id: self.fetch(user_id, domain),
                concurrency=self.concurrency,
                within=self.timeout + DEADLINE_GRACE_SECONDS,
            )
            audience = resolved or audience  # a group room's plan is never "none"
        _record(room_id, audience, fallback, time.perf_counter() - start)
        return audience


def _record(room_id: str, audience: Audience, fallback: str | None, seconds: float) -> None:
    """One summary line and the metrics per message, never one line per member: members who
    merely sit in the room made no access decision of their own."""
    unresolved = [m.user_id for m in audience.members if m.ac_context is None]
    AUDIENCE_SECONDS.observe(seconds)
    if fallback is not None:
        AUDIENCE_FALLBACKS.labels(fallback).inc()
    if fallback != LISTING_FAILED:
        AUDIENCE_MEMBERS.observe(audience.member_count)
    AUDIENCE_UNRESOLVED.inc(len(unresolved))
    log.info(
        "audience_resolved",
        room_id=room_id,
        member_count=audience.member_count,
        members=len(audience.members),
        unresolved=len(unresolved),
        unresolved_users=unresolved[:LOGGED_USERS],
        public_only=audience.public_only,
        fallback=fallback,
        duration_ms=round(seconds * 1000, 1),
    )
