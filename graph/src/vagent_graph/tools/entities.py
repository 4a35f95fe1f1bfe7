"""`lookup_entities`: people, teams, projects... and how they relate, from the knowledge graph,
limited to what everyone who reads the answer may see.

The filter is pushed into the graph queries (entity_store.py), so this tool only formats the
allowed subgraph it gets back. Its words never name anything the readers may not see: an
empty answer uses the same sentence whether nothing matches or nothing may be seen, and a
path through a forbidden entity simply does not exist in what comes back.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from pydantic import BaseModel, Field

from vagent_graph.knowledge.entities import Entity, EntityLookup
from vagent_graph.knowledge.entity_store import EntityStore
from vagent_graph.knowledge.readers import ENTITY_KINDS, readers_for
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import current_turn
from vagent_graph.services import ServiceUnavailable
from vagent_graph.services.audit import audit
from vagent_graph.tools.base import Tool, ToolContext, ToolResult
from vagent_shared.readers import EntityRef, Readership, ResultScope
from vagent_shared.traces import SourceTrace

log = structlog.get_logger(__name__)

NAME = "lookup_entities"
NOTHING = "No matching entities that you (and everyone in this room) may see."
UNAVAILABLE = "Entity lookup is unavailable right now (the knowledge graph is not reachable). Try later."
MAX_DESCRIPTION_CHARS = 300


class LookupEntitiesArgs(BaseModel):
    query: str = Field(
        min_length=1,
        max_length=200,
        description="A name (or part of one) or an exact id of a person, team, project, customer...",
    )
    depth: int = Field(
        default=1,
        ge=1,
        le=2,
        description="How far to follow relations: 1 = direct relations, 2 = also their relations.",
    )


def _describe(e: Entity) -> str:
    line = f"- {e.name} ({e.entity_type}, id {e.id})"
    if e.tags:
        line += f" [{', '.join(e.tags)}]"
    if e.description:
        text = " ".join(e.description.split())
        if len(text) > MAX_DESCRIPTION_CHARS:
            text = text[: MAX_DESCRIPTION_CHARS - 1].rstrip() + "…"
        line += f": {text}"
    return line


def format_lookup(found: EntityLookup) -> str:
    """The allowed subgraph as compact text: matches with descriptions, then relation lines
    `A —TYPE→ B` (ids in brackets, as names need not be unique), then the related entities."""
    if not found.matches:
        return NOTHING
    names = {e.id: e.name for e in [*found.matches, *found.neighbours]}
    parts = ["Matching entities:", *(_describe(e) for e in found.matches)]
    if found.relations:
        parts.append("Relations:")
        parts += [
            f"- {names[r.source]} [{r.source}] —{r.type}→ {names[r.target]} [{r.target}]"
            for r in found.relations
        ]
    if found.neighbours:
        parts.append("Related entities:")
        parts += [_describe(e) for e in found.neighbours]
    if found.truncated:
        parts.append("(More results exist; ask a narrower question to see them.)")
    return "\n".join(parts)


def audit_lookup(ctx: ToolContext, args: LookupEntitiesArgs, outcome: str, counts: dict[str, Any]) -> None:
    """An entity_query audit record: the counts, never the entities found."""
    audit(
        ctx.services,
        "entity_query",
        ctx.ac,
        ctx.session_id,
        resource=f"tool:{NAME}",
        decision="denied" if outcome == "nothing_readable" else "allowed",
        reason=outcome,
        metadata=counts,
        arguments=args.model_dump(),
    )


def scope_of_lookup(found: EntityLookup, domain: str) -> ResultScope:
    """The entities the answer shows, with what decides who may see them."""
    shown = {
        e.id: EntityRef(id=e.id, entity_type=e.entity_type, tags=tuple(e.tags))
        for e in [*found.matches, *found.neighbours]
    }
    return ResultScope(domain=domain, entities=tuple(shown.values()))


async def _lookup(args: LookupEntitiesArgs, ctx: ToolContext, _: str | None) -> str | ToolResult:
    readers = readers_for(ctx.ac, ctx.audience, ENTITY_KINDS)
    if readers is None:
        audit_lookup(ctx, args, "nothing_readable", {"readers": 0, "results": 0})
        metrics.KNOWLEDGE_QUERIES.labels(NAME, "nothing_readable").inc()
        return NOTHING
    start = time.perf_counter()
    try:
        found = await ctx.services.get(EntityStore).lookup(readers, args.query, depth=args.depth)
    except ServiceUnavailable as exc:
        log.error("entity_lookup_unavailable", reason=str(exc))
        metrics.KNOWLEDGE_QUERIES.labels(NAME, "unavailable").inc()
        return UNAVAILABLE
    except Exception as exc:  # Redis down, module missing, a timeout: the answer goes on without
        log.error("entity_lookup_failed", error_type=type(exc).__name__)
        metrics.KNOWLEDGE_QUERIES.labels(NAME, "unavailable").inc()
        return UNAVAILABLE
    metrics.KNOWLEDGE_SECONDS.labels(NAME).observe(time.perf_counter() - start)
    metrics.KNOWLEDGE_QUERIES.labels(NAME, "found" if found.matches else "empty").inc()
    counts = {
        "readers": len(readers.grants),
        "audience": len(ctx.audience.members) if ctx.audience else 0,
        "public_only": readers.public_only,
        "results": len(found.matches),
        "relations": len(found.relations),
    }
    audit_lookup(ctx, args, "found" if found.matches else "empty", counts)
    scope = scope_of_lookup(found, readers.domain)
    trace_entities(found, scope, ctx)
    return ToolResult(format_lookup(found), scope=scope)


def trace_entities(found: EntityLookup, scope: ResultScope, ctx: ToolContext) -> None:
    """The turn's trace names the entities shown (all visible to the asker: the lookup was
    filtered), each with what decides who may see it (judged by the 🔍 account when asked)."""
    turn = current_turn()
    if turn is None:
        return
    names = {e.id: e.name for e in [*found.matches, *found.neighbours]}
    room = Readership(ctx.ac, ctx.audience)
    for ref in scope.entities:
        its = ResultScope(domain=scope.domain, entities=(ref,))
        turn.source(
            SourceTrace(
                kind="entity", id=ref.id, title=names[ref.id], room_may_see=room.may_read(its), scope=its
            )
        )


TOOL = Tool(
    name=NAME,
    description=(
        "Look up people, teams, projects, products and customers in the organisation's knowledge "
        "graph by name or id, with how they are related (who works on, leads or is a customer of "
        "what). Shows only what everyone reading the answer may see."
    ),
    args_model=LookupEntitiesArgs,
    run=_lookup,
)
