"""What the graph service runs on, opened once per process: Redis, the checkpointer, the
knowledge stores, the external clients and the compiled graph (the lifespan's resources)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

from vagent_graph.agents.descriptor import AgentDescriptor
from vagent_graph.attachments import ReadLimits
from vagent_graph.knowledge import entity_redis
from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.embeddings import Embedder, make_embedder
from vagent_graph.knowledge.entity_store import EntityStore
from vagent_graph.mcp.limits import McpLimits
from vagent_graph.mcp.servers import McpServers
from vagent_graph.memory.memories import Memories
from vagent_graph.memory.store import MemoryStore
from vagent_graph.models.llm import close_model_client
from vagent_graph.observability import metrics
from vagent_graph.observability.budgets import Budgets
from vagent_graph.observability.usage import Usage
from vagent_graph.services import Services
from vagent_graph.services.credentials import CredentialRegistry
from vagent_graph.services.records import RecordsDb, ensure_records_db
from vagent_graph.services.tickets import TicketService
from vagent_graph.state.checkpointer import open_checkpointer
from vagent_graph.tools import ToolRegistry
from vagent_graph.tools.schedule import Scheduling
from vagent_graph.turn.intake import FileReading
from vagent_graph.turn.outbox import Pacing
from vagent_graph.workflow.graph import Deps, build_graph
from vagent_shared import audit_trail, redis_connect
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.memory import MemoryPolicy
from vagent_shared.settings import GraphSettings


@dataclass
class Resources:
    """Everything the routes need, opened in the lifespan (app.state.resources)."""

    settings: GraphSettings
    redis: Redis
    checkpointer: AsyncShallowRedisSaver
    graph: CompiledStateGraph[Any]
    started: float
    #: What tools (and the admin API) use: the records DB, the document and entity stores.
    services: Services
    #: The agent's MCP servers, kept in the registry (None: the agent lists none).
    mcp: McpServers | None = None

    @property
    def pacing(self) -> Pacing:
        """How a run's stream is written: text flushes and keep-alives."""
        return Pacing(self.settings.SSE_FLUSH_INTERVAL_MS / 1000, self.settings.SSE_KEEPALIVE_SECONDS)

    @property
    def file_reading(self) -> FileReading:
        """How the files users send are read and shown to the model."""
        s = self.settings
        return FileReading(ReadLimits.from_settings(s), s.LLM_VISION, s.ATTACHMENT_MAX_TOKENS)


@asynccontextmanager
async def open_resources(
    settings: GraphSettings,
    agent: AgentDescriptor,
    registry: ToolRegistry,
    chat_model: BaseChatModel,
    label: str,
    embedder: Embedder | None = None,
) -> AsyncIterator[Resources]:
    """Redis, the checkpointer, the knowledge stores and the compiled graph, exactly as the
    service runs them. The embedding model loads on its first use, not here. The entity
    graphs' Redis (ENTITY_REDIS_URL) is not needed to start: while it is away, entity
    lookups say so and everything else goes on. The chat model's HTTP client is closed with
    them: a chat model serves one `open_resources`."""
    ensure_records_db(settings.RECORDS_DB_PATH)
    redis = redis_connect.connect(
        settings.REDIS_URL,
        max_connections=settings.REDIS_MAX_CONNECTIONS,
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
    )
    entities: Redis | None = None
    services: Services | None = None
    mcp: McpServers | None = None
    try:
        saver = await open_checkpointer(redis, settings.CHECKPOINT_TTL_MINUTES)
        entities = entity_redis.connect(settings)
        trail = audit_trail.from_settings(
            settings, "graph", redis, lambda reason: metrics.AUDIT_WRITE_FAILURES.labels(reason).inc()
        )
        embedder = embedder or make_embedder(settings)
        memories = await open_memories(redis, embedder, agent.memory, trail)
        services = Services(
            RecordsDb(settings.RECORDS_DB_PATH),
            DocumentStore(
                redis,
                embedder,
                settings.DOCS_INDEX,
                settings.DOCS_VECTOR_ALGORITHM,
                settings.SEARCH_TOP_K,
            ),
            EntityStore(entities, settings.ENTITY_GRAPH),
            trail,
            *external_clients(settings, redis),
            *([memories] if memories is not None else []),
            Scheduling.from_settings(settings, redis),  # the schedule_task tool's jobs
        )
        trail.start()
        deps = Deps(
            registry=registry,
            agent=agent,
            llm=chat_model,
            model_label=label,
            services=services,
            credential_help=settings.CREDENTIAL_MISSING_HELP,
            personal_results=settings.PERSONAL_RESULTS_IN_GROUPS,
            tool_image_max_bytes=settings.TOOL_IMAGE_MAX_BYTES,
            confirm_max_chars=settings.CONFIRM_MAX_CHARS,
            capture_content=settings.OTEL_CAPTURE_CONTENT,
            vision=settings.LLM_VISION,
            # A hold lapses with the run's timeout: no LLM call outlives its run.
            usage=Usage(redis, Budgets(settings.BUDGETS_FILE), settings.RUN_TIMEOUT_SECONDS),
            memories=memories,
        )
        if agent.mcp_servers:
            mcp = McpServers(
                agent.mcp_servers, registry, settings.MCP_REFRESH_SECONDS, McpLimits.from_settings(settings)
            )
            await mcp.start()
        graph = build_graph(deps, saver)
        yield Resources(settings, redis, saver, graph, time.monotonic(), services, mcp)
    finally:
        if mcp is not None:
            await mcp.aclose()
        await close_services(services)
        if entities is not None:
            await entities.aclose()
        await redis.aclose()
        await close_model_client(chat_model)


async def open_memories(
    redis: Redis, embedder: Embedder, policy: MemoryPolicy, trail: AuditTrail
) -> Memories | None:
    """The memory service when the agent enables memory (its indexes created); None keeps
    memory off entirely: no tool, no recall, no Redis read."""
    if not policy.enabled:
        return None
    store = MemoryStore(redis, embedder)
    await store.setup()
    return Memories(store, policy, Services(trail))


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
    memories = services.find(Memories)
    if memories is not None:  # the store's batching task ends with the service
        await memories.store.aclose()
    registry, tickets = services.find(CredentialRegistry), services.find(TicketService)
    if registry is not None:
        await registry.aclose()
    if tickets is not None:
        await tickets.aclose()
