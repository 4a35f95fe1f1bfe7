"""The bot: Matrix sync in, decisions (pure modules), graph calls and answers out.

Per event, in order: claim it exactly once (Redis SET NX), then in the session's queue:
pending question? -> addressed to the bot? -> tenant domain -> agent access (silent
denial, fail closed) -> command / flood / length -> stream the graph's answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
from nio import (
    AsyncClient,
    InviteMemberEvent,
    MegolmEvent,
    MessageDirection,
    RoomGetEventResponse,
    RoomGetStateEventResponse,
    RoomMessagesResponse,
    SyncResponse,
)
from redis.asyncio import Redis

from vagent_bot import matrix, metrics
from vagent_bot.access import AccessProvider, AccessResult
from vagent_bot.commands import help_text, parse_command
from vagent_bot.flood import FloodControl
from vagent_bot.graph_client import GraphBusy, GraphClient, GraphError
from vagent_bot.hitl_store import HitlStore
from vagent_bot.invites import invite_allowed
from vagent_bot.responder import Answer
from vagent_bot.routing import Decision, IncomingMessage, parse_message, session_for, should_answer
from vagent_bot.sessions import SessionWorkers
from vagent_bot.streaming import EditThrottle
from vagent_shared import redis_keys
from vagent_shared.events import (
    ErrorEvent,
    HitlRequest,
    Progress,
    SSEEvent,
    TextChunk,
    TextFinal,
)
from vagent_shared.hitl import PendingQuestion, format_question, normalize_answer, reaction_answer
from vagent_shared.session import SessionId
from vagent_shared.settings import BotSettings
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest

log = structlog.get_logger(__name__)

BUSY_RETRY_SECONDS = 120.0
BACKFILL_PAGES = 10
THREAD_MARK_TTL = 30 * 24 * 3600
UNDECRYPTED_KEEP_SECONDS = 600
UNDECRYPTED_MAX = 500


class VagentBot:
    def __init__(
        self,
        settings: BotSettings,
        client: AsyncClient,
        redis: Redis,
        graph: GraphClient,
        access: AccessProvider,
        flood: FloodControl,
    ) -> None:
        self.s, self.client, self.redis = settings, client, redis
        self.graph, self.access, self.flood = graph, access, flood
        self.hitl = HitlStore(redis)
        self.workers = SessionWorkers()
        self.tenants: dict[str, str | None] = {}
        self.display_name: str | None = None
        self.last_sync = 0.0
        self._skip_history = False
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._undecrypted: list[tuple[str, MegolmEvent, float]] = []

    @property
    def me(self) -> str:
        return str(self.client.user_id)

    # ---- lifecycle ---------------------------------------------------------------------
    async def run(self) -> None:
        """Sync until stop(); resumes from the token saved in Redis after every sync."""
        await matrix.login(self.client, self.s)
        resp = await self.client.get_displayname(self.me)
        self.display_name = getattr(resp, "displayname", None)
        self.client.add_response_callback(self._on_sync, SyncResponse)  # type: ignore[arg-type]
        backoff = 1.0
        while not self._stopping.is_set():
            since = await self.redis.get(redis_keys.sync_token(self.me))
            self._skip_history = since is None
            if self._skip_history:
                log.info("first_start", note="old history is not answered")
            sync = asyncio.create_task(
                self.client.sync_forever(
                    timeout=30_000,
                    sync_filter=matrix.sync_filter(self.s.SYNC_TIMELINE_LIMIT),
                    since=since.decode() if isinstance(since, bytes) else since,
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
        return time.time() - self.last_sync < max_age

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- sync ----------------------------------------------------------------------------
    async def _on_sync(self, resp: SyncResponse) -> None:
        started = time.perf_counter()
        for room_id, info in resp.rooms.invite.items():
            self._spawn(self._on_invite(room_id, info.invite_state))
        if self._skip_history:
            self._skip_history = False
            for room_id, room in resp.rooms.join.items():
                self._learn_tenant(room_id, [*room.state, *room.timeline.events])
        else:
            for room_id, room in resp.rooms.join.items():
                events = list(room.timeline.events)
                if room.timeline.limited and room.timeline.prev_batch and self._joined_at(events) is None:
                    events = await self._backfill(room_id, room.timeline.prev_batch) + events
                self._learn_tenant(room_id, [*room.state, *events])
                joined = self._joined_at(events)
                if joined is not None:  # what was said before the bot joined is not for it
                    events = events[joined + 1 :]
                claimed = await self._claim([e.event_id for e in events])
                for event, mine in zip(events, claimed, strict=True):
                    if mine:
                        self._dispatch(room_id, event)
                    else:
                        metrics.EVENTS.labels("duplicate").inc()
        self._retry_decryption()
        await self.redis.set(redis_keys.sync_token(self.me), resp.next_batch)
        self.last_sync = time.time()
        metrics.LAST_SYNC.set(self.last_sync)
        metrics.SYNC_SECONDS.observe(time.perf_counter() - started)

    def _retry_decryption(self) -> None:
        """Events whose room key came with a later sync are handled then (for 10 minutes)."""
        waiting, self._undecrypted = self._undecrypted, []
        for room_id, event, since in waiting:
            try:
                decrypted = self.client.decrypt_event(event)
            except Exception:
                decrypted = None
            if decrypted is not None and not isinstance(decrypted, MegolmEvent):
                log.info("decrypted_late", room_id=room_id, event_id=event.event_id)
                self._dispatch(room_id, decrypted)
            elif time.time() - since < UNDECRYPTED_KEEP_SECONDS:
                self._undecrypted.append((room_id, event, since))
        del self._undecrypted[:-UNDECRYPTED_MAX]

    async def _claim(self, event_ids: list[str]) -> list[bool]:
        """Exactly once across restarts and processes: the first SET NX wins."""
        if not event_ids:
            return []
        async with self.redis.pipeline(transaction=False) as p:
            for eid in event_ids:
                p.set(redis_keys.event_seen(eid), "1", nx=True, ex=self.s.EVENT_DEDUP_TTL_SECONDS)
            return [bool(r) for r in await p.execute()]

    async def _backfill(self, room_id: str, prev_batch: str) -> list[Any]:
        """A `limited` sync skipped events: fetch them back until one we have already seen."""
        older: list[Any] = []
        token: str | None = prev_batch
        for _ in range(BACKFILL_PAGES):
            if not token:
                break
            resp = await self.client.room_messages(
                room_id, start=token, direction=MessageDirection.back, limit=100
            )
            if not isinstance(resp, RoomMessagesResponse) or not resp.chunk:
                break
            seen = await self.redis.exists(*[redis_keys.event_seen(e.event_id) for e in resp.chunk])
            older = list(reversed(resp.chunk)) + older
            if seen or self._joined_at(older) is not None:
                break
            token = resp.end
        log.info("backfilled", room_id=room_id, events=len(older))
        return older

    def _joined_at(self, events: list[Any]) -> int | None:
        """Index of the bot's own (newest) join in `events`; profile changes do not count."""
        for i in range(len(events) - 1, -1, -1):
            src = getattr(events[i], "source", {}) or {}
            if src.get("type") != "m.room.member" or src.get("state_key") != self.me:
                continue
            prev = ((src.get("unsigned") or {}).get("prev_content") or {}).get("membership")
            if (src.get("content") or {}).get("membership") == "join" and prev != "join":
                return i
        return None

    def _learn_tenant(self, room_id: str, events: list[Any]) -> None:
        for e in events:
            src = getattr(e, "source", {}) or {}
            if src.get("type") == self.s.TENANT_STATE_EVENT_TYPE and src.get("state_key", "") == "":
                domain = (src.get("content") or {}).get("domain")
                self.tenants[room_id] = domain if isinstance(domain, str) and domain else None

    def _dispatch(self, room_id: str, event: Any) -> None:
        src: dict[str, Any] = getattr(event, "source", {}) or {}
        sender = src.get("sender")
        if sender == self.me:
            metrics.EVENTS.labels("own").inc()
            return
        if isinstance(event, MegolmEvent):
            # its room key may arrive later (nio never retries): keep it and ask for the key
            metrics.EVENTS.labels("undecryptable").inc()
            log.warning("undecryptable_event", room_id=room_id, event_id=event.event_id)
            self._undecrypted.append((room_id, event, time.time()))
            self._spawn(self.client.request_room_key(event))
            return
        etype = src.get("type")
        if etype == "m.reaction":
            self._spawn(self._on_reaction(room_id, src))
            return
        msg = parse_message(src, room_id)
        if msg is None:
            return
        sid = session_for(msg)
        command = parse_command(self._quick_text(msg))
        if command is not None and command.name == "stop":
            self._spawn(self._on_stop(msg, sid))
            return
        self.workers.submit(sid.format(), lambda: self._handle_message(msg))

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
    def _is_dm(self, room_id: str) -> bool:
        room = self.client.rooms.get(room_id)
        return room is not None and room.member_count <= 2

    async def _handle_message(self, msg: IncomingMessage) -> None:
        sid = session_for(msg)
        structlog.contextvars.bind_contextvars(session_id=sid.format(), event_id=msg.event_id)
        is_dm = self._is_dm(msg.room_id)
        replied_to = None
        if msg.in_reply_to and not is_dm:
            replied_to = await self._sender_of(msg.room_id, msg.in_reply_to)
        in_thread = bool(
            msg.thread_root and await self.redis.exists(redis_keys.bot_thread(msg.room_id, msg.thread_root))
        )
        decision = self._decide(msg, is_dm=is_dm, replied_to=replied_to, in_thread=in_thread)
        log.debug("message", session_id=sid.format(), decision=decision.reason, body=msg.body)

        # The provider is the slowest step before the graph: ask it while Redis answers.
        early = (
            asyncio.ensure_future(self._check_access(msg.room_id, msg.sender)) if decision.answer else None
        )
        try:
            pending = await self.hitl.peek(sid.format())
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        if pending is not None:
            await self._answer_pending(
                msg,
                pending,
                decision.text or msg.body.strip(),
                addressed=decision.answer
                or is_dm
                or (msg.thread_root is not None and msg.thread_root == pending.thread_root),
                early_access=early,
            )
            return
        if early is None:
            metrics.EVENTS.labels(decision.reason).inc()
            return
        access = await early
        if access is None:
            return
        metrics.EVENTS.labels("answered").inc()
        answer = self._answer_for(msg)
        command = parse_command(decision.text)
        if command is not None:
            await self._command(command.name, sid, answer)
            return
        if not await self.flood.allow(msg.sender):
            await answer.notice("⏳ You're sending messages too fast. Please wait a moment.")
            return
        if len(decision.text) > self.s.MAX_MESSAGE_CHARS:
            await answer.notice(
                f"✋ That message is too long ({len(decision.text)} characters; "
                f"the limit is {self.s.MAX_MESSAGE_CHARS}). Please shorten it."
            )
            return
        req = ProcessMessageRequest(
            session_id=sid.format(),
            room_id=msg.room_id,
            user_id=msg.sender,
            message=decision.text,
            context={
                "event_id": msg.event_id,
                **({"thread_root": msg.thread_root} if msg.thread_root else {}),
            },
            ac_context=access.ac,  # type: ignore[arg-type]
        )
        await self._converse(sid, answer, lambda: self.graph.process_message(req), msg.server_ts / 1000)

    async def _check_access(self, room_id: str, user_id: str) -> AccessResult | None:
        """Layer 1. Denied, or no tenant: None, and the caller stays silent."""
        domain = await self._domain(room_id)
        if domain is None:
            metrics.ACCESS.labels("no_tenant").inc()
            log.warning("access_denied", user_id=user_id, room_id=room_id, reason="no_tenant_domain")
            return None
        result = await self.access.check(user_id, domain)
        return result if result.allowed and result.ac is not None else None

    async def _domain(self, room_id: str) -> str | None:
        if room_id not in self.tenants:
            resp = await self.client.room_get_state_event(room_id, self.s.TENANT_STATE_EVENT_TYPE, "")
            domain = resp.content.get("domain") if isinstance(resp, RoomGetStateEventResponse) else None
            self.tenants[room_id] = domain if isinstance(domain, str) and domain else None
        return self.tenants[room_id] or self.s.DEFAULT_DOMAIN

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
        if not self.workers.stop(sid.format()) and self._is_dm(msg.room_id):
            await self._answer_for(msg).notice("Nothing is running.")

    # ---- questions -----------------------------------------------------------------------
    async def _answer_pending(
        self,
        msg: IncomingMessage,
        pending: PendingQuestion,
        text: str,
        addressed: bool,
        early_access: asyncio.Future[AccessResult | None] | None = None,
    ) -> None:
        """`early_access`: the access check already under way for this message, if any."""
        answer = normalize_answer(text, pending.options)
        if answer is None:
            if not addressed:
                if early_access is not None:
                    early_access.cancel()
                return  # group chatter by the same user is not an answer attempt
            access = await (early_access or self._check_access(msg.room_id, msg.sender))
            if access is None:
                return
            metrics.HITL.labels("invalid_answer").inc()
            target = self._new_answer(msg.room_id, pending.thread_root, msg.event_id)
            options = " or ".join(pending.options) if pending.options else "an answer"
            await target.notice(
                f"Please answer {options}. {format_question(pending.question, pending.options)}"
            )
            return
        await self._submit_answer(
            msg.room_id,
            msg.sender,
            pending,
            answer,
            reply_to=msg.event_id,
            sent_at=msg.server_ts / 1000,
            early_access=early_access,
        )

    async def _submit_answer(
        self,
        room_id: str,
        user_id: str,
        pending: PendingQuestion,
        answer: str,
        *,
        reply_to: str | None,
        sent_at: float,
        early_access: asyncio.Future[AccessResult | None] | None = None,
    ) -> None:
        structlog.contextvars.bind_contextvars(session_id=pending.session_id)
        access = await (early_access or self._check_access(room_id, user_id))
        if access is None:
            return
        if await self.hitl.consume(pending.session_id) is None:
            return  # expired or already answered (another process, a double click)
        metrics.HITL.labels("answered").inc()
        log.info("hitl_answered", session_id=pending.session_id, answer=answer)
        req = FeedbackRequest(
            session_id=pending.session_id,
            response=answer,
            interrupt_id=pending.interrupt_id,
            ac_context=access.ac,
        )
        target = self._new_answer(room_id, pending.thread_root, reply_to or pending.reply_to)
        await self._converse(
            SessionId.parse(pending.session_id), target, lambda: self.graph.submit_feedback(req), sent_at
        )

    async def _on_reaction(self, room_id: str, src: dict[str, Any]) -> None:
        rel = (src.get("content") or {}).get("m.relates_to") or {}
        if rel.get("rel_type") != "m.annotation" or not rel.get("event_id"):
            return
        sid = await self.hitl.session_for_question(str(rel["event_id"]))
        if sid is None:
            return
        sender = str(src.get("sender"))
        if SessionId.parse(sid).user_id != sender:
            log.info("hitl_reaction_ignored", session_id=sid, reason="not the asking user")
            return
        pending = await self.hitl.peek(sid)
        answer = reaction_answer(str(rel.get("key", "")), pending.options) if pending else None
        if pending is None or answer is None:
            return
        self.workers.submit(
            sid,
            lambda: self._submit_answer(room_id, sender, pending, answer, reply_to=None, sent_at=time.time()),
        )

    # ---- streaming -----------------------------------------------------------------------
    async def _converse(self, sid: SessionId, answer: Answer, open_stream: Any, sent_at: float) -> None:
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
