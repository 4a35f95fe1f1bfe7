"""The bot: Matrix sync in, decisions (pure modules), graph calls and answers out.

Per event, in order: claim it exactly once (`sync`), then in the session's queue:
pending question? (`questions`) -> addressed to the bot? -> tenant domain -> agent access
(silent denial, fail closed) -> command / flood / length -> stream the graph's answer, with
the room's audience (`audience`: who else reads it) resolved once access is granted.
This module is the glue: the lifecycle, that order, and relaying the graph's stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import structlog
from nio import AsyncClient, InviteMemberEvent, RoomGetEventResponse, SyncResponse
from redis.asyncio import Redis

from vagent_bot import matrix, metrics
from vagent_bot.access import AccessProvider, AccessResult
from vagent_bot.audience import RoomAudience, audience_applies, joined_members
from vagent_bot.commands import help_text, parse_command
from vagent_bot.flood import FloodControl
from vagent_bot.graph_client import GraphBusy, GraphClient, GraphError
from vagent_bot.hitl_store import HitlStore
from vagent_bot.invites import invite_allowed
from vagent_bot.questions import OpenStream, Questions, loggable
from vagent_bot.responder import Answer
from vagent_bot.routing import Decision, IncomingMessage, parse_message, session_for, should_answer
from vagent_bot.sessions import SessionWorkers
from vagent_bot.streaming import EditThrottle
from vagent_bot.sync import SyncHandler
from vagent_bot.tenants import Tenants
from vagent_shared import redis_keys
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.events import (
    ErrorEvent,
    HitlRequest,
    Progress,
    SSEEvent,
    TextChunk,
    TextFinal,
)
from vagent_shared.hitl import PendingQuestion, format_question
from vagent_shared.knowledge import Audience
from vagent_shared.session import SessionId
from vagent_shared.settings import BotSettings
from vagent_shared.wire import ProcessMessageRequest

log = structlog.get_logger(__name__)

BUSY_RETRY_SECONDS = 120.0
THREAD_MARK_TTL = 30 * 24 * 3600


class VagentBot:
    def __init__(
        self,
        settings: BotSettings,
        client: AsyncClient,
        redis: Redis,
        graph: GraphClient,
        access: AccessProvider,
        flood: FloodControl,
        audit: AuditTrail | None = None,
    ) -> None:
        self.s, self.client, self.redis = settings, client, redis
        self.graph, self.access, self.flood = graph, access, flood
        self.hitl = HitlStore(redis)
        self.workers = SessionWorkers()
        self.tenants = Tenants(client, settings.TENANT_STATE_EVENT_TYPE, settings.DEFAULT_DOMAIN)
        self.sync = SyncHandler(
            settings,
            client,
            redis,
            self.tenants,
            on_event=self._dispatch,
            on_invite=self._on_invite,
            spawn=self._spawn,
        )
        self.audience = RoomAudience(
            list_joined=lambda room_id: joined_members(client, room_id),
            fetch=access.context,
            max_members=settings.AUDIENCE_MAX_MEMBERS,
            concurrency=settings.AUDIENCE_CONCURRENCY,
            timeout=settings.ACP_TIMEOUT_SECONDS,
        )
        self.questions = Questions(
            self.hitl,
            graph,
            self.workers,
            check_access=self._check_access,
            resolve_audience=self._audience,
            new_answer=self._new_answer,
            converse=self._converse,
            audit=audit,
        )
        self.display_name: str | None = None
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def me(self) -> str:
        return str(self.client.user_id)

    # ---- lifecycle ---------------------------------------------------------------------
    async def run(self) -> None:
        """Sync until stop(); resumes from the token saved in Redis after every sync."""
        await matrix.login(self.client, self.s)
        resp = await self.client.get_displayname(self.me)
        self.display_name = getattr(resp, "displayname", None)
        self.client.add_response_callback(self.sync.on_sync, SyncResponse)  # type: ignore[arg-type]
        self._spawn(self.sync.keep_leases())
        backoff = 1.0
        while not self._stopping.is_set():
            since = await self.sync.resume_token()
            sync = asyncio.create_task(
                self.client.sync_forever(
                    timeout=30_000,
                    sync_filter=matrix.sync_filter(self.s.SYNC_TIMELINE_LIMIT),
                    since=since,
                    full_state=True,
                )
            )
            stop = asyncio.create_task(self._stopping.wait())
            done, _ = await asyncio.wait({sync, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                sync.cancel()
                await asyncio.gather(sync, return_exceptions=True)
                break
            stop.cancel()
            exc = sync.exception()
            log.error("sync_loop_failed", error_type=type(exc).__name__ if exc else None)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30)

    async def stop(self, grace_seconds: float = 20.0) -> None:
        """SIGTERM: stop syncing (the token is already saved), finish or cancel runs."""
        self._stopping.set()
        await self.workers.shutdown(grace_seconds)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def sync_alive(self, max_age: float = 90.0) -> bool:
        return self.sync.alive(max_age)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- per event -----------------------------------------------------------------------
    def _dispatch(self, room_id: str, event: Any) -> None:
        """An event for the bot (`sync`: claimed, decrypted, not its own): route it, no I/O.
        Whatever handles it tells `sync` when it is finished (`_handling`)."""
        src: dict[str, Any] = getattr(event, "source", {}) or {}
        etype = src.get("type")
        event_id = str(src.get("event_id", ""))
        if etype == "m.reaction":
            self._spawn(self._handling(event_id, self.questions.on_reaction(room_id, src)))
            return
        msg = parse_message(src, room_id)
        if msg is None:
            self._spawn(self.sync.finished(event_id))
            return
        sid = session_for(msg)
        command = parse_command(self._quick_text(msg))
        if command is not None and command.name == "stop":
            self._spawn(self._handling(event_id, self._on_stop(msg, sid)))
            return
        self.workers.submit(sid.format(), lambda: self._handling(event_id, self._handle_message(msg)))

    async def _handling(self, event_id: str, work: Coroutine[Any, Any, Any]) -> None:
        """Handle one event: its messages under transaction ids of its own (sent once even if
        it is handled again), then finished. Cancelled by a shutdown it stays unfinished, and
        the next bot takes it over; cancelled by `!stop` (or failed) it is finished."""
        try:
            with matrix.handling(event_id):
                await work
        except asyncio.CancelledError:
            if not self._stopping.is_set():
                await self.sync.finished(event_id)
            raise
        except Exception:
            await self.sync.finished(event_id)
            raise
        await self.sync.finished(event_id)

    def _decide(
        self, msg: IncomingMessage, *, is_dm: bool, replied_to: str | None, in_thread: bool
    ) -> Decision:
        return should_answer(
            msg,
            bot_user_id=self.me,
            bot_display_name=self.display_name,
            is_dm=is_dm,
            prefix=self.s.COMMAND_PREFIX,
            replied_to_sender=replied_to,
            bot_in_thread=in_thread,
        )

    def _quick_text(self, msg: IncomingMessage) -> str:
        """The message without prefix/mention, before any I/O: enough to spot `!stop`."""
        return self._decide(msg, is_dm=True, replied_to=None, in_thread=False).text

    # ---- per message -------------------------------------------------------------------
    async def _is_dm(self, room_id: str) -> bool:
        """Two members at most. nio counts them from the sync's room summary; without one (the
        first sync after a restart may carry none) it counts the members it knows, and with
        lazy-loaded members that is only who has spoken: a group room would pass for a DM
        (everything answered, no audience). Then the homeserver is asked for the members, once
        (nio keeps them up to date from then on); if it cannot say, the room is no DM."""
        room = self.client.rooms.get(room_id)
        if room is None:
            return False
        summary = room.summary
        counted = summary is not None and None not in (
            summary.joined_member_count,
            summary.invited_member_count,
        )
        if not counted and not room.members_synced and await joined_members(self.client, room_id) is None:
            return False
        return bool(room.member_count <= 2)

    async def _handle_message(self, msg: IncomingMessage) -> None:
        sid = session_for(msg)
        structlog.contextvars.bind_contextvars(session_id=sid.format(), event_id=msg.event_id)
        is_dm = await self._is_dm(msg.room_id)
        replied_to = None
        if msg.in_reply_to and not is_dm:
            replied_to = await self._sender_of(msg.room_id, msg.in_reply_to)
        in_thread = bool(
            msg.thread_root and await self.redis.exists(redis_keys.bot_thread(msg.room_id, msg.thread_root))
        )
        decision = self._decide(msg, is_dm=is_dm, replied_to=replied_to, in_thread=in_thread)
        log.debug("message", session_id=sid.format(), decision=decision.reason, body=loggable(msg.body))

        # The provider is the slowest step before the graph: ask it (about the sender, and
        # about the room's other members) while Redis answers. A DM starts no audience at all.
        early = (
            asyncio.ensure_future(self._check_access(msg.room_id, msg.sender)) if decision.answer else None
        )
        audience = self._start_audience(msg.room_id, msg.sender, is_dm, early) if early else None
        try:
            await self._route(msg, sid, decision, is_dm, early, audience)
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
        early: asyncio.Future[AccessResult | None] | None,
        audience: asyncio.Future[Audience | None] | None,
    ) -> None:
        """A pending question's answer, or a new request; `early`/`audience` already under way."""
        pending = await self.hitl.peek(sid.format())
        if pending is not None:
            await self.questions.answer_pending(
                msg,
                pending,
                decision.text or msg.body.strip(),
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
        await self._answer_request(msg, sid, decision.text, access, audience)

    async def _answer_request(
        self,
        msg: IncomingMessage,
        sid: SessionId,
        text: str,
        access: AccessResult,
        audience: asyncio.Future[Audience | None] | None,
    ) -> None:
        """A message the user may send: a command, a refusal (flood, length) or the graph's answer."""
        answer = self._answer_for(msg)
        command = parse_command(text)
        if command is not None:
            await self._command(command.name, sid, answer)
            return
        if not await self.flood.allow(msg.sender):
            await answer.notice("⏳ You're sending messages too fast. Please wait a moment.")
            return
        if len(text) > self.s.MAX_MESSAGE_CHARS:
            await answer.notice(
                f"✋ That message is too long ({len(text)} characters; "
                f"the limit is {self.s.MAX_MESSAGE_CHARS}). Please shorten it."
            )
            return
        req = ProcessMessageRequest(
            session_id=sid.format(),
            room_id=msg.room_id,
            user_id=msg.sender,
            message=text,
            context={
                "event_id": msg.event_id,
                **({"thread_root": msg.thread_root} if msg.thread_root else {}),
            },
            ac_context=access.ac,  # type: ignore[arg-type]
            audience=await audience if audience is not None else None,
        )
        await self._converse(sid, answer, lambda: self.graph.process_message(req), msg.server_ts / 1000)

    def _start_audience(
        self, room_id: str, sender: str, is_dm: bool, access: asyncio.Future[AccessResult | None]
    ) -> asyncio.Task[Audience | None] | None:
        """The audience, resolving in the background once `access` allows the sender (a denied
        sender must not make the bot ask the provider about a whole room); None (no task, no
        I/O) when there is none."""
        if not audience_applies(is_dm=is_dm, enabled=self.s.AUDIENCE_FILTER == "on"):
            return None

        async def once_allowed() -> Audience | None:
            if await asyncio.shield(access) is None:
                return None
            return await self._audience(room_id, sender)

        return asyncio.ensure_future(once_allowed())

    async def _audience(self, room_id: str, sender: str) -> Audience | None:
        """Who else reads an answer to `sender` here, resolved afresh: None in a DM or with
        AUDIENCE_FILTER=off (returned at once, without I/O)."""
        if not audience_applies(is_dm=await self._is_dm(room_id), enabled=self.s.AUDIENCE_FILTER == "on"):
            return None
        domain = await self.tenants.domain(room_id)
        if domain is None:
            return None  # no tenant: the access check denies this message, nothing is sent
        return await self.audience.resolve(room_id, bot=self.me, sender=sender, domain=domain)

    async def _check_access(self, room_id: str, user_id: str) -> AccessResult | None:
        """Layer 1. Denied, or no tenant: None, and the caller stays silent."""
        domain = await self.tenants.domain(room_id)
        if domain is None:
            metrics.ACCESS.labels("no_tenant").inc()
            log.warning("access_denied", user_id=user_id, room_id=room_id, reason="no_tenant_domain")
            return None
        result = await self.access.check(user_id, domain)
        return result if result.allowed and result.ac is not None else None

    async def _sender_of(self, room_id: str, event_id: str) -> str | None:
        resp = await self.client.room_get_event(room_id, event_id)
        return str(resp.event.sender) if isinstance(resp, RoomGetEventResponse) else None

    def _answer_for(self, msg: IncomingMessage, reply_to: str | None = None) -> Answer:
        """In the user's thread if they wrote in one, else as a reply to their message."""
        return self._new_answer(msg.room_id, msg.thread_root, reply_to or msg.event_id)

    def _new_answer(self, room_id: str, thread_root: str | None, reply_to: str | None) -> Answer:
        throttle = EditThrottle(
            self.s.EDIT_FIRST_DELAY_SECONDS, self.s.EDIT_MAX_INTERVAL_SECONDS, max_edits=self.s.EDIT_MAX_COUNT
        )
        return Answer(
            self.client,
            room_id,
            thread_root=thread_root,
            reply_to=reply_to,
            throttle=throttle,
            hold_seconds=self.s.STREAM_HOLD_SECONDS,
        )

    async def _command(self, name: str, sid: SessionId, answer: Answer) -> None:
        if name == "help":
            await answer.notice(help_text(self.s.COMMAND_PREFIX, self.s.AGENT_ID))
        elif name == "reset":
            await self.hitl.drop(sid.format())
            try:
                await self.graph.reset(sid.format())
                await answer.notice("🧹 Done: I forgot this conversation.")
            except GraphError as exc:
                await answer.notice(f"⚠️ {exc.user_message}")
        elif name == "stop":
            await answer.notice("Nothing is running.")

    async def _on_stop(self, msg: IncomingMessage, sid: SessionId) -> None:
        if await self._check_access(msg.room_id, msg.sender) is None:
            return
        if not self.workers.stop(sid.format()) and await self._is_dm(msg.room_id):
            await self._answer_for(msg).notice("Nothing is running.")

    # ---- streaming -----------------------------------------------------------------------
    async def _converse(
        self, sid: SessionId, answer: Answer, open_stream: OpenStream, sent_at: float
    ) -> None:
        """Stream one graph run into Matrix; every failure ends in one short message."""
        if sid.thread_id:
            await self.redis.set(redis_keys.bot_thread(sid.room_id, sid.thread_id), "1", ex=THREAD_MARK_TTL)
        answer.start_typing(after_seconds=self.s.TYPING_DELAY_SECONDS)
        metrics.ACTIVE_RUNS.inc()
        try:
            deadline = time.monotonic() + BUSY_RETRY_SECONDS
            while True:
                try:
                    await self._relay(sid, answer, open_stream())
                    break
                except GraphBusy:  # the session runs elsewhere (another bot process)
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            await answer.settle()
            await answer.notice("⏹️ Stopped.")
        except GraphError as exc:
            await answer.settle()
            await answer.notice(f"⚠️ {exc.user_message}")
        finally:
            metrics.ACTIVE_RUNS.dec()
            await answer.close()
            if answer.first_reply_at is not None:
                metrics.ANSWER_SECONDS.observe(max(0.0, time.time() - sent_at))

    async def _relay(self, sid: SessionId, answer: Answer, events: AsyncIterator[SSEEvent]) -> None:
        async for ev in events:
            if isinstance(ev, TextChunk):
                await answer.chunk(ev.content)
            elif isinstance(ev, Progress):
                await answer.progress(ev.content)
            elif isinstance(ev, TextFinal):
                await answer.final(ev.content)
            elif isinstance(ev, HitlRequest):
                await answer.settle()
                await answer.stop_typing()
                qid = await answer.notice(format_question(ev.question, ev.options))
                pending = PendingQuestion(
                    session_id=sid.format(),
                    room_id=sid.room_id,
                    user_id=sid.user_id,
                    question=ev.question,
                    options=ev.options,
                    interrupt_id=ev.interrupt_id,
                    question_event_id=qid,
                    thread_root=sid.thread_id,
                    reply_to=answer.reply_to,
                    asked_at=time.time(),
                )
                await self.hitl.save(pending, ev.timeout_seconds or self.s.HITL_DEFAULT_TIMEOUT_SECONDS)
                metrics.HITL.labels("asked").inc()
            elif isinstance(ev, ErrorEvent):
                await answer.settle()
                await answer.notice(f"⚠️ {ev.message}")

    # ---- invites -------------------------------------------------------------------------
    async def _on_invite(self, room_id: str, invite_state: list[Any]) -> None:
        inviter = next(
            (
                e.sender
                for e in invite_state
                if isinstance(e, InviteMemberEvent) and e.state_key == self.me and e.membership == "invite"
            ),
            None,
        )
        if inviter and invite_allowed(inviter, self.s.INVITE_ALLOWLIST, self.s.server_name):
            resp = await self.client.join(room_id)
            log.info("invite_accepted", room_id=room_id, inviter=inviter, ok=not hasattr(resp, "status_code"))
        else:
            await self.client.room_leave(room_id)
            log.warning("invite_rejected", room_id=room_id, inviter=inviter)
