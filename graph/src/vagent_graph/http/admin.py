"""The admin API: feed documents and entities from a pipeline, read the token usage
(`/admin/v1/...`).

Its own token (GRAPH_ADMIN_TOKEN), checked by the router's one dependency: the bot's
service token cannot ingest, and without GRAPH_ADMIN_TOKEN the admin API is off.

    curl -X PUT "$GRAPH/admin/v1/documents/acme/q3-report?category=finance&tags=q3,confidential" \\
         -H "Authorization: Bearer $GRAPH_ADMIN_TOKEN" -H "Content-Type: application/pdf" \\
         --data-binary @q3-report.pdf
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast, get_args

import structlog
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import TypeAdapter, ValidationError
from redis.exceptions import RedisError, ResponseError

from vagent_graph.http.middleware import ADMIN_PREFIX, token_matches
from vagent_graph.knowledge.doc_index import IndexMismatch
from vagent_graph.knowledge.doc_store import DocumentStore, StoreBusy
from vagent_graph.knowledge.embeddings import EmbeddingError
from vagent_graph.knowledge.entities import EntityGraph
from vagent_graph.knowledge.entity_store import EntityStore, EntityStoreError
from vagent_graph.knowledge.ingest import embed, parse, spec
from vagent_graph.knowledge.parsing import DocumentError, detect_format
from vagent_graph.observability.audit_reader import parse_when
from vagent_graph.observability.trace_store import MAX_LIMIT, TraceFilter, TraceStore
from vagent_graph.observability.usage import days_from, parse_since, read_rows
from vagent_graph.services import Services
from vagent_graph.state.erasure import valid_user_id
from vagent_shared.budgets import UsageRow, usage_day
from vagent_shared.http_errors import api_error
from vagent_shared.knowledge import (
    DeleteResult,
    DocId,
    DocumentInfo,
    DocumentList,
    Domain,
    EntityLoadResult,
    IndexStatus,
)
from vagent_shared.settings import GraphSettings
from vagent_shared.traces import TurnOutcome, TurnTrace
from vagent_shared.wire import ErrorResponse

log = structlog.get_logger(__name__)
_DOMAIN: TypeAdapter[str] = TypeAdapter(Domain)
_DOC_ID: TypeAdapter[str] = TypeAdapter(DocId)
TURN_OUTCOMES: tuple[str, ...] = get_args(TurnOutcome)


def _first_problem(exc: ValidationError) -> str:
    """The first problem of `exc` as a short sentence, without pydantic's `Value error, `."""
    errors = exc.errors()
    msg = str(errors[0]["msg"]) if errors else "invalid"
    return msg.removeprefix("Value error, ")


def _valid_name(adapter: TypeAdapter[str], field: str, value: str) -> str:
    """A path (or query) value checked on its own, so that a 422 names it: error code
    `invalid_{field}`, message `{field}: {problem}` (never "body": the body may be fine)."""
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        raise api_error(422, f"invalid_{field}", f"{field}: {_first_problem(exc)}") from None


def valid_domain(domain: str) -> str:
    return _valid_name(_DOMAIN, "domain", domain)


def valid_doc_id(doc_id: str) -> str:
    return _valid_name(_DOC_ID, "doc_id", doc_id)


async def require_admin_token(request: Request) -> None:
    """401 without the admin token; 403 when the admin API is off (no GRAPH_ADMIN_TOKEN)."""
    settings: GraphSettings = request.app.state.resources.settings
    token = settings.GRAPH_ADMIN_TOKEN.get_secret_value() if settings.GRAPH_ADMIN_TOKEN else ""
    if not token:
        raise api_error(403, "admin_disabled", "The admin API is off: set GRAPH_ADMIN_TOKEN to use it.")
    header = request.headers.get("authorization")
    if not token_matches(header.encode() if header else None, token.encode()):
        log.warning("security.bad_admin_token", path=request.url.path, auth_header_present=bool(header))
        raise api_error(401, "unauthorized", "Missing or invalid admin token.")


router = APIRouter(
    prefix=f"{ADMIN_PREFIX}v1",
    tags=["admin"],
    dependencies=[Depends(require_admin_token)],
    responses={s: {"model": ErrorResponse} for s in (401, 403, 409, 413, 422, 503)},
)


def _services(request: Request) -> Services:
    return request.app.state.resources.services  # type: ignore[no-any-return]


async def documents(request: Request) -> DocumentStore:
    return _services(request).get(DocumentStore)


async def entity_store(request: Request) -> EntityStore:
    return _services(request).get(EntityStore)


def _unavailable(exc: Exception) -> Exception:
    """The store's failures as clear 4xx/5xx answers (never a 500)."""
    if isinstance(exc, DocumentError):
        return api_error(422, "invalid_document", str(exc))
    if isinstance(exc, IndexMismatch):
        return api_error(409, "index_model_mismatch", str(exc))
    if isinstance(exc, StoreBusy):
        return api_error(409, "index_busy", str(exc))
    if isinstance(exc, EmbeddingError):
        return api_error(503, "embeddings_unavailable", str(exc))
    log.error("admin_store_failed", error_type=type(exc).__name__)
    return api_error(503, "store_unavailable", "The document store is not reachable.")


STORE_ERRORS = (DocumentError, IndexMismatch, StoreBusy, EmbeddingError, RedisError, OSError)


@router.get("/documents", response_model=DocumentList)
async def list_documents(
    store: DocumentStore = Depends(documents), domain: str | None = None
) -> DocumentList:
    """Every ingested document (of one domain)."""
    if domain is not None:
        domain = valid_domain(domain)
    try:
        return DocumentList(documents=await store.documents(domain))
    except STORE_ERRORS as exc:
        raise _unavailable(exc) from None


@router.get("/index", response_model=IndexStatus)
async def index_status(store: DocumentStore = Depends(documents)) -> IndexStatus:
    """What the index holds and which embedding model built it."""
    try:
        return await store.status()
    except STORE_ERRORS as exc:
        raise _unavailable(exc) from None


@router.put(
    "/documents/{domain}/{doc_id}",
    response_model=DocumentInfo,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {t: {} for t in ("text/markdown", "text/plain", "text/html", "application/pdf")},
        }
    },
)
async def put_document(
    domain: str,
    doc_id: str,
    request: Request,
    response: Response,
    category: str = Query(description="document_category: that grants it"),
    tags: str = Query("", description="comma-separated document_tag: values"),
    title: str | None = None,
    source: str = "",
    filename: str | None = Query(None, description="decides the format when Content-Type does not"),
    store: DocumentStore = Depends(documents),
) -> DocumentInfo:
    """Add or replace a document (the body is the file). Replacing is atomic: searches see
    the old version or the new one, never a mix. 201 when new, 200 when replaced."""
    domain, doc_id = valid_domain(domain), valid_doc_id(doc_id)
    try:
        doc = spec(
            doc_id=doc_id,
            domain=domain,
            category=category,
            tags=tuple(t.strip() for t in tags.split(",") if t.strip()),
            title=title,
            source=source,
        )
        name = filename or doc_id
        fmt = detect_format(name, request.headers.get("content-type"))
        parsed = parse(await request.body(), fmt, name, doc)
        existed = await store.get(domain, doc_id) is not None
        info = await store.put(await embed(parsed, store.embedder))
    except STORE_ERRORS as exc:
        raise _unavailable(exc) from None
    response.status_code = 200 if existed else 201
    log.info("admin_document_put", domain=domain, doc_id=doc_id, chunks=info.chunks, replaced=existed)
    return info


@router.delete("/documents/{domain}/{doc_id}", response_model=DeleteResult)
async def delete_document(
    domain: str, doc_id: str, store: DocumentStore = Depends(documents)
) -> DeleteResult:
    """Remove a document and all its chunks."""
    domain, doc_id = valid_domain(domain), valid_doc_id(doc_id)
    try:
        result = await store.delete(domain, doc_id)
    except STORE_ERRORS as exc:
        raise _unavailable(exc) from None
    if result is None:
        raise api_error(404, "no_such_document", f"No document {doc_id!r} in domain {domain!r}.")
    return result


@router.put("/entities/{domain}", response_model=EntityLoadResult)
async def put_entities(
    domain: str,
    request: Request,
    replace: bool = Query(False, description="replace the domain's whole graph"),
    store: EntityStore = Depends(entity_store),
) -> EntityLoadResult:
    """Load entities and relations (JSON: {"entities": [...], "relations": [...]})."""
    domain = valid_domain(domain)
    try:
        graph = EntityGraph.model_validate_json(await request.body())
    except ValidationError as exc:
        where = ".".join(map(str, exc.errors()[0]["loc"])) if exc.errors() else ""
        raise api_error(422, "invalid_entities", f"{where or 'body'}: {_first_problem(exc)}") from None
    try:
        return await store.load(domain, graph, replace=replace)
    except EntityStoreError as exc:  # e.g. the graph module is not loaded in this Redis
        log.error("admin_entities_failed", reason=str(exc))
        raise api_error(503, "graph_store_unavailable", f"The entities were not loaded: {exc}") from None
    except (RedisError, OSError) as exc:  # the entity Redis (ENTITY_REDIS_URL): away, or no graph module
        log.error("admin_entities_failed", error_type=type(exc).__name__)
        why = (
            "the entity store refused the write (does its Redis have the FalkorDB module?)"
            if isinstance(exc, ResponseError)
            else "the entity store is not reachable"
        )
        raise api_error(503, "graph_store_unavailable", f"The entities were not loaded: {why}.") from None


@router.get("/usage", response_model=list[UsageRow])
async def usage(
    request: Request,
    tenant: str | None = Query(None, description="only this tenant (ACL domain)"),
    user: str | None = Query(None, description="only this Matrix user id"),
    since: str = Query("1d", description="from this UTC day: YYYY-MM-DD, or 7d (today included)"),
) -> list[UsageRow]:
    """Tokens per UTC day, tenant and user, as `vagent usage --json` prints them: one row per
    day, tenant and user, and (without `user`) each tenant's day total with user_id ""."""
    today = usage_day()
    try:
        first = parse_since(since, today)
    except ValueError as exc:
        raise api_error(422, "invalid_since", f"since: {exc}") from None
    try:
        return await read_rows(request.app.state.resources.redis, days_from(first, today), tenant, user)
    except (RedisError, OSError) as exc:
        log.error("admin_usage_failed", error_type=type(exc).__name__)
        raise api_error(503, "store_unavailable", "The usage counters are not reachable.") from None


# ---- turn traces (docs/traces.md) ------------------------------------------------------------


def trace_store(request: Request) -> TraceStore:
    resources = request.app.state.resources
    return TraceStore(resources.redis, resources.settings.TRACE_TTL_SECONDS)


def trace_filter(user: str | None, since: str | None, outcome: str | None, limit: int) -> TraceFilter:
    """The filters of `/traces` checked one by one, so that a 422 names the one that is wrong."""
    if user is not None and not valid_user_id(user):
        raise api_error(422, "invalid_user", f"user: {user[:100]!r} is not a Matrix user id (@name:server)")
    when = None
    if since is not None:
        try:
            when = parse_when(since, datetime.now(UTC))
        except ValueError as exc:
            raise api_error(422, "invalid_since", f"since: {exc}") from None
    if outcome is not None and outcome not in TURN_OUTCOMES:
        raise api_error(422, "invalid_outcome", f"outcome: one of {', '.join(TURN_OUTCOMES)}")
    if not 1 <= limit <= MAX_LIMIT:
        raise api_error(422, "invalid_limit", f"limit: from 1 to {MAX_LIMIT}")
    return TraceFilter(user, when, cast(TurnOutcome | None, outcome), limit)


@router.get("/traces", response_model=list[TurnTrace])
async def list_traces(
    request: Request,
    user: str | None = Query(None, description="only this Matrix user id's turns"),
    since: str | None = Query(None, description="from this time on: 90m, 1d, 1w, or ISO-8601 (UTC)"),
    outcome: str | None = Query(None, description="only turns that ended so: " + ", ".join(TURN_OUTCOMES)),
    limit: int = Query(50, description=f"at most this many (1 to {MAX_LIMIT})"),
) -> list[TurnTrace]:
    """Stored turn traces, newest first (`vagent trace list --json` prints the same)."""
    flt = trace_filter(user, since, outcome, limit)
    try:
        return await trace_store(request).recent(flt)
    except (RedisError, OSError) as exc:
        log.error("admin_traces_failed", error_type=type(exc).__name__)
        raise api_error(503, "store_unavailable", "The trace store is not reachable.") from None


@router.get("/traces/{ref}", response_model=TurnTrace, responses={404: {"model": ErrorResponse}})
async def get_trace(ref: str, request: Request) -> TurnTrace:
    """One turn's trace, by its turn id or by the Matrix event id of the bot's answer."""
    try:
        found = await trace_store(request).resolve(ref)
    except (RedisError, OSError) as exc:
        log.error("admin_traces_failed", error_type=type(exc).__name__)
        raise api_error(503, "store_unavailable", "The trace store is not reachable.") from None
    if found is None:
        raise api_error(
            404,
            "no_such_trace",
            f"No trace for {ref[:200]!r}: not a known turn id or answer event id, or it expired "
            "(TRACE_TTL_SECONDS).",
        )
    return found
