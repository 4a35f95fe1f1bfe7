"""The gateway's ASGI app: LangGraph's server API (as `langgraph_sdk` 0.4 calls it) in front of
the graph, with the bot's guarantees (docs/gateway.md).

Every API route resolves the caller first (auth.py: 401/403/503). A thread is read only
through its owner: another person's thread answers 404 on every path, exactly like one that
does not exist, so thread ids cannot be probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse
from starlette.types import Message, Send

from vagent_gateway import metrics, translate
from vagent_gateway.auth import Caller, Door
from vagent_gateway.graph_client import GraphClient, GraphError
from vagent_gateway.identity import Identity
from vagent_gateway.middleware import BodyLimit, CountRequests
from vagent_gateway.replicas import RunLeases
from vagent_gateway.runs import Run, Runs, ThreadBusy, TooManyRuns
from vagent_gateway.threads import ThreadExists, ThreadRecord, ThreadStore, metadata_matches, parse_thread_id
from vagent_shared import audit_trail, redis_connect
from vagent_shared.access_provider import AccessProvider
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.flood import FloodControl
from vagent_shared.hitl import normalize_answer
from vagent_shared.http_errors import api_error, install_error_handlers
from vagent_shared.settings import GatewaySettings
from vagent_shared.wire import ErrorResponse, FeedbackRequest, ProcessMessageRequest

log = structlog.get_logger(__name__)

VERSION: Final = "0.1.0"
#: A stream silent this long gets a keep-alive comment (proxies close idle connections).
KEEPALIVE_SECONDS: Final = 15.0
STARTED_AT: Final = datetime.now(UTC).isoformat()


#: What a browser page may send (CORS): the token headers, JSON, and what the LangGraph SDKs
#: add (`Accept`/`Cache-Control` on streams, `Last-Event-ID` when one resumes, `Prefer`), and
#: a browser's own trace context.
CORS_HEADERS: Final = (
    "Authorization",
    "X-Api-Key",
    "Content-Type",
    "Accept",
    "Cache-Control",
    "Last-Event-ID",
    "Prefer",
    "X-Request-Id",
    "traceparent",
    "tracestate",
    "baggage",
)
#: What a page may read of an answer: the SDKs take a run's id from `Content-Location`.
CORS_EXPOSED: Final = ("Content-Location",)
CORS_METHODS: Final = ("GET", "POST", "DELETE", "PATCH", "OPTIONS")


class Cors(CORSMiddleware):
    """Starlette's CORS, but an origin not allowed gets no `Access-Control-*` header at all
    (Starlette tells anyone the allowed methods and headers, and the exposed ones): nothing
    about the API is told to a page that may not use it."""

    def preflight_response(self, request_headers: Headers) -> Response:
        if not self.is_allowed_origin(origin=request_headers["origin"]):
            return PlainTextResponse("Disallowed CORS origin", status_code=400)
        return super().preflight_response(request_headers)

    async def send(self, message: Message, send: Send, request_headers: Headers) -> None:
        origin = request_headers.get("origin")
        if origin is None or self.is_allowed_origin(origin=origin):
            await super().send(message, send, request_headers)
            return
        if message["type"] == "http.response.start":  # a cache must not reuse it for another origin
            message.setdefault("headers", [])
            headers = MutableHeaders(scope=message)
            headers["Vary"] = ", ".join([*headers.getlist("Vary"), "Origin"])
        await send(message)


def add_cors(app: FastAPI, origins: list[str]) -> None:
    """Answer browsers of `origins` (GATEWAY_CORS_ORIGINS; `*`: any), outermost so every answer
    carries the headers, errors too, and a preflight is answered before any route: it needs no
    token and is never audited as a refused one. Never credentials mode: tokens travel in
    headers, not cookies (settings.py says why `*` is safe)."""
    if not origins:
        return
    app.add_middleware(
        Cors,
        allow_origins=["*"] if "*" in origins else origins,
        allow_credentials=False,
        allow_methods=CORS_METHODS,
        allow_headers=CORS_HEADERS,
        expose_headers=CORS_EXPOSED,
        max_age=600,
    )


def proxy_for(url: str) -> str | None:
    """The proxy the environment asks for to reach `url` (None: none set, or NO_PROXY)."""
    if urllib.request.proxy_bypass(urlsplit(url).hostname or ""):
        return None
    return urllib.request.getproxies_environment().get(urlsplit(url).scheme) or None


# ---- request bodies (what langgraph_sdk sends; what it sends beyond is ignored) ---------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ThreadCreate(_Body):
    thread_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] | None = None


class ThreadSearch(_Body):
    metadata: dict[str, Any] | None = None
    ids: list[str] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(default=10, ge=0, le=1000)
    offset: int = Field(default=0, ge=0)


class HistoryRequest(_Body):
    limit: int = Field(default=10, ge=0, le=1000)


class AssistantSearch(_Body):
    graph_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=0, le=1000)
    offset: int = Field(default=0, ge=0)


class RunCommand(_Body):
    resume: Any = None


class RunCreate(_Body):
    assistant_id: str
    input: dict[str, Any] | None = None
    command: RunCommand | None = None
    stream_mode: str | list[str] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    on_disconnect: Literal["cancel", "continue"] = "cancel"
    multitask_strategy: str | None = None


@dataclass
class Gateway:
    """Everything the routes use, built once per process."""

    settings: GatewaySettings
    redis: Redis
    audit: AuditTrail
    access: AccessProvider
    identity: Identity
    door: Door
    flood: FloodControl
    graph: GraphClient
    threads: ThreadStore
    runs: Runs

    @classmethod
    def build(cls, settings: GatewaySettings) -> Gateway:
        redis = redis_connect.connect(
            settings.REDIS_URL,
            max_connections=settings.REDIS_MAX_CONNECTIONS,
            socket_timeout=10,
            socket_connect_timeout=5,
        )
        audit = audit_trail.from_settings(
            settings, "gateway", redis, lambda reason: metrics.AUDIT_FAILURES.labels(reason).inc()
        )
        access = AccessProvider(
            settings.ACCESS_CONTROL_PROVIDER_URL,
            settings.ACP_TIMEOUT_SECONDS,
            settings.AGENT_ID,
            audit=audit,
            metrics=metrics.PROVIDER,
            proxy=proxy_for(settings.ACCESS_CONTROL_PROVIDER_URL),
        )
        identity = Identity(
            settings.MATRIX_HOMESERVER,
            redis,
            settings.GATEWAY_TOKEN_CACHE_SECONDS,
            proxy=proxy_for(settings.MATRIX_HOMESERVER),
        )
        token = settings.GRAPH_API_TOKEN.get_secret_value() if settings.GRAPH_API_TOKEN else None
        threads = ThreadStore(redis)
        return cls(
            settings=settings,
            redis=redis,
            audit=audit,
            access=access,
            identity=identity,
            door=Door(identity, access, audit, settings.GATEWAY_TENANT, settings.AGENT_ID),
            flood=FloodControl(
                redis,
                settings.FLOOD_MAX_MESSAGES,
                settings.FLOOD_WINDOW_SECONDS,
                on_rejected=metrics.FLOOD_REJECTED.inc,
            ),
            graph=GraphClient(
                settings.GRAPH_API_ENDPOINT, token, proxy=proxy_for(settings.GRAPH_API_ENDPOINT)
            ),
            threads=threads,
            runs=Runs(threads, RunLeases(redis, settings.GATEWAY_MAX_STREAMS_PER_USER)),
        )

    async def aclose(self) -> None:
        await self.runs.shutdown()
        await self.audit.aclose()
        for closing in (self.access.aclose(), self.identity.aclose(), self.graph.aclose()):
            with contextlib.suppress(Exception):
                await closing
        await self.redis.aclose()


async def current_caller(request: Request) -> Caller:
    """The route dependency: who calls, allowed to use the agent (else 401/403/503)."""
    gw: Gateway = request.app.state.gateway
    return await gw.door.caller(request)


CallerDep = Annotated[Caller, Depends(current_caller)]


def create_app(settings: GatewaySettings) -> FastAPI:
    gw = Gateway.build(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gw.audit.start()
        gw.runs.start_background()
        yield
        await gw.aclose()

    app = FastAPI(
        title="vagent gateway",
        version=VERSION,
        description="LangGraph's server API in front of vagent (docs/gateway.md).",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.MAX_REQUEST_BYTES)
    app.add_middleware(CountRequests)
    add_cors(app, settings.GATEWAY_CORS_ORIGINS)

    @app.exception_handler(RedisError)
    async def _redis_down(_: Request, exc: RedisError) -> JSONResponse:
        log.error("redis_unavailable", error_type=type(exc).__name__)
        body = ErrorResponse(error_code="redis_unavailable", message="The thread store cannot be reached.")
        return JSONResponse(body.model_dump(), status_code=503)

    agent_id = settings.AGENT_ID

    async def owned(thread_id: str, who: Caller) -> ThreadRecord:
        """The caller's thread, or 404 (also for someone else's: audited, never 403)."""
        record = await gw.threads.get(thread_id, who.user_id)
        if record is not None:
            return record
        canonical = parse_thread_id(thread_id)
        if canonical is not None and await gw.threads.exists(canonical):
            gw.audit.record(
                "access_denied",
                user_id=who.user_id,
                domain=who.tenant,
                resource=f"gateway_thread:{canonical}",
                decision="denied",
                reason="not the thread's owner",
            )
        raise api_error(404, "not_found", f"Thread {thread_id[:64]} not found.")

    # ---- service routes --------------------------------------------------------------------
    @app.get("/ok", include_in_schema=False)
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/health")
    async def health() -> JSONResponse:
        try:
            await asyncio.wait_for(gw.redis.ping(), 2)
            up = True
        except (RedisError, TimeoutError, OSError):
            up = False
        body = {"status": "healthy" if up else "unhealthy", "active_runs": gw.runs.active()}
        return JSONResponse(body, status_code=200 if up else 503)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        metrics.ACTIVE_RUNS.set(gw.runs.active())
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/info")
    async def info() -> dict[str, Any]:
        """What LangGraph clients ask first; open, like LangGraph's own server."""
        return {
            "version": VERSION,
            "langgraph_py_version": None,
            "flags": {"assistants": True, "crons": False, "langsmith": False, "store": False},
        }

    # ---- assistants: the agent, as one assistant -------------------------------------------
    def assistant() -> dict[str, Any]:
        return {
            "assistant_id": agent_id,
            "graph_id": agent_id,
            "config": {},
            "context": {},
            "created_at": STARTED_AT,
            "updated_at": STARTED_AT,
            "metadata": {"created_by": "system"},
            "version": 1,
            "name": agent_id,
            "description": None,
        }

    @app.get("/assistants/{assistant_id}")
    async def get_assistant(assistant_id: str, who: CallerDep) -> dict[str, Any]:
        if assistant_id != agent_id:
            raise api_error(404, "not_found", f"Assistant {assistant_id[:64]} not found.")
        return assistant()

    @app.post("/assistants/search")
    async def search_assistants(body: AssistantSearch, who: CallerDep) -> list[dict[str, Any]]:
        found = [assistant()]
        if body.graph_id not in (None, agent_id) or body.name not in (None, agent_id):
            found = []
        found = [a for a in found if metadata_matches(a["metadata"], body.metadata)]
        return found[body.offset : body.offset + body.limit]

    # ---- threads -----------------------------------------------------------------------------
    def thread_view(record: ThreadRecord) -> dict[str, Any]:
        interrupts = (
            {record.pending.interrupt_id: [translate.interrupt(record.pending)]} if record.pending else {}
        )
        return {
            "thread_id": record.thread_id,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "metadata": record.metadata,
            "status": "busy" if gw.runs.running_on(record.thread_id) else record.status,
            "values": translate.values(record.messages),
            "interrupts": interrupts,
        }

    def state_view(record: ThreadRecord) -> dict[str, Any]:
        pending = record.pending
        interrupts = [translate.interrupt(pending)] if pending else []
        return {
            "values": translate.values(record.messages),
            "next": [translate.NODE] if pending else [],
            "checkpoint": {
                "thread_id": record.thread_id,
                "checkpoint_ns": "",
                "checkpoint_id": record.checkpoint_id,
                "checkpoint_map": None,
            },
            "metadata": {**record.metadata, "step": len(record.messages)},
            "created_at": record.updated_at,
            "parent_checkpoint": None,
            "tasks": [
                {
                    "id": pending.interrupt_id,
                    "name": translate.NODE,
                    "error": None,
                    "interrupts": interrupts,
                    "checkpoint": None,
                    "state": None,
                    "result": None,
                }
            ]
            if pending
            else [],
            "interrupts": interrupts,
        }

    @app.post("/threads")
    async def create_thread(body: ThreadCreate, who: CallerDep) -> dict[str, Any]:
        thread_id: str | None = None
        if body.thread_id is not None:
            thread_id = parse_thread_id(body.thread_id)
            if thread_id is None:
                raise api_error(422, "invalid_thread_id", "thread_id must be a UUID.")
            mine = await gw.threads.get(thread_id, who.user_id)
            if mine is not None and body.if_exists == "do_nothing":
                return thread_view(mine)
        try:
            record = await gw.threads.create(who.user_id, who.tenant, body.metadata, thread_id)
        except ThreadExists:
            raise api_error(409, "thread_exists", "A thread with this id exists.") from None
        log.info("thread_created", user_id=who.user_id, thread_id=record.thread_id)
        return thread_view(record)

    @app.get("/threads/{thread_id}")
    async def get_thread(thread_id: str, who: CallerDep) -> dict[str, Any]:
        return thread_view(await owned(thread_id, who))

    @app.delete("/threads/{thread_id}", status_code=204)
    async def delete_thread(thread_id: str, who: CallerDep) -> Response:
        record = await owned(thread_id, who)
        running = await gw.runs.running_anywhere(record.thread_id, who.user_id)
        if running is not None:
            await gw.runs.cancel_anywhere(running)
        try:
            await gw.graph.reset(record.session.format())
        except GraphError as exc:
            raise api_error(exc.status, exc.code, exc.message) from None
        await gw.threads.delete(record)
        log.info("thread_deleted", user_id=who.user_id, thread_id=record.thread_id)
        return Response(status_code=204)

    @app.post("/threads/search")
    async def search_threads(body: ThreadSearch, who: CallerDep) -> list[dict[str, Any]]:
        found = await gw.threads.search(
            who.user_id,
            metadata=body.metadata,
            status=body.status,
            ids=body.ids,
            limit=body.limit,
            offset=body.offset,
        )
        return [thread_view(r) for r in found]

    @app.get("/threads/{thread_id}/state")
    async def get_state(thread_id: str, who: CallerDep) -> dict[str, Any]:
        return state_view(await owned(thread_id, who))

    @app.post("/threads/{thread_id}/history")
    async def get_history(thread_id: str, body: HistoryRequest, who: CallerDep) -> list[dict[str, Any]]:
        """The current state only: the gateway keeps no earlier checkpoints."""
        record = await owned(thread_id, who)
        return [state_view(record)][: body.limit]

    # ---- runs --------------------------------------------------------------------------------
    async def start_run(thread_id: str, body: RunCreate, who: Caller) -> Run:
        record = await owned(thread_id, who)
        if body.assistant_id != agent_id:
            raise api_error(404, "not_found", f"Assistant {body.assistant_id[:64]} not found.")
        sid = record.session
        human: dict[str, Any] | None = None
        answer: str | None = None
        pending = record.pending
        if body.command is not None and body.command.resume is not None:
            if pending is None:
                raise api_error(409, "no_pending_question", "Nothing in this thread waits for an answer.")
            try:
                answer = translate.resume_answer(body.command.resume, pending.options)
            except translate.BadResume as exc:
                raise api_error(422, "invalid_resume", str(exc)) from None
        else:
            text = translate.last_human_text(body.input)
            if text is None or not text.strip():
                raise api_error(422, "empty_message", "input.messages needs a human message with text.")
            if len(text) > settings.MAX_MESSAGE_CHARS:
                raise api_error(
                    422,
                    "message_too_long",
                    f"The message is longer than {settings.MAX_MESSAGE_CHARS} characters.",
                )
            human = translate.human_message(text, f"msg-{time.time_ns()}")
            if pending is not None:
                answer = normalize_answer(text, pending.options)
            if answer is None and not await gw.flood.allow(who.user_id, room_id=sid.room_id):
                metrics.LIMITED.labels("flood").inc()
                raise api_error(
                    429, "flood_limited", "You're sending messages too fast. Please wait a moment."
                )
        try:
            run = await gw.runs.reserve(record, agent_id, body.metadata)
        except ThreadBusy:
            metrics.LIMITED.labels("thread_busy").inc()
            raise api_error(409, "thread_busy", "A run of this thread is in progress.") from None
        except TooManyRuns:
            metrics.LIMITED.labels("streams").inc()
            raise api_error(429, "too_many_runs", "Too many runs at once. Wait for one to finish.") from None
        try:
            if answer is not None and pending is not None:
                gw.audit.record(
                    "hitl_decision",
                    user_id=who.user_id,
                    session_id=sid.format(),
                    domain=who.tenant,
                    resource=f"question:{pending.interrupt_id}",
                    decision="approved" if answer == "yes" else "declined" if answer == "no" else "answered",
                    metadata={"option": answer} if pending.options else {},
                    arguments=None if pending.options else {"answer": answer},
                )
                feedback = FeedbackRequest(
                    session_id=sid.format(),
                    response=answer,
                    interrupt_id=pending.interrupt_id,
                    ac_context=who.ac,
                )
                gw.runs.start(run, record, lambda: gw.graph.submit_feedback(feedback), human)
            else:
                assert human is not None
                message = ProcessMessageRequest(
                    session_id=sid.format(),
                    room_id=sid.room_id,
                    user_id=who.user_id,
                    message=human["content"],
                    context={"gateway_run": run.run_id},
                    ac_context=who.ac,
                )
                gw.runs.start(run, record, lambda: gw.graph.process_message(message), human)
        except BaseException:
            await gw.runs.abandon(run)  # never started: it must not keep counting
            raise
        span = trace.get_current_span()  # the request's server span, when tracing is on
        span.set_attribute("vagent.gateway.thread_id", run.thread_id)
        span.set_attribute("vagent.gateway.run_id", run.run_id)
        try:
            await run.started
        except GraphError as exc:
            code = "thread_busy" if exc.code == "session_busy" else exc.code
            raise api_error(exc.status, code, exc.message) from None
        return run

    def run_headers(run: Run) -> dict[str, str]:
        return {"Content-Location": f"/threads/{run.thread_id}/runs/{run.run_id}"}

    async def frames(run: Run, modes: set[str], on_disconnect: str) -> AsyncIterator[bytes]:
        meta = translate.chunk_metadata(run.run_id, run.thread_id, run.assistant_id)
        finished = False
        try:
            yield translate.sse_frame("metadata", {"run_id": run.run_id, "attempt": 1})
            while True:
                try:
                    item = await asyncio.wait_for(run.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if item is None:
                    break
                kind, data = item
                if kind == "chunk" and "messages-tuple" in modes:
                    yield translate.sse_frame(
                        "messages", [translate.ai_chunk(data["text"], data["id"]), meta]
                    )
                elif kind in ("values", "updates") and kind in modes:
                    yield translate.sse_frame(kind, data)
                elif kind == "error":
                    yield translate.sse_frame("error", data)
            finished = True
            yield translate.sse_frame("end", {"run_id": run.run_id, "status": run.status})
        finally:
            if not finished and on_disconnect == "cancel":
                await gw.runs.cancel(run)

    @app.post("/threads/{thread_id}/runs/stream")
    async def stream_run(thread_id: str, body: RunCreate, who: CallerDep) -> StreamingResponse:
        run = await start_run(thread_id, body, who)
        return StreamingResponse(
            frames(run, translate.modes(body.stream_mode), body.on_disconnect),
            media_type="text/event-stream",
            headers={**run_headers(run), "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.post("/threads/{thread_id}/runs/wait")
    async def wait_run(thread_id: str, body: RunCreate, who: CallerDep) -> JSONResponse:
        run = await start_run(thread_id, body, who)
        assert run.task is not None
        try:
            await asyncio.shield(run.task)
        except asyncio.CancelledError:
            if body.on_disconnect == "cancel":
                await gw.runs.cancel(run)
            raise
        result: dict[str, Any] = dict(run.final_values)
        if run.status == "error" and run.error is not None:
            result["__error__"] = run.error
        return JSONResponse(result, headers=run_headers(run))

    @app.post("/threads/{thread_id}/runs/{run_id}/cancel", status_code=204)
    async def cancel_run(thread_id: str, run_id: str, who: CallerDep) -> Response:
        record = await owned(thread_id, who)
        ref = await gw.runs.find(run_id, who.user_id)  # on this replica or another one
        if ref is None or ref.thread_id != record.thread_id:
            raise api_error(404, "not_found", f"Run {run_id[:64]} not found.")
        await gw.runs.cancel_anywhere(ref)
        log.info("run_cancelled", user_id=who.user_id, thread_id=record.thread_id, run_id=run_id)
        return Response(status_code=204)

    app.state.gateway = gw
    return app
