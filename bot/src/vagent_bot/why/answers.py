"""🔍 / `!why`: the asker asks how an answer came about, the bot posts the account in its thread.

The way there, in order: the turn of the answered message (`trace_store`: the pointer the bot
wrote when it posted it; a `!why` without a reply means the sender's latest turn in this
conversation), its TurnTrace, then who asks. Only the asker gets an account: anyone else's 🔍
or `!why` is ignored without a word and audited as `access_denied` (like an answer to another
user's question). A turn still being answered has a pointer but no trace yet: the asker is
told to ask again once it is complete. The asker must still pass the agent access check (silent denial, fail
closed), in the room the turn happened in, within the flood limit. The account names only what
everyone in the room NOW may read (`why.account`): its members are listed afresh and their
AcContexts asked for, as for a message, because people join after a turn (a DM gains a member,
a newcomer in a group room). Fail closed: members that cannot be listed leave only what
derives from nobody's data named; a member without an AcContext reads nothing. When the details
are gone (expired, forgotten), the asker is told so, and only the asker: the answered message
must be the bot's reply to them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Final

import structlog

from vagent_bot.access.audience import DEADLINE_GRACE_SECONDS, execute_plan, joined_members, plan_audience
from vagent_bot.conversation.conversations import Conversations
from vagent_bot.conversation.routing import IncomingMessage, session_for
from vagent_bot.matrix import rooms
from vagent_bot.why.account import (
    IN_PROGRESS_NOTICE,
    MayRead,
    account,
    expired_notice,
    is_why_reaction,
    memory_rooms,
    unscoped_only,
)
from vagent_shared.access import AcContext
from vagent_shared.access_provider import AccessResult
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.readers import Readership
from vagent_shared.session import SessionId
from vagent_shared.traces import TurnTrace

log = structlog.get_logger(__name__)

#: The graph stores a turn's trace when its request ends, a moment after the answer shows: a
#: quick 🔍 may come first. So long is waited for it (in steps of STORE_POLL_SECONDS).
STORE_WAIT_SECONDS: Final = 3.0
STORE_POLL_SECONDS: Final = 0.2
TOO_FAST: Final = "⏳ You're sending messages too fast. Please wait a moment."


class WhyAnswers:
    """Answers 🔍 reactions and `!why` messages; `conversations` gives the access check, the
    flood limit, the trace store and the way into a thread."""

    def __init__(self, conversations: Conversations, *, audit: AuditTrail | None = None) -> None:
        self.conv, self.audit = conversations, audit

    @staticmethod
    def asks_why(src: dict[str, Any]) -> bool:
        """A reaction event that asks why (🔍 on some event): no I/O, for the router."""
        rel = (src.get("content") or {}).get("m.relates_to") or {}
        return (
            rel.get("rel_type") == "m.annotation"
            and isinstance(rel.get("event_id"), str)
            and is_why_reaction(str(rel.get("key", "")))
        )

    async def on_reaction(self, room_id: str, src: dict[str, Any]) -> None:
        if not self.asks_why(src):
            return
        answered = str(src["content"]["m.relates_to"]["event_id"])
        await self._explain(room_id, str(src.get("sender")), answered=answered, msg=None, access=None)

    async def on_command(
        self, msg: IncomingMessage, access: Awaitable[AccessResult | None] | None = None
    ) -> None:
        """`!why` as a reply to an answer, or alone (the sender's latest turn here). `access`:
        the check already under way for this message, if any."""
        await self._explain(msg.room_id, msg.sender, answered=msg.in_reply_to, msg=msg, access=access)

    async def _explain(
        self,
        room_id: str,
        sender: str,
        *,
        answered: str | None,
        msg: IncomingMessage | None,
        access: Awaitable[AccessResult | None] | None,
    ) -> None:
        store = self.conv.traces
        session = session_for(msg) if msg is not None and answered is None else None
        if answered is not None:
            turn_id = await store.turn_for_event(answered)
        else:
            turn_id = await store.last_turn(session.format()) if session is not None else None
        trace = await self._load(turn_id) if turn_id else None
        thread_root: str | None = None
        if trace is not None:
            if not self._may_see(trace, sender, room_id, answered):
                return
            thread_root = SessionId.parse(trace.session_id).thread_id or answered
        elif answered is not None:
            told, thread_root = await self._answered(room_id, answered, sender)
            if not told:
                return  # not an answer of the bot to this sender (or no longer known to be)
        granted = await (access or self.conv.check_access(room_id, sender))
        if granted is None or granted.ac is None:
            return  # layer 1: a denied user learns nothing
        if not await self.conv.flood.allow(sender, room_id=room_id):
            if msg is not None:
                await self.conv.answer_for(msg).notice(TOO_FAST)
            return
        if trace is None:
            text = IN_PROGRESS_NOTICE if turn_id else expired_notice(store.ttl_seconds)
        else:
            text = account(
                trace, await self._readers_now(room_id, granted.ac), dm_rooms=await self._dm_rooms(trace)
            )
        if answered is None and msg is not None:
            target = self.conv.answer_for(msg)  # the latest turn: right where the user asked
        else:
            target = self.conv.new_answer(room_id, thread_root or answered, None)
        await target.notice(text)
        log.info("why_answered", turn_id=turn_id, found=trace is not None, room_id=room_id)

    def _may_see(self, trace: TurnTrace, sender: str, room_id: str, answered: str | None) -> bool:
        """Only the asker, only in the turn's own room; anyone else is audited as denied."""
        if trace.user_id != sender:
            log.info("why_ignored", turn_id=trace.turn_id, user_id=sender, reason="not the asking user")
            if self.audit is not None:
                self.audit.record(
                    "access_denied",
                    user_id=sender,
                    session_id=trace.session_id,
                    resource=f"trace:{answered or trace.turn_id}",
                    decision="denied",
                    reason="asked why about another user's answer",
                )
            return False
        if SessionId.parse(trace.session_id).room_id != room_id:
            log.warning("why_ignored", turn_id=trace.turn_id, user_id=sender, reason="another room")
            return False
        return True

    async def _load(self, turn_id: str) -> TurnTrace | None:
        """The turn's trace, waiting a moment for the graph to store it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STORE_WAIT_SECONDS
        while True:
            trace = await self.conv.traces.load(turn_id)
            if trace is not None or loop.time() >= deadline:
                return trace
            await asyncio.sleep(STORE_POLL_SECONDS)

    async def _answered(self, room_id: str, event_id: str, sender: str) -> tuple[bool, str | None]:
        """Whether `event_id` is the bot's answer to `sender` (in a DM: any message of the bot),
        and the thread it is in: who may be told its details are gone."""
        event = await rooms.fetch_event(self.conv.client, room_id, event_id)
        if event is None or event.get("sender") != self.conv.me:
            return False, None
        rel = (event.get("content") or {}).get("m.relates_to") or {}
        thread_root = rel.get("event_id") if rel.get("rel_type") == "m.thread" else None
        if await rooms.is_dm(self.conv.client, room_id):
            return True, thread_root
        replied = (rel.get("m.in_reply_to") or {}).get("event_id")
        if not isinstance(replied, str):
            return False, None
        return await rooms.sender_of(self.conv.client, room_id, replied) == sender, thread_root

    async def _dm_rooms(self, trace: TurnTrace) -> set[str]:
        """Which other rooms the turn's memories come from are direct chats (a room the bot
        is no longer in counts as "another room")."""
        return {r for r in memory_rooms(trace) if await rooms.is_dm(self.conv.client, r)}

    async def _readers_now(self, room_id: str, ac: AcContext) -> MayRead:
        """What everyone in the room now may read: its members listed afresh (the sync's may
        lag a join) and their AcContexts in the asker's domain, as for a message's audience."""
        joined = await joined_members(self.conv.client, room_id)
        if joined is None:
            return unscoped_only
        settings = self.conv.settings
        plan = plan_audience(
            joined,
            bot=self.conv.me,
            sender=ac.user_id,
            is_dm=False,  # a DM that gained a member is no DM: the members decide, not the room's kind
            enabled=settings.AUDIENCE_FILTER == "on",
            max_members=settings.AUDIENCE_MAX_MEMBERS,
        )
        audience = await execute_plan(
            plan,
            lambda user_id: self.conv.access.context(user_id, ac.active_acl_domain),
            concurrency=settings.AUDIENCE_CONCURRENCY,
            within=settings.ACP_TIMEOUT_SECONDS + DEADLINE_GRACE_SECONDS,
        )
        return Readership(ac, audience).may_read
