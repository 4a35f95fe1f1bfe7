"""The graph service: FastAPI + SSE around the compiled workflow. The routes live in
module-level routers (api.py: the bot's API; admin.py: ingestion; here: health and metrics);
the resources they share are opened in the lifespan (resources.py)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from langchain_core.language_models import BaseChatModel
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vagent_graph.agents.descriptor import AgentDescriptor, load_descriptor
from vagent_graph.http import admin, api
from vagent_graph.http.api import ResourcesDep
from vagent_graph.http.middleware import ADMIN_PREFIX, API_PREFIX, RequestMiddleware, files_body_limit
from vagent_graph.knowledge.embeddings import make_embedder
from vagent_graph.knowledge.entity_store import EntityStore
from vagent_graph.models.llm import make_chat_model, model_name
from vagent_graph.models.offline_model import OfflineChatModel
from vagent_graph.observability import metrics
from vagent_graph.resources import open_resources
from vagent_graph.tools import ToolRegistry
from vagent_graph.tools.catalogue import default_registry
from vagent_shared.http_errors import install_error_handlers
from vagent_shared.settings import GraphSettings
from vagent_shared.wire import HealthResponse

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


#: Probes and scraping: no token (the bot's and Kubernetes' health checks, Prometheus).
service_router = APIRouter()


#: How long /health waits for each Redis to answer.
HEALTH_TIMEOUT_S = 2.0


async def _answers(check: Awaitable[object]) -> bool:
    """Whether `check` comes back true within HEALTH_TIMEOUT_S (an error is a no)."""
    try:
        return bool(await asyncio.wait_for(check, timeout=HEALTH_TIMEOUT_S))
    except Exception:
        return False


@service_router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
async def health(resources: ResourcesDep) -> JSONResponse:
    """503 only without the main Redis (checkpoints, locks, confirmations): no conversation
    can go on then. The entity Redis is reported beside it and never fails the probe: without
    it only entity lookups stop, and a restart of this service would not bring it back."""
    store = resources.services.find(EntityStore)
    ok, entities = await asyncio.gather(
        _answers(resources.redis.ping()),  # type: ignore[arg-type]
        _answers(store.available()) if store is not None else asyncio.sleep(0, False),
    )
    body = HealthResponse(
        status="healthy" if ok else "unhealthy",
        active_sessions=int(metrics.ACTIVE_RUNS._value.get()),
        uptime_seconds=round(time.monotonic() - resources.started, 3),
        mcp_servers=resources.mcp.status() if resources.mcp is not None else {},
        entities="available" if entities else "unavailable",
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@service_router.get("/metrics", include_in_schema=False)
async def prometheus() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


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

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_resources(settings, agent, registry, chat_model, label, embedder) as resources:
            app.state.resources = resources
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
        files_max_bytes=files_body_limit(
            settings.MAX_REQUEST_BYTES, settings.ATTACHMENT_MAX_BYTES, settings.ATTACHMENT_MAX_PER_TURN
        ),
    )
    app.include_router(api.router)
    app.include_router(admin.router)
    app.include_router(service_router)
    install_error_handlers(app)
    document_token(app)
    return app
