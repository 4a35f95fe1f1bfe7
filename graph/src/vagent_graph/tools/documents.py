"""`search_documents`: hybrid search over the documents everyone who reads the answer may read.

The filter comes from the AcContext (and the room's audience) exactly as designed
(docs/knowledge.md) and is pushed into the Redis query; this tool only formats what comes
back. Its words never name a document the readers may not read: a search that finds
nothing says so in the same words whether nothing matches or nothing is readable.
"""

from __future__ import annotations

import time

import structlog
from pydantic import BaseModel, Field

from vagent_graph.knowledge.citations import number_of
from vagent_graph.knowledge.doc_index import IndexMismatch
from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.readers import DOCUMENT_KINDS, readers_for
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import current_turn
from vagent_graph.observability.spans import results, retrieval_span
from vagent_graph.services import ServiceUnavailable
from vagent_graph.services.audit import audit
from vagent_graph.tools.base import Tool, ToolContext, ToolResult
from vagent_shared.knowledge import SearchHit, SourceRef
from vagent_shared.readers import DocRef, Readership, ResultScope
from vagent_shared.traces import SourceTrace

log = structlog.get_logger(__name__)

NAME = "search_documents"
UNAVAILABLE = "Document search is not available right now. Answer without it and say so."
ROOM_NOTE = "Only documents that everyone in this room may read were searched."


class SearchDocumentsArgs(BaseModel):
    query: str = Field(
        min_length=1,
        max_length=500,
        description="What to look for: a question, key words, or an exact name or code.",
    )


def within(title: str, section: str) -> str:
    """The section path without the title it usually starts with (a document's first heading)."""
    if section == title:
        return ""
    return section.removeprefix(f"{title} > ")


def format_hits(hits: list[SearchHit], known: tuple[SourceRef, ...], in_room: bool) -> ToolResult:
    """The passages as the model reads them, numbered for citation ([n] continues across the
    searches of one turn), and the documents they come from."""
    note = f" {ROOM_NOTE}" if in_room else ""
    if not hits:
        return ToolResult(f"No passages in the documents you may read match this search.{note}")
    refs = list(known)
    used: dict[str, SourceRef] = {}
    blocks = []
    for hit in hits:
        n = number_of(SourceRef(doc_id=hit.doc_id, title=hit.title), refs)
        if n > len(refs):
            refs.append(SourceRef(doc_id=hit.doc_id, title=hit.title))
        used.setdefault(hit.doc_id, refs[n - 1])
        where = f"{hit.title} — {section}" if (section := within(hit.title, hit.section)) else hit.title
        blocks.append(f"[{n}] {where} (document {hit.doc_id})\n{hit.text.strip()}")
    head = f"{len(hits)} passages from documents you may read. Cite them as [n] where you use them.{note}"
    return ToolResult(
        head + "\n\n" + "\n\n".join(blocks), sources=tuple(used.values()), scope=scope_of_hits(hits)
    )


def scope_of_hits(hits: list[SearchHit]) -> ResultScope:
    """The documents the passages come from, with what decides who may read them."""
    docs = {h.doc_id: DocRef(doc_id=h.doc_id, category=h.category, tags=tuple(h.tags)) for h in hits}
    return ResultScope(domain=hits[0].domain if hits else "", documents=tuple(docs.values()))


async def _search(args: SearchDocumentsArgs, ctx: ToolContext, _: str | None) -> ToolResult:
    readers = readers_for(ctx.ac, ctx.audience, DOCUMENT_KINDS)
    start = time.perf_counter()
    try:
        with retrieval_span("documents", args.query) as span:
            hits = await ctx.services.get(DocumentStore).search(readers, args.query)
            results(span, len(hits))
    except (ServiceUnavailable, IndexMismatch) as exc:
        log.error("document_search_unavailable", reason=str(exc))
        metrics.KNOWLEDGE_QUERIES.labels(NAME, "unavailable").inc()
        return ToolResult(UNAVAILABLE)
    except Exception as exc:  # Redis down, embedding endpoint down: the answer goes on without
        log.error("document_search_failed", error_type=type(exc).__name__)
        metrics.KNOWLEDGE_QUERIES.labels(NAME, "unavailable").inc()
        return ToolResult(UNAVAILABLE)
    metrics.KNOWLEDGE_SECONDS.labels(NAME).observe(time.perf_counter() - start)
    outcome = "nothing_readable" if readers is None else ("found" if hits else "empty")
    metrics.KNOWLEDGE_QUERIES.labels(NAME, outcome).inc()
    audit(
        ctx.services,
        "rag_query",
        ctx.ac,
        ctx.session_id,
        resource=f"tool:{NAME}",
        decision="allowed" if readers is not None else "denied",
        reason=outcome,
        metadata={  # how many results, never their text
            "readers": 0 if readers is None else len(readers.grants),
            "audience": len(ctx.audience.members) if ctx.audience else 0,
            "public_only": bool(ctx.audience and ctx.audience.public_only),
            "results": len(hits),
            "documents": len({h.doc_id for h in hits}),
        },
        arguments=args.model_dump(),
    )
    result = format_hits(hits, ctx.sources, in_room=ctx.audience is not None)
    trace_documents(hits, result.scope, ctx)
    return result


def trace_documents(hits: list[SearchHit], scope: ResultScope | None, ctx: ToolContext) -> None:
    """The turn's trace names the documents found (all readable by the asker: the search was
    filtered), each with what decides who may read it: the 🔍 account names a document only
    to readers who all may (judged when it is asked for: people join rooms after a turn)."""
    turn = current_turn()
    if turn is None or scope is None:
        return
    titles = {h.doc_id: h.title for h in hits}
    room = Readership(ctx.ac, ctx.audience)
    for doc in scope.documents:
        its = ResultScope(domain=scope.domain, documents=(doc,))
        title = titles[doc.doc_id]
        turn.source(
            SourceTrace(
                kind="document", id=doc.doc_id, title=title, room_may_see=room.may_read(its), scope=its
            )
        )


TOOL = Tool(
    name=NAME,
    description=(
        "Search the organisation's documents (policies, reports, runbooks...) that the user may "
        "read. Returns numbered passages; cite them as [n]. Use it for questions about the "
        "organisation, and for exact names or codes."
    ),
    args_model=SearchDocumentsArgs,
    run=_search,
)
