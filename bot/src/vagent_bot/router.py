"""Where one event goes once `sync` has claimed it, and in which order a message is looked at.

A reaction may answer a question (`questions`) or ask why (🔍: `why_answers`); `!stop` cancels
the session's running answer at once; any other message waits in its session's queue
(`sessions`), then: `!why`? -> pending question? (`questions`) -> addressed to the bot?
(`routing`: pure rules) -> tenant domain -> agent access (silent denial, fail closed) ->
a schedule command (answered here: `schedule_commands`) -> command / flood / length -> the
message's files (downloaded only now, after access, and only the sender's own: `file_owner`)
-> stream the graph's answer (`conversation`), with the room's audience (`audience`: who else
reads it) resolved once access is granted. Invites are answered here too (`invites` decides).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nio import AsyncClient, InviteMemberEvent
from redis.asyncio import Redis

from vagent_bot.access.audience import audience_applies
from vagent_bot.access.invites import invite_allowed
from vagent_bot.conversation.commands import parse_command
from vagent_bot.conversation.conversations import Conversations
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_bot.conversation.questions import Questions, loggable
from vagent_bot.conversation.routing import (
    Decision,
    IncomingMessage,
    parse_message,
    session_for,
    should_answer,
)
from vagent_bot.conversation.sessions import SessionWorkers
from vagent_bot.matrix import client as matrix
from vagent_bot.matrix import rooms
from vagent_bot.matrix.sync import Spawn
from vagent_bot.observability import metrics
from vagent_bot.observability.spans import event_span, note_message
from vagent_bot.schedules.commands import ScheduleCommands, parse_schedule_command_words
from vagent_bot.why.account import is_why_command
from vagent_bot.why.answers import WhyAnswers
from vagent_shared import redis_keys
from vagent_shared.access_provider import AccessResult
from vagent_shared.knowledge import Audience
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.session import SessionId
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

#: The access check already under way for a message (None: it is not for the bot).
EarlyAccess = asyncio.Future[AccessResult | None] | None
#: Tells `sync` the bot is done with an event (`SyncHandler.finished`): its lease ends.
Finished = Callable[[str], Coroutine[Any, Any, None]]


class EventRouter:
    """`dispatch` and `on_invite` are `sync`'s callbacks. `stopping` is set on shutdown: an
    event cancelled by it stays unfinished, for the next bot to take over."""

    def __init__(
        self,
        settings: BotSettings,
        client: AsyncClient,
        redis: Redis,
        *,
        hitl: HitlStore,
        workers: SessionWorkers,
        questions: Questions,
        conversations: Conversations,
        finished: Finished,
        spawn: Spawn,
        stopping: asyncio.Event,
    ) -> None:
        self.settings, self.client, self.redis = settings, client, redis
        self.hitl, self.workers = hitl, workers
        self.questions, self.conversations = questions, conversations
        #: 🔍 / `!why`: the asker's account of an answer (audited like answers to questions).
        self.why = WhyAnswers(conversations, audit=questions.audit)
        #: `!schedule`, `!schedules`, `!unschedule`, `!timezone`: answered by the bot itself.
        self.schedules = ScheduleCommands(settings, ScheduleStore(redis), audit=questions.audit)
        self._finished, self._spawn, self._stopping = finished, spawn, stopping
        self.display_name: str | None = None

    @property
    def me(self) -> str:
        return str(self.client.user_id)

    async def learn_display_name(self) -> None:
        """The name people may address the bot by in a group room (after login)."""
        resp = await self.client.get_displayname(self.me)
        self.display_name = getattr(resp, "displayname", None)

    # ---- per event -----------------------------------------------------------------------
    def dispatch(self, room_id: str, event: Any) -> None:
        """An event for the bot (`sync`: claimed, decrypted, not its own): route it, no I/O.
        Whatever handles it tells `sync` when it is finished (`_handling`)."""
        src: dict[str, Any] = getattr(event, "source", {}) or {}
        etype = src.get("type")
        event_id = str(src.get("event_id", ""))
        if etype == "m.reaction":
            handler = self.why if WhyAnswers.asks_why(src) else self.questions
            self._spawn(self._handling(event_id, handler.on_reaction(room_id, src), room_id, "reaction"))
            return
        msg = parse_message(src, room_id)
        if msg is None:
            self._spawn(self._finished(event_id))
            return
        sid = session_for(msg)
        command = parse_command(self._quick_text(msg))
        if command is not None and command.name == "stop":
            self._spawn(self._handling(event_id, self._on_stop(msg, sid), room_id))
            return
        self.workers.submit(
            sid.format(), lambda: self._handling(event_id, self._handle_message(msg), room_id)
        )

    async def _handling(
        self, event_id: str, work: Coroutine[Any, Any, Any], room_id: str, kind: str = "message"
    ) -> None:
        """Handle one event: its messages under transaction ids of its own (sent once even if
        it is handled again), then finished. Cancelled by a shutdown it stays unfinished, and
        the next bot takes it over; cancelled by `!stop` (or failed) it is finished. Each event
        is the root of a trace of its own (observability/spans.py)."""
        try:
            with event_span(kind, room_id, event_id), matrix.handling(event_id):
                await work
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                await self._finished(event_id)
            raise
        except Exception:
            await self._finished(event_id)
            raise
        await self._finished(event_id)

    def _decide(
        self, msg: IncomingMessage, *, is_dm: bool, replied_to: str | None, in_thread: bool
    ) -> Decision:
        return should_answer(
            msg,
            bot_user_id=self.me,
            bot_display_name=self.display_name,
            is_dm=is_dm,
            prefix=self.settings.COMMAND_PREFIX,
            replied_to_sender=replied_to,
            bot_in_thread=in_thread,
        )

    def _quick_text(self, msg: IncomingMessage) -> str:
        """The message without prefix/mention, before any I/O: enough to spot `!stop`."""
        return self._decide(msg, is_dm=True, replied_to=None, in_thread=False).text

    # ---- per message -------------------------------------------------------------------
    async def _handle_message(self, msg: IncomingMessage) -> None:
        sid = session_for(msg)
        structlog.contextvars.bind_contextvars(session_id=sid.format(), event_id=msg.event_id)
        is_dm = await rooms.is_dm(self.client, msg.room_id)
        replied_to, replied_event = None, None
        if msg.in_reply_to and not is_dm:
            replied_event = await rooms.fetch_event(self.client, msg.room_id, msg.in_reply_to)
            if replied_event is not None:
                replied_to = str(replied_event.get("sender"))
            else:  # not decryptable: who sent it still tells whether this is a reply to the bot
                replied_to = await rooms.sender_of(self.client, msg.room_id, msg.in_reply_to)
        in_thread = bool(
            msg.thread_root and await self.redis.exists(redis_keys.bot_thread(msg.room_id, msg.thread_root))
        )
        decision = self._decide(msg, is_dm=is_dm, replied_to=replied_to, in_thread=in_thread)
        log.debug("message", session_id=sid.format(), decision=decision.reason, body=loggable(msg.body))
        note_message(msg.sender, msg.body, decision.reason)

        # The provider is the slowest step before the graph: ask it (about the sender, and
        # about the room's other members) while Redis answers. A DM starts no audience at all.
        early = (
            asyncio.ensure_future(self.conversations.check_access(msg.room_id, msg.sender))
            if decision.answer
            else None
        )
        audience = self._start_audience(msg.room_id, msg.sender, is_dm, early) if early else None
        try:
            # A thread started on a file ("reply in thread" in Element) is about that file: the
            # first question there takes it (later ones find it in the thread's history).
            fresh_thread = msg.thread_root is not None and not in_thread and msg.in_reply_to is None
            thread_file = msg.thread_root if fresh_thread else None
            await self._route(msg, sid, decision, is_dm, early, audience, replied_event, thread_file)
        finally:
            for pending_work in (early, audience):
                if pending_work is not None and not pending_work.done():
                    pending_work.cancel()

    async def _route(
        self,
        msg: IncomingMessage,
        sid: SessionId,
        decision: Decision,
        is_dm: bool,
        early: EarlyAccess,
        audience: asyncio.Future[Audience | None] | None,
        replied_event: dict[str, Any] | None = None,
        thread_file: str | None = None,
    ) -> None:
        """A pending question's answer, or a new request; `early`/`audience` already under way.
        A file alone is no answer; a voice message's transcript is one. `thread_file`: the root
        of a thread the bot is new to, whose file (if it is one) the question is about. `!why`
        comes first: it asks about an answer, it answers no question."""
        if decision.answer and msg.media is None and is_why_command(decision.text):
            if audience is not None:
                audience.cancel()  # no graph call follows: nobody else's access is needed
            await self.why.on_command(msg, early)
            return
        pending = await self.hitl.peek(sid.format())
        if pending is not None:
            text = decision.text if msg.media is not None else decision.text or msg.body.strip()
            if msg.media is not None and msg.media.kind == "audio":
                text = await self._heard(msg, early) or ""
                if not text:
                    return
            elif msg.media is not None and not text:
                await self._not_an_answer(msg, early)
                return
            await self.questions.answer_pending(
                msg,
                pending,
                text,
                addressed=decision.answer
                or is_dm
                or (msg.thread_root is not None and msg.thread_root == pending.thread_root),
                early_access=early,
                early_audience=audience,
            )
            return
        if early is None:
            metrics.EVENTS.labels(decision.reason).inc()
            return
        access = await early
        if access is None:
            return
        metrics.EVENTS.labels("answered").inc()
        if msg.media is None and await self._schedule_command(msg, decision.text, is_dm, access, audience):
            return
        await self.conversations.answer_request(
            msg, sid, decision.text, access, audience, replied_event=replied_event, thread_file=thread_file
        )

    async def _schedule_command(
        self,
        msg: IncomingMessage,
        text: str,
        is_dm: bool,
        access: AccessResult,
        audience: asyncio.Future[Audience | None] | None,
    ) -> bool:
        """A schedule command of a user allowed to speak: answered here, as a reply to it (in
        its thread), never sent to the model. False: no schedule command, go on."""
        command = parse_command(text)
        schedule = parse_schedule_command_words(command) if command is not None else None
        if schedule is None:
            return False
        if audience is not None:
            audience.cancel()  # no graph call follows: nobody else's access is needed
        reply = await self.schedules.answer(
            schedule,
            user=msg.sender,
            room_id=msg.room_id,
            thread_root=msg.thread_root,
            is_dm=is_dm,
            domain=access.ac.active_acl_domain if access.ac is not None else None,
        )
        await self.conversations.answer_for(msg).notice(reply)
        return True

    async def _heard(self, msg: IncomingMessage, early: EarlyAccess) -> str | None:
        """A voice message addressed to the bot while its question waits: its transcript is the
        answer (heard only once the sender passed the access check)."""
        if early is None or await early is None:
            return None
        return await self.conversations.hear(msg)

    async def _not_an_answer(self, msg: IncomingMessage, early: EarlyAccess) -> None:
        """A file alone while the agent's question waits: not an answer, and not taken (the
        question comes first); the sender, if the file was for the bot, is told so."""
        if early is None or await early is None:
            return
        name = msg.media.name if msg.media is not None else "that file"
        await self.conversations.answer_for(msg).notice(
            f"I'm still waiting for your answer to my question, so I did not take {name}. "
            "Answer the question first, then send the file again."
        )

    def _start_audience(
        self, room_id: str, sender: str, is_dm: bool, access: asyncio.Future[AccessResult | None]
    ) -> asyncio.Task[Audience | None] | None:
        """The audience, resolving in the background once `access` allows the sender (a denied
        sender must not make the bot ask the provider about a whole room); None (no task, no
        I/O) when there is none."""
        if not audience_applies(is_dm=is_dm, enabled=self.settings.AUDIENCE_FILTER == "on"):
            return None

        async def once_allowed() -> Audience | None:
            if await asyncio.shield(access) is None:
                return None
            return await self.conversations.resolve_audience(room_id, sender)

        return asyncio.ensure_future(once_allowed())

    async def _on_stop(self, msg: IncomingMessage, sid: SessionId) -> None:
        if await self.conversations.check_access(msg.room_id, msg.sender) is None:
            return
        session_id = sid.format()
        stopped = self.workers.stop(session_id) or self.conversations.stop_scheduled(session_id)
        if not stopped and await rooms.is_dm(self.client, msg.room_id):
            await self.conversations.answer_for(msg).notice("Nothing is running.")

    # ---- invites -------------------------------------------------------------------------
    async def on_invite(self, room_id: str, invite_state: list[Any]) -> None:
        inviter = next(
            (
                e.sender
                for e in invite_state
                if isinstance(e, InviteMemberEvent) and e.state_key == self.me and e.membership == "invite"
            ),
            None,
        )
        if inviter and invite_allowed(inviter, self.settings.INVITE_ALLOWLIST, self.settings.server_name):
            resp = await self.client.join(room_id)
            log.info("invite_accepted", room_id=room_id, inviter=inviter, ok=not hasattr(resp, "status_code"))
        else:
            await self.client.room_leave(room_id)
            log.warning("invite_rejected", room_id=room_id, inviter=inviter)
