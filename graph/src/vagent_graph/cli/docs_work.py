"""The work behind `vagent docs` (cli/docs.py): the graph's settings and stores for one
command, its failures as one line, and what each command does and prints.

Apart from the command line because it loads the knowledge stack (the stores, parsers and
the embedding model's code): `vagent --help`, tab completion and `vagent audit` / `vagent
admin` do not pay for it, only a docs command that runs.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import typer
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tqdm import tqdm

from vagent_graph.cli import run_env
from vagent_graph.cli.output import complain, printable, say, unreachable
from vagent_graph.knowledge import batch, entity_redis
from vagent_graph.knowledge.doc_index import IndexMismatch
from vagent_graph.knowledge.doc_store import DocumentStore, StoreBusy
from vagent_graph.knowledge.embeddings import EmbeddingError, make_embedder
from vagent_graph.knowledge.entities import EntityFileError, load_files
from vagent_graph.knowledge.entity_store import EntityStore, EntityStoreError
from vagent_graph.knowledge.ingest import Parsed
from vagent_graph.knowledge.parsing import DocumentError, quiet_parsers
from vagent_shared import redis_connect
from vagent_shared.logs import configure_logging
from vagent_shared.settings import GraphSettings

PROG = "vagent docs"


class CliError(Exception):
    """Printed as `vagent docs: <message>`, exit 1."""


#: What a command may fail with: one line on stderr and exit 1, never a traceback.
FAILURES = (
    CliError,
    DocumentError,
    EntityFileError,
    EntityStoreError,
    IndexMismatch,
    StoreBusy,
    EmbeddingError,
    ValueError,
)


@dataclass
class Context:
    settings: GraphSettings
    redis: Redis
    docs: DocumentStore
    #: On the entity graphs' own Redis (ENTITY_REDIS_URL), which is reached only when used.
    entities: EntityStore


@asynccontextmanager
async def context(settings: GraphSettings) -> AsyncIterator[Context]:
    """The documents' Redis, checked at once; the entity Redis only connects when an entity
    command runs, so the document commands work while it is away."""
    try:
        redis = redis_connect.connect(settings.REDIS_URL, socket_timeout=30, socket_connect_timeout=5)
        entities = entity_redis.connect(settings)
    except redis_connect.RedisUrlError as exc:
        raise CliError(str(exc)) from None
    try:
        await redis.ping()  # type: ignore[misc]
    except RedisError as exc:
        await redis.aclose()
        await entities.aclose()
        raise CliError(unreachable(settings.REDIS_URL, exc)) from None
    embedder = make_embedder(settings)
    docs = DocumentStore(
        redis, embedder, settings.DOCS_INDEX, settings.DOCS_VECTOR_ALGORITHM, settings.SEARCH_TOP_K
    )
    try:
        yield Context(settings, redis, docs, EntityStore(entities, settings.ENTITY_GRAPH))
    finally:
        await entities.aclose()
        await redis.aclose()


@contextmanager
def entity_redis_errors(settings: GraphSettings) -> Iterator[None]:
    """The entity Redis away: one line naming it (and the setting), not "lost Redis"."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        where = entity_redis.where(settings)
        variable = entity_redis.SETTING if settings.ENTITY_REDIS_URL else "REDIS_URL"
        made_run, dev_env = run_env.made_run_settings()
        hint = run_env.redis_hint(variable, settings.entity_redis_url(), made_run, dev_env)
        raise CliError(f"cannot reach the entity Redis at {where}: {type(exc).__name__}. {hint}") from None
    except ResponseError as exc:
        where = entity_redis.where(settings)
        first = printable(str(exc).splitlines()[0] if str(exc) else "")[:120]
        raise CliError(
            f"the entity Redis at {where} refused it ({first}): has it the FalkorDB module?"
        ) from None


async def _in_context(settings: GraphSettings, command: Callable[[Context], Awaitable[None]]) -> None:
    async with context(settings) as ctx:
        await command(ctx)


def run(command: Callable[[Context], Awaitable[None]]) -> None:
    """Run one command with the graph's settings and stores; its failures as one line."""
    try:
        settings = GraphSettings()
        # The command prints what it did; its logs only for problems unless asked for more.
        level = "WARNING" if settings.LOG_LEVEL.upper() == "INFO" else settings.LOG_LEVEL
        configure_logging(level, service=PROG)
        quiet_parsers()
        asyncio.run(_in_context(settings, command))
    except FAILURES as exc:
        complain(PROG, str(exc))
        raise typer.Exit(1) from None
    except RedisConnectionError as exc:
        complain(PROG, f"lost the connection to Redis ({type(exc).__name__})")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        complain(PROG, "interrupted; documents already written stay, none is half-written")
        raise typer.Exit(130) from None


# ---- the commands' work ------------------------------------------------------------------------


def tags_of(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


@dataclass(frozen=True)
class IngestArgs:
    """What `ingest` was asked for: PATHs with their metadata, or a manifest."""

    paths: list[Path]
    manifest: Path | None = None
    domain: str | None = None
    category: str | None = None
    tags: tuple[str, ...] = ()
    doc_id: str | None = None
    title: str | None = None
    source: str | None = None
    skip_bad: bool = False
    force: bool = False


async def ingest_files(ctx: Context, args: IngestArgs) -> None:
    if args.manifest:
        if args.paths:
            raise CliError("give either PATHs or --manifest, not both")
        manifest = batch.load_manifest(args.manifest)
        jobs, errors = batch.manifest_jobs(manifest)
    else:
        if not args.paths or not args.domain or not args.category:
            raise CliError("ingest needs PATH... with --domain and --category (or --manifest)")
        manifest = None
        files, errors = batch.expand(args.paths)
        jobs, more = batch.jobs_for(
            files,
            domain=args.domain,
            category=args.category,
            tags=args.tags,
            doc_id=args.doc_id,
            title=args.title,
            source=args.source,
        )
        errors += more
    parsed, problems = batch.parse_all(jobs)
    errors += problems
    for e in errors:
        complain(PROG, str(e))
    if errors and not args.skip_bad:
        raise CliError(f"{len(errors)} problem(s); nothing was written (--skip-bad ingests the good files)")
    report = await _write(ctx, parsed, args.force)
    rate = report.chunks_embedded / report.embed_seconds if report.embed_seconds > 0 else 0.0
    say(
        f"ingested {len(report.written)} document(s), {report.chunks_embedded} chunks "
        f"({rate:.0f} chunks/s embedding with {ctx.docs.embedder.model_id}); "
        f"{len(report.unchanged)} unchanged" + (f"; {len(errors)} skipped" if errors else "")
    )
    if manifest is not None:
        for item in manifest.entities:
            await load_entities(ctx, [item.file], item.domain, replace=True)


async def _write(ctx: Context, parsed: list[Parsed], force: bool) -> batch.BatchReport:
    with tqdm(total=0, unit="chunk", desc="embedding", disable=None, file=sys.stderr) as bar:

        def total(n: int) -> None:
            bar.total = n
            bar.refresh()

        return await batch.write_batch(ctx.docs, parsed, force=force, on_chunks=bar.update, total=total)


async def list_documents(ctx: Context, domain: str | None, as_json: bool) -> None:
    docs = await ctx.docs.documents(domain)
    if as_json:
        for d in docs:
            say(d.model_dump_json())
        return
    if not docs:
        say("no documents" + (f" in domain {domain}" if domain else ""))
        return
    rows = [("DOMAIN", "DOC_ID", "CATEGORY", "TAGS", "CHUNKS", "TITLE")]
    rows += [(d.domain, d.doc_id, d.category, ",".join(d.tags), str(d.chunks), d.title) for d in docs]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        say("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5])


async def delete_document(ctx: Context, doc_id: str, domain: str | None) -> None:
    if domain:
        domains = [domain]
    else:
        domains = sorted({d.domain for d in await ctx.docs.documents() if d.doc_id == doc_id})
    if not domains:
        raise CliError(f"no document {doc_id!r}")
    if len(domains) > 1:
        raise CliError(f"{doc_id!r} exists in several domains ({', '.join(domains)}): give --domain")
    result = await ctx.docs.delete(domains[0], doc_id)
    if result is None:
        raise CliError(f"no document {doc_id!r} in domain {domains[0]}")
    say(f"deleted {result.doc_id} ({result.domain}): {result.deleted_chunks} chunks")


async def show_status(ctx: Context, as_json: bool) -> None:
    st = await ctx.docs.status()
    if as_json:
        say(st.model_dump_json())
        return
    say(f"index {st.index}: {st.documents} documents, {st.chunks} chunks")
    dims = f", {st.dimensions} dimensions" if st.dimensions else ""
    say(f"built with {st.embedding_model or '(nothing ingested yet)'}{dims}")
    say(f"configured embedding model: {ctx.docs.embedder.model_id}")


async def reindex_all(ctx: Context) -> None:
    st = await ctx.docs.status()
    with tqdm(total=st.chunks, unit="chunk", desc="re-embedding", disable=None, file=sys.stderr) as bar:
        n = await ctx.docs.reindex(progress=bar.update)
    say(f"reindexed {n} chunks with {ctx.docs.embedder.model_id}")


async def load_entities(ctx: Context, files: list[Path], domain: str, replace: bool) -> None:
    graph = load_files(files)
    with entity_redis_errors(ctx.settings):
        result = await ctx.entities.load(domain, graph, replace=replace)
    say(
        f"loaded {result.entities} entities and {result.relations} relations into domain {domain}"
        + (" (replaced)" if result.replaced else "")
    )


async def delete_entities(ctx: Context, domain: str) -> None:
    with entity_redis_errors(ctx.settings):
        removed = await ctx.entities.delete_domain(domain)
    say(f"deleted the entities of domain {domain}" if removed else f"{domain} had no entities")
