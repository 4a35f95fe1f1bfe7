"""One turn of a conversation: may the user speak, who else reads, the graph's answer streamed
into Matrix.

New messages (`event_router`) and answers to the agent's questions (`questions`, through its
`Turns` protocol) take the same way: the same access check (layer 1: silent denial, fail
closed), the room's audience resolved afresh, an `Answer` in the user's thread or reply
chain, and the graph's stream relayed into it. Every failure ends in one short message.
Relaying includes the asking side of a question: the graph's HitlRequest is shown and saved
(`hitl_store`); the answer comes back later as a message or a reaction (`questions`).
Files come with a question (`turn_files`: downloaded only once access is granted; a voice
message becomes its transcript, quoted back at the top of the answer), and images a tool
returned are posted after the answer's text (`images_out`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from nio import AsyncClient
from redis.asyncio import Redis

from vagent_bot.access.audience import RoomAudience, audience_applies, joined_members
from vagent_bot.answers.edit_pacing import EditThrottle
from vagent_bot.answers.images_out import post_image
from vagent_bot.answers.questions_out import post_question
from vagent_bot.answers.streaming import Answer
from vagent_bot.clients.graph_client import GraphBusy, GraphClient, GraphError
from vagent_bot.clients.transcribe import Transcriber, TranscriptionFailed
from vagent_bot.conversation.commands import help_text, parse_command
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_bot.conversation.routing import IncomingMessage
from vagent_bot.conversation.trace_store import TraceStore, TurnIndex
from vagent_bot.conversation.turn_files import TurnFiles, TurnInput
from vagent_bot.matrix import rooms
from vagent_bot.matrix.downloads import MediaDownloader, MediaRefused
from vagent_bot.matrix.media import heard_line, video_refusal
from vagent_bot.matrix.tenants import Tenants
from vagent_bot.observability import metrics
from vagent_bot.observability.spans import access_span
from vagent_shared import redis_keys
from vagent_shared.access_provider import AccessProvider, AccessResult
from vagent_shared.events import (
    Done,
    ErrorEvent,
    HitlRequest,
    ImageOut,
    Progress,
    SSEEvent,
    TextChunk,
    TextFinal,
    TurnStarted,
)
from vagent_shared.flood import FloodControl
from vagent_shared.hitl import PendingQuestion
from vagent_shared.knowledge import Audience
from vagent_shared.session import SessionId
from vagent_shared.settings import BotSettings
from vagent_shared.wire import ProcessMessageRequest

log = structlog.get_logger(__name__)

BUSY_RETRY_SECONDS = 120.0
#: Refusals that start with their own emoji (🎤, 🎬) get no ⚠️ in front.
_EMOJI = frozenset("🎤🎬")
THREAD_MARK_TTL = 30 * 24 * 3600

#: Opens the graph's stream for one turn (a new message, or the answer to a question).
OpenStream = Callable[[], AsyncIterator[SSEEvent]]


@dataclass(frozen=True)
class ScheduledTurn:
    """How a scheduled run's turn ended: `failure`, the message the room was shown if it
    failed; `over_budget`, the graph refused it on the owner's budget (the usual notice)."""

    failure: str | None
    over_budget: bool = False
    #: The owner stopped the answer with `!stop`.
    stopped: bool = False


def readers_unchecked(*, is_dm: bool, enabled: bool) -> bool:
    """Others read the answer, yet no audience is sent: a group room with AUDIENCE_FILTER=off.
    The graph then recalls only `--everywhere` memories (docs/memory.md): without the readers
    it cannot tell who heard what, and a missing audience must not pass for a DM."""
    return not is_dm and not audience_applies(is_dm=is_dm, enabled=enabled)


class Conversations:
    """The bot's side of every conversation; one instance serves all sessions."""

    def __init__(
        self,
        settings: BotSettings,
        client: AsyncClient,
        redis: Redis,
        graph: GraphClient,
        access: AccessProvider,
        flood: FloodControl,
        hitl: HitlStore,
        tenants: Tenants,
        files: TurnFiles | None = None,
    ) -> None:
        self.settings, self.client, self.redis = settings, client, redis
        self.graph, self.access, self.flood = graph, access, flood
        self.hitl, self.tenants = hitl, tenants
        #: Which turn each answer belongs to (🔍 / `!why` find its TurnTrace: `why_answers`).
        self.traces = TraceStore(redis, settings.TRACE_TTL_SECONDS)
        #: Scheduled runs answering now, by session (`!stop` in their thread stops them).
        self._scheduled: dict[str, asyncio.Task[None]] = {}
        self._stopped: set[str] = set()
        self.files = files or TurnFiles(
            client,
            MediaDownloader.for_client(client, settings),
            Transcriber.from_settings(settings),
            max_per_turn=settings.ATTACHMENT_MAX_PER_TURN,
        )
        self.audience = RoomAudience(
            list_joined=lambda room_id: joined_members(client, room_id),
            fetch=access.context,
            max_members=settings.AUDIENCE_MAX_MEMBERS,
            concurrency=settings.AUDIENCE_CONCURRENCY,
            timeout=settings.ACP_TIMEOUT_SECONDS,
        )

    @property
    def me(self) -> str:
        return str(self.client.user_id)

    # ---- may the user speak, who else reads ------------------------------------------------
    async def check_access(self, room_id: str, user_id: str) -> AccessResult | None:
        """Layer 1. Denied, or no tenant: None, and the caller stays silent."""
        with access_span(room_id, user_id) as span:
            domain = await self.tenants.domain(room_id)
            if domain is None:
                metrics.ACCESS.labels("no_tenant").inc()
                log.warning("access_denied", user_id=user_id, room_id=room_id, reason="no_tenant_domain")
                span.set_attribute("vagent.access.reason", "no_tenant_domain")
                return None
            result = await self.access.check(user_id, domain)
            span.set_attributes({"vagent.access.reason": result.reason, "vagent.tenant": domain})
            return result if result.allowed and result.ac is not None else None

    async def resolve_audience(self, room_id: str, sender: str) -> Audience | None:
        """Who else reads an answer to `sender` here, resolved afresh: None in a DM or with
        AUDIENCE_FILTER=off (returned at once, without I/O)."""
        enabled = self.settings.AUDIENCE_FILTER == "on"
        if not audience_applies(is_dm=await rooms.is_dm(self.client, room_id), enabled=enabled):
            return None
        domain = await self.tenants.domain(room_id)
        if domain is None:
            return None  # no tenant: the access check denies this message, nothing is sent
        return await self.audience.resolve(room_id, bot=self.me, sender=sender, domain=domain)

    async def audience_unchecked(self, room_id: str) -> bool:
        """`readers_unchecked` for `room_id` (no I/O while AUDIENCE_FILTER is on). A room that
        cannot be told a DM counts as a group room: fewer memories, never more."""
        enabled = self.settings.AUDIENCE_FILTER == "on"
        if enabled:
            return False
        return readers_unchecked(is_dm=await rooms.is_dm(self.client, room_id), enabled=enabled)

    # ---- where the answer goes -------------------------------------------------------------
    def answer_for(self, msg: IncomingMessage) -> Answer:
        """In the user's thread if they wrote in one, else as a reply to their message."""
        return self.new_answer(msg.room_id, msg.thread_root, msg.event_id)

    def new_answer(self, room_id: str, thread_root: str | None, reply_to: str | None) -> Answer:
        throttle = EditThrottle(
            self.settings.EDIT_FIRST_DELAY_SECONDS,
            self.settings.EDIT_MAX_INTERVAL_SECONDS,
            max_edits=self.settings.EDIT_MAX_COUNT,
        )
        return Answer(
            self.client,
            room_id,
            thread_root=thread_root,
            reply_to=reply_to,
            throttle=throttle,
            hold_seconds=self.settings.STREAM_HOLD_SECONDS,
        )

    # ---- a new request -------------------------------------------------------------------
    async def answer_request(
        self,
        msg: IncomingMessage,
        sid: SessionId,
        text: str,
        access: AccessResult,
        audience: asyncio.Future[Audience | None] | None,
        *,
        replied_event: dict[str, Any] | None = None,
        thread_file: str | None = None,
    ) -> None:
        """A message the user may send: a command, a refusal (flood, length, a file not taken) or
        the graph's answer. `replied_event`: the event it replies to, if already fetched."""
        answer = self.answer_for(msg)
        command = parse_command(text)
        if command is not None:
            await self._command(command.name, sid, answer)
            return
        if not await self.flood.allow(msg.sender, room_id=msg.room_id):
            await answer.notice("⏳ You're sending messages too fast. Please wait a moment.")
            return
        if msg.media is not None and msg.media.kind == "video":
            await answer.notice(video_refusal(msg.media.name))
            return
        if not await self._short_enough(text, answer):
            return
        turn = await self._take_files(msg, text, answer, replied_event, thread_file)
        if turn is None or not await self._short_enough(turn.message, answer):
            return
        if turn.heard is not None:
            answer.prefix = heard_line(turn.heard)
        req = ProcessMessageRequest(
            session_id=sid.format(),
            room_id=msg.room_id,
            user_id=msg.sender,
            message=turn.message,
            context={
                "event_id": msg.event_id,
                **({"thread_root": msg.thread_root} if msg.thread_root else {}),
            },
            ac_context=access.ac,  # type: ignore[arg-type]
            audience=await audience if audience is not None else None,
            audience_unchecked=await self.audience_unchecked(msg.room_id),
            attachments=turn.attachments,
        )
        await self.converse(sid, answer, lambda: self.graph.process_message(req), msg.server_ts / 1000)

    async def run_scheduled(
        self,
        *,
        owner: str,
        room_id: str,
        thread_root: str,
        reply_to: str,
        text: str,
        access: AccessResult,
        audience: Audience | None,
        sent_at: float,
    ) -> ScheduledTurn:
        """A scheduled task as a new turn of its `owner` (scheduler.py), answered in
        `thread_root` as a reply to `reply_to` (the "⏰ Scheduled" line). The owner's access
        and the room's audience were just checked afresh by the caller. No flood check: the
        owner sent nothing now, and a job runs at most every SCHEDULE_MIN_INTERVAL_SECONDS.
        A confirmation is asked in the thread and only the owner's answer counts (their
        session). Returns how it ended: the failure the room was shown, if any, and whether
        the graph refused it on the owner's budget (the room saw the usual notice)."""
        sid = SessionId(room_id=room_id, thread_id=thread_root, user_id=owner)
        req = ProcessMessageRequest(
            session_id=sid.format(),
            room_id=room_id,
            user_id=owner,
            message=text,
            context={"event_id": reply_to, "thread_root": thread_root, "scheduled": "true"},
            ac_context=access.ac,  # type: ignore[arg-type]
            audience=audience,
            audience_unchecked=await self.audience_unchecked(room_id),
        )
        failures: list[str] = []
        over_budget = False

        async def stream() -> AsyncIterator[SSEEvent]:
            nonlocal over_budget
            try:
                async for ev in self.graph.process_message(req):
                    if isinstance(ev, ErrorEvent):
                        failures.append(ev.message)
                    elif isinstance(ev, Done) and ev.outcome == "over_budget":
                        over_budget = True
                    yield ev
            except GraphBusy:
                raise  # retried by converse
            except GraphError as exc:
                failures.append(exc.user_message)
                raise

        key = sid.format()
        answering = asyncio.create_task(
            self.converse(sid, self.new_answer(room_id, thread_root, reply_to), stream, sent_at)
        )
        self._scheduled[key] = answering
        try:
            await answering  # cancelled with this task (a shutdown), or alone by `!stop`
        finally:
            self._scheduled.pop(key, None)
            stopped = key in self._stopped
            self._stopped.discard(key)
        return ScheduledTurn(failures[-1] if failures else None, over_budget, stopped)

    def stop_scheduled(self, session_id: str) -> bool:
        """`!stop` by the owner in a scheduled run's thread: its answer stops as a message's
        does ("⏹️ Stopped."). False when no scheduled run answers in that session."""
        answering = self._scheduled.get(session_id)
        if answering is None or answering.done():
            return False
        self._stopped.add(session_id)
        answering.cancel()
        return True

    async def _short_enough(self, text: str, answer: Answer) -> bool:
        if len(text) <= self.settings.MAX_MESSAGE_CHARS:
            return True
        await answer.notice(
            f"✋ That message is too long ({len(text)} characters; "
            f"the limit is {self.settings.MAX_MESSAGE_CHARS}). Please shorten it."
        )
        return False

    async def _take_files(
        self,
        msg: IncomingMessage,
        text: str,
        answer: Answer,
        replied_event: dict[str, Any] | None,
        thread_file: str | None = None,
    ) -> TurnInput | None:
        """The question with its files (a voice message heard); None after one short refusal."""
        if msg.media is None and msg.in_reply_to is None and thread_file is None:
            return TurnInput(text)
        try:
            return await self.files.prepare(msg, text, replied_event, thread_file=thread_file)
        except (MediaRefused, TranscriptionFailed) as exc:
            await self._refuse(msg, answer, exc)
            return None

    async def hear(self, msg: IncomingMessage) -> str | None:
        """A voice message's transcript (it answers the agent's pending question); None after
        one short refusal."""
        if msg.media is None or msg.media.kind != "audio":
            return None
        try:
            return await self.files.hear(msg.media)
        except (MediaRefused, TranscriptionFailed) as exc:
            await self._refuse(msg, self.answer_for(msg), exc)
            return None

    async def _refuse(
        self, msg: IncomingMessage, answer: Answer, exc: MediaRefused | TranscriptionFailed
    ) -> None:
        log.info("file_refused", reason=exc.reason, msgtype=msg.msgtype)
        metrics.EVENTS.labels("file_refused").inc()
        text = exc.user_message
        await answer.notice(text if text[:1] in _EMOJI else f"⚠️ {text}")

    async def _command(self, name: str, sid: SessionId, answer: Answer) -> None:
        if name == "help":
            await answer.notice(
                help_text(
                    self.settings.COMMAND_PREFIX, self.settings.AGENT_ID, self.settings.SCHEDULE_DEFAULT_TZ
                )
            )
        elif name == "reset":
            await self.hitl.drop(sid.format())
            try:
                await self.graph.reset(sid.format())
                await answer.notice("🧹 Done: I forgot this conversation.")
            except GraphError as exc:
                await answer.notice(f"⚠️ {exc.user_message}")
        elif name == "stop":
            await answer.notice("Nothing is running.")

    # ---- the graph's answer --------------------------------------------------------------
    async def converse(self, sid: SessionId, answer: Answer, open_stream: OpenStream, sent_at: float) -> None:
        """Stream one graph run into Matrix; every failure ends in one short message."""
        if sid.thread_id:
            await self.redis.set(redis_keys.bot_thread(sid.room_id, sid.thread_id), "1", ex=THREAD_MARK_TTL)
        answer.start_typing(after_seconds=self.settings.TYPING_DELAY_SECONDS)
        metrics.ACTIVE_RUNS.inc()
        index = TurnIndex(self.traces, answer.sent_event_ids)
        try:
            deadline = time.monotonic() + BUSY_RETRY_SECONDS
            while True:
                try:
                    await self._relay(sid, answer, open_stream(), index)
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
            await index.flush()  # the last messages (an error, "Stopped") belong to the turn too
            if answer.first_reply_at is not None:
                metrics.ANSWER_SECONDS.observe(max(0.0, time.time() - sent_at))

    async def _relay(
        self, sid: SessionId, answer: Answer, events: AsyncIterator[SSEEvent], index: TurnIndex
    ) -> None:
        """`index`: the answer's messages are indexed under the stream's turn as they are sent
        (a 🔍 may come as soon as the answer shows)."""
        images: list[ImageOut] = []
        async for ev in events:
            if isinstance(ev, TurnStarted):
                index.turn_id = ev.turn_id
            elif isinstance(ev, ImageOut):
                images.append(ev)  # posted once the text above them is final
            elif isinstance(ev, TextChunk):
                await answer.chunk(ev.content)
            elif isinstance(ev, Progress):
                await answer.progress(ev.content)
            elif isinstance(ev, TextFinal):
                await answer.final(ev.content)
            elif isinstance(ev, HitlRequest):
                await answer.settle()
                await answer.stop_typing()
                await self._post_images(answer, images)
                qid = await post_question(answer, ev.question, ev.options)
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
                await self.hitl.save(
                    pending, ev.timeout_seconds or self.settings.HITL_DEFAULT_TIMEOUT_SECONDS
                )
                metrics.HITL.labels("asked").inc()
            elif isinstance(ev, ErrorEvent):
                await answer.settle()
                await answer.notice(f"⚠️ {ev.message}")
            await index.flush()
        if images:
            if not answer.finalized:
                await answer.settle()
            await self._post_images(answer, images)

    async def _post_images(self, answer: Answer, images: list[ImageOut]) -> None:
        """Images a tool returned, after the answer text, in its thread or reply chain."""
        for image in images:
            event_id = await post_image(
                self.client,
                answer.room_id,
                image,
                thread_root=answer.thread_root,
                reply_to=answer.reply_to,
                max_bytes=self.settings.ATTACHMENT_MAX_BYTES,
            )
            if event_id is not None:
                answer.sent_event_ids.append(event_id)
        images.clear()
