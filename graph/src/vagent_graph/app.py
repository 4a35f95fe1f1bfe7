"""HTTP API of the graph service: FastAPI + SSE around the compiled workflow."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.asyncio import Redis
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from vagent_graph import admin, metrics
from vagent_graph.agent import AgentDescriptor, load_descriptor
from vagent_graph.credentials import CredentialRegistry
from vagent_graph.hitl import CANCEL_RESUME
from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.embeddings import Embedder, make_embedder
from vagent_graph.knowledge.entity_store import EntityStore
from vagent_graph.llm import make_chat_model, model_name
from vagent_graph.middleware import ADMIN_PREFIX, API_PREFIX, RequestMiddleware
from vagent_graph.offline_model import OfflineChatModel
from vagent_graph.outbox import Pacing
from vagent_graph.runner import Run, durability_for
from vagent_graph.session_lock import SessionBusy, SessionLock
from vagent_graph.storage import CachingRedisSerializer, end_of_run
from vagent_graph.tools import Services, ToolRegistry, default_registry
from vagent_graph.tools.records import RecordsDb, ensure_records_db
from vagent_graph.tools.tickets import TicketService
from vagent_graph.workflow import Deps, build_graph, new_turn_input
from vagent_shared import audit_trail, redis_connect
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.events import Done, ErrorEvent, HitlRequest, SSEEvent, TextFinal
from vagent_shared.http_errors import api_error, install_error_handlers
from vagent_shared.knowledge import Audience
from vagent_shared.settings import GraphSettings
from vagent_shared.wire import (
    ErrorResponse,
    FeedbackAck,
    FeedbackRequest,
    HealthResponse,
    ProcessMessageRequest,
    ResetRequest,
)

log = structlog.get_logger(__name__)


class InsecureConfigError(RuntimeError):
    """Raised at startup when the API would be open to anyone."""


def check_security(settings: GraphSettings) -> None:
    token = settings.GRAPH_API_TOKEN.get_secret_value() if settings.GRAPH_API_TOKEN else ""
    if not token and not settings.GRAPH_INSECURE_DEV:
        raise InsecureConfigError(
            "GRAPH_API_TOKEN is not set. The graph trusts the AcContext in each request, so "
            "an open API would let anyone act as a superuser. Set GRAPH_API_TOKEN, or "
            "GRAPH_INSECURE_DEV=true for local development only."
        )


@dataclass
class Runtime:
    """Everything the routes need, built in the lifespan."""

    settings: GraphSettings
    redis: Redis
    checkpointer: AsyncShallowRedisSaver
    graph: CompiledStateGraph[Any]
    started: float
    #: What tools (and the admin API) use: the records DB, the document and entity stores.
    services: Services


#: What the streaming routes answer instead of a stream (all with an ErrorResponse body).
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (401, 409, 413, 422, 503)
}


def run_config(session_id: str, audience: Audience | None = None) -> RunnableConfig:
    """A session's run: its LangGraph thread, who else reads the answer, and a bound on the
    steps of one run. The audience travels in the config, not the state, so no checkpoint
    keeps other people's ids or roles (it is sent again with every request, answers too)."""
    return {"configurable": {"thread_id": session_id, "audience": audience}, "recursion_limit": 100}


@asynccontextmanager
async def open_runtime(
    settings: GraphSettings,
    agent: AgentDescriptor,
    registry: ToolRegistry,
    chat_model: BaseChatModel,
    label: str,
    embedder: Embedder | None = None,
) -> AsyncIterator[Runtime]:
    """Redis, the checkpointer, the knowledge stores and the compiled graph, exactly as the
    service runs them. The embedding model loads on its first use, not here."""
    ensure_records_db(settings.RECORDS_DB_PATH)
    redis = redis_connect.connect(
        settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30
    )
    services: Services | None = None
    try:
        saver = AsyncShallowRedisSaver(
            redis_client=redis,
            ttl={"default_ttl": settings.CHECKPOINT_TTL_MINUTES, "refresh_on_read": True},
        )
        saver.serde = CachingRedisSerializer()
        await saver.asetup()
        trail = audit_trail.from_settings(
            settings, "graph", redis, lambda reason: metrics.AUDIT_WRITE_FAILURES.labels(reason).inc()
        )
        services = Services(
            RecordsDb(settings.RECORDS_DB_PATH),
            DocumentStore(
                redis,
                embedder or make_embedder(settings),
                settings.DOCS_INDEX,
                settings.DOCS_VECTOR_ALGORITHM,
                settings.SEARCH_TOP_K,
            ),
            EntityStore(redis, settings.ENTITY_GRAPH),
            trail,
            *external_clients(settings, redis),
        )
        trail.start()
        deps = Deps(
            registry=registry,
            agent=agent,
            llm=chat_model,
            model_label=label,
            services=services,
            credential_help=settings.CREDENTIAL_MISSING_HELP,
        )
        yield Runtime(settings, redis, saver, build_graph(deps, saver), time.monotonic(), services)
    finally:
        await close_services(services)
        await redis.aclose()


def external_clients(settings: GraphSettings, redis: Redis) -> list[object]:
    """The clients of the external systems that are configured."""
    found: list[object] = []
    registry = CredentialRegistry.from_settings(settings, redis)
    if registry is not None:
        found.append(registry)
    if settings.TICKETS_URL:
        found.append(TicketService(settings.TICKETS_URL))
    return found


async def close_services(services: Services | None) -> None:
    if services is None:
        return
    trail = services.find(AuditTrail)
    if trail is not None:
        await trail.aclose()
    registry, tickets = services.find(CredentialRegistry), services.find(TicketService)
    if registry is not None:
        await registry.aclose()
    if tickets is not None:
        await tickets.aclose()


#: The youngest generation is collected after this many allocations (CPython: 700), the
#: older ones after 50 and 100 collections of the one below (CPython: 10 and 10).
GC_THRESHOLDS = (20_000, 50, 100)


def tune_gc() -> None:
    """Once started: keep what lives as long as the process (modules, the compiled graph,
    schemas) out of the collector's scans, and collect less often. A run allocates tens of
    thousands of short-lived objects; with CPython's defaults the collector took a large
    share of the CPU at 20 concurrent streams (bench-graph: about 30% more requests/s)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def document_token(app: FastAPI) -> None:
    """Show in the OpenAPI page that every `/api/` route needs the service token (checked
    by RequestMiddleware, not by a FastAPI dependency: no route can be added without it)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            schema.setdefault("components", {})["securitySchemes"] = {
                "GraphApiToken": {"type": "http", "scheme": "bearer", "description": "GRAPH_API_TOKEN"},
                "GraphAdminToken": {"type": "http", "scheme": "bearer", "description": "GRAPH_ADMIN_TOKEN"},
            }
            for path, operations in schema["paths"].items():
                scheme = "GraphApiToken" if path.startswith(API_PREFIX) else "GraphAdminToken"
                if path.startswith((API_PREFIX, ADMIN_PREFIX)):
                    for operation in operations.values():
                        operation["security"] = [{scheme: []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(
    settings: GraphSettings | None = None,
    *,
    llm: BaseChatModel | None = None,
    agent: AgentDescriptor | None = None,
    registry: ToolRegistry | None = None,
) -> FastAPI:
    """Build the service. Refuses (InsecureConfigError) to run without a token."""
    settings = settings or GraphSettings()
    check_security(settings)
    agent = agent or load_descriptor(settings.AGENT_DESCRIPTOR)
    registry = registry or default_registry()
    unknown = [t for t in agent.tools if t not in registry]
    if unknown:
        raise ValueError(f"agent {agent.id!r} enables unknown tools: {unknown}")
    chat_model = llm or make_chat_model(settings, agent)
    embedder = make_embedder(settings)  # a bad EMBEDDINGS_* setting fails here, at start
    label = chat_model.model_name if isinstance(chat_model, OfflineChatModel) else model_name(settings, agent)
    token = settings.GRAPH_API_TOKEN.get_secret_value() if settings.GRAPH_API_TOKEN else ""
    pacing = Pacing(settings.SSE_FLUSH_INTERVAL_MS / 1000, settings.SSE_KEEPALIVE_SECONDS)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_runtime(settings, agent, registry, chat_model, label, embedder) as runtime:
            app.state.rt = runtime
            tune_gc()
            log.info(
                "graph_started",
                agent=agent.id,
                model=label,
                tools=registry.names(),
                port=settings.HTTP_PORT,
                insecure_dev=not token,
            )
            yield

    app = FastAPI(
        title="vagent graph service",
        version="0.1.0",
        description="LangGraph workflow behind HTTP + Server-Sent Events. Every `/api/` route "
        "needs `Authorization: Bearer $GRAPH_API_TOKEN`.",
        lifespan=lifespan,
    )
    app.add_middleware(
        RequestMiddleware,
        max_bytes=settings.MAX_REQUEST_BYTES,
        token=token,
        admin_max_bytes=settings.MAX_INGEST_BYTES,
    )
    app.include_router(admin.router)
    document_token(app)

    def rt(request: Request) -> Runtime:
        return request.app.state.rt  # type: ignore[no-any-return]

    install_error_handlers(app)

    async def acquire(r: Runtime, session_id: str) -> SessionLock:
        """The session lock (one run per session across replicas), or a clear 409/503."""
        try:
            return await SessionLock.acquire(r.redis, session_id, r.settings.RUN_TIMEOUT_SECONDS + 60)
        except SessionBusy:
            raise api_error(
                409, "session_busy", "This session is already answering another message."
            ) from None
        except Exception as exc:
            log.error("redis_unavailable", error=str(exc))
            raise api_error(503, "redis_unavailable", "The session store is not reachable.") from exc

    async def end_run(lock: SessionLock, outcome: SSEEvent | None) -> None:
        """After a run: bound the session's Redis bytes, remember whether a question waits,
        unlock (storage.end_of_run, one round trip). Never fails the request."""
        r: Runtime = app.state.rt
        waits = None if outcome is None else isinstance(outcome, HitlRequest)
        try:
            await end_of_run(r.redis, r.checkpointer, lock, waits, r.settings.CHECKPOINT_TTL_MINUTES * 60)
        except Exception as exc:  # Redis gone: the lock's TTL cleans up
            log.warning("end_of_run_failed", error_type=type(exc).__name__)

    async def release(lock: SessionLock) -> None:
        try:
            await lock.release()
        except Exception as exc:  # Redis gone: the lock's TTL cleans up
            log.debug("lock_release_failed", error_type=type(exc).__name__)

    def sse(endpoint: str, session_id: str, lock: SessionLock, run: Run) -> EventSourceResponse:
        start = time.perf_counter()
        batches = run.batches()
        outcome: SSEEvent | None = None
        finished = False
        events = writes = 0

        async def finish() -> None:
            """Stop the run, remember how it ended, unlock: exactly once. From the stream's
            end, or (as the response's background task) when the stream never started."""
            nonlocal finished
            if finished:
                return
            finished = True
            # A disconnect cancels the stream: the run must be stopped and the session
            # unlocked even so, hence the shield (anyio re-cancels every await).
            with anyio.CancelScope(shield=True):
                await batches.aclose()
                await run.close()  # also when the stream never started
                await end_run(lock, outcome)
            metrics.REQUEST_SECONDS.labels(endpoint).observe(time.perf_counter() - start)
            log.info(
                "stream_closed",
                endpoint=endpoint,
                session_id=session_id,
                seconds=round(time.perf_counter() - start, 4),
                events=events,
                writes=writes,
            )

        async def gen() -> AsyncIterator[ServerSentEvent | bytes]:
            nonlocal outcome, events, writes
            with structlog.contextvars.bound_contextvars(session_id=session_id):
                try:
                    async for batch in batches:
                        if not batch:  # nothing to say for a while: keep proxies from timing out
                            yield b": keep-alive\r\n\r\n"
                            continue
                        for ev in batch:
                            if isinstance(ev, HitlRequest | TextFinal):
                                outcome = ev
                        first_at = 0.0 if writes else time.perf_counter()
                        events, writes = events + len(batch), writes + 1
                        # One write per batch; every event keeps its own SSE frame.
                        yield b"".join(
                            ServerSentEvent(event=ev.EVENT, data=ev.sse_data()).encode() for ev in batch
                        )
                        if first_at:  # observed once the first write is out, not before it
                            metrics.FIRST_EVENT_SECONDS.labels(endpoint).observe(first_at - start)
                    events, writes = events + 1, writes + 1
                    yield ServerSentEvent(event=Done.EVENT, data=Done().sse_data())
                finally:
                    await finish()

        return EventSourceResponse(
            gen(),
            ping=0,  # keep-alive comes from the stream itself (Outbox): one task less per stream
            headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
            background=BackgroundTask(finish),
        )

    async def close_stale_question(r: Runtime, session_id: str) -> None:
        """A new message while a question is pending: the question expired on the bot side."""
        cfg = run_config(session_id)
        state = await r.graph.aget_state(cfg)
        if not state.interrupts:
            return
        log.info("hitl_expired", interrupt_ids=[i.id for i in state.interrupts])
        metrics.HITL_RESUMES.labels("expired").inc()
        cancel: Command[Any] = Command(resume=CANCEL_RESUME)
        async for _ in r.graph.astream(cancel, cfg, stream_mode="updates", durability=durability_for(cancel)):
            pass

    @app.post(
        "/api/v1/process_message",
        response_class=EventSourceResponse,
        responses={
            200: {
                "content": {"text/event-stream": {}},
                "description": "SSE: text_chunk/progress/hitl_request/"
                "text_final/error, always ending with done",
            },
            **_ERRORS,
        },
    )
    async def process_message(body: ProcessMessageRequest, request: Request) -> EventSourceResponse:
        """Answer one user message as a stream of Server-Sent Events."""
        r = rt(request)
        structlog.contextvars.bind_contextvars(session_id=body.session_id)
        if not body.message.strip():
            raise api_error(422, "empty_message", "message: must not be empty.")
        if len(body.message) > r.settings.MAX_MESSAGE_CHARS:
            raise api_error(
                422, "message_too_long", f"message: longer than {r.settings.MAX_MESSAGE_CHARS} characters."
            )
        log.debug("process_message", user_id=body.user_id, chars=len(body.message))
        sid = body.session_id

        lock = await acquire(r, sid)

        async def close_stale() -> None:
            await close_stale_question(r, sid)

        run = Run(
            r.graph,
            new_turn_input(body.message, body.ac_context),
            run_config(sid, body.audience),
            r.settings.RUN_TIMEOUT_SECONDS,
            prelude=close_stale if lock.question_may_be_pending else None,
            pacing=pacing,
        )
        return sse("process_message", sid, lock, run)

    @app.post(
        "/api/v1/submit_feedback",
        response_model=None,
        responses={
            200: {
                "content": {
                    "text/event-stream": {},
                    "application/json": {"schema": FeedbackAck.model_json_schema()},
                },
                "description": "SSE like process_message, or a JSON ack when "
                "the client accepts only application/json",
            },
            **_ERRORS,
        },
    )
    async def submit_feedback(body: FeedbackRequest, request: Request) -> Response:
        """Resume the session's paused workflow with the human's answer."""
        r = rt(request)
        structlog.contextvars.bind_contextvars(session_id=body.session_id)
        lock = await acquire(r, body.session_id)
        try:
            state = await r.graph.aget_state(run_config(body.session_id))
        except Exception:
            await release(lock)
            raise
        pending = {i.id for i in state.interrupts}
        if not pending:
            await release(lock)
            raise api_error(409, "no_pending_question", "Nothing is waiting for an answer in this session.")
        if body.interrupt_id and body.interrupt_id not in pending:
            await release(lock)
            raise api_error(409, "stale_question", "That question is no longer pending.")
        metrics.HITL_RESUMES.labels("answered").inc()
        log.info("submit_feedback", chars=len(body.response))
        update: dict[str, Any] = {}
        if body.ac_context:
            update["ac_context"] = body.ac_context.to_wire()
        command: Command[Any] = Command(resume=body.response, update=update or None)
        cfg = run_config(body.session_id, body.audience)

        run = Run(r.graph, command, cfg, r.settings.RUN_TIMEOUT_SECONDS, pacing=pacing)
        accept = request.headers.get("accept", "")
        if "application/json" in accept and "text/event-stream" not in accept:
            batches = run.batches()
            collected: list[SSEEvent] = []
            try:
                async for batch in batches:
                    collected += batch
            finally:
                await batches.aclose()
                await run.close()
                last = next((e for e in reversed(collected) if isinstance(e, HitlRequest | TextFinal)), None)
                await end_run(lock, last)
            return JSONResponse(_ack(collected).model_dump())
        return sse("submit_feedback", body.session_id, lock, run)

    @app.post(
        "/api/v1/reset_session",
        response_model=FeedbackAck,
        responses={401: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
    )
    async def reset_session(body: ResetRequest, request: Request) -> FeedbackAck:
        """Forget the session's conversation and any pending question (`!reset`)."""
        r = rt(request)
        structlog.contextvars.bind_contextvars(session_id=body.session_id)
        lock = await acquire(r, body.session_id)
        try:
            await r.checkpointer.adelete_thread(body.session_id)
        finally:
            await release(lock)
        log.info("session_reset")
        return FeedbackAck(success=True, message="The conversation was forgotten.")

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health(request: Request) -> JSONResponse:
        r = rt(request)
        ok = True
        try:
            await asyncio.wait_for(r.redis.ping(), timeout=2)  # type: ignore[misc]
        except Exception:
            ok = False
        body = HealthResponse(
            status="healthy" if ok else "unhealthy",
            active_sessions=int(metrics.ACTIVE_RUNS._value.get()),
            uptime_seconds=round(time.monotonic() - r.started, 3),
        )
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def _ack(events: list[SSEEvent]) -> FeedbackAck:
    for ev in events:
        if isinstance(ev, ErrorEvent):
            return FeedbackAck(success=False, message=ev.message)
        if isinstance(ev, HitlRequest):
            return FeedbackAck(success=True, message=ev.question)
        if isinstance(ev, TextFinal):
            return FeedbackAck(success=True, message=ev.content)
    return FeedbackAck(success=True, message="")
