"""`vagent-docs`: ingest, list, delete and reindex documents; load entities.

    vagent-docs ingest PATH... --domain acme --category finance --tags q3,confidential
    vagent-docs ingest --manifest deploy/dev/knowledge/manifest.yaml
    vagent-docs list [--domain acme] [--json]
    vagent-docs delete DOC_ID [--domain acme]
    vagent-docs status
    vagent-docs reindex
    vagent-docs entities load FILE... --domain acme [--replace]
    vagent-docs entities delete --domain acme

Reads the graph service's settings (REDIS_URL, DOCS_INDEX, EMBEDDINGS_*, ENTITY_GRAPH).
Exit codes: 0 done, 1 something could not be done (nothing half-written), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from tqdm import tqdm

from vagent_graph.knowledge import batch
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


class CliError(Exception):
    """Printed as `vagent-docs: <message>`, exit 1."""


def _tags(value: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in value.split(",") if t.strip())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vagent-docs", description="Manage vagent's documents and entities.")
    sub = p.add_subparsers(dest="command", required=True)
    ing = sub.add_parser("ingest", help="add or replace documents (Markdown, text, HTML, PDF)")
    ing.add_argument("paths", nargs="*", type=Path, help="files or folders")
    ing.add_argument("--manifest", type=Path, help="a YAML manifest of documents and entity files")
    ing.add_argument("--domain", help="the tenant (ACL domain) the documents belong to")
    ing.add_argument("--category", help="the documents' category (granted by document_category:)")
    ing.add_argument("--tags", type=_tags, default=(), help="comma-separated tags (document_tag:)")
    ing.add_argument("--doc-id", help="the document id (one file only; default: the file name)")
    ing.add_argument("--title", help="the title (one file only; default: from the document)")
    ing.add_argument("--source", help="where the document comes from (default: the file name)")
    ing.add_argument("--skip-bad", action="store_true", help="ingest the good files when some are bad")
    ing.add_argument("--force", action="store_true", help="re-embed documents that did not change")
    ls = sub.add_parser("list", help="list documents")
    ls.add_argument("--domain")
    ls.add_argument("--json", action="store_true", help="JSON lines")
    rm = sub.add_parser("delete", help="remove a document and all its chunks")
    rm.add_argument("doc_id")
    rm.add_argument("--domain", help="needed when several domains have a document with this id")
    st = sub.add_parser("status", help="what the index holds and which embedding model built it")
    st.add_argument("--json", action="store_true")
    sub.add_parser("reindex", help="re-embed every chunk with the configured embedding model")
    ent_parser = sub.add_parser("entities", help="knowledge-graph entities")
    ent = ent_parser.add_subparsers(dest="action", required=True)
    load = ent.add_parser("load", help="load entities and relations from JSON or CSV files")
    load.add_argument("files", nargs="+", type=Path)
    load.add_argument("--domain", required=True)
    load.add_argument("--replace", action="store_true", help="replace the domain's whole graph")
    drop = ent.add_parser("delete", help="remove a domain's entities")
    drop.add_argument("--domain", required=True)
    return p


@dataclass
class Context:
    settings: GraphSettings
    redis: Redis
    docs: DocumentStore
    entities: EntityStore


def _where(url: str) -> str:
    """The Redis address without credentials, for messages."""
    return redis_connect.where(url)


@asynccontextmanager
async def context(settings: GraphSettings) -> AsyncIterator[Context]:
    try:
        redis = redis_connect.connect(settings.REDIS_URL, socket_timeout=30, socket_connect_timeout=5)
    except redis_connect.RedisUrlError as exc:
        raise CliError(str(exc)) from None
    try:
        await redis.ping()  # type: ignore[misc]
    except RedisError as exc:
        await redis.aclose()
        raise CliError(
            f"cannot reach Redis at {_where(settings.REDIS_URL)} (REDIS_URL): {type(exc).__name__}"
        ) from None
    embedder = make_embedder(settings)
    docs = DocumentStore(
        redis, embedder, settings.DOCS_INDEX, settings.DOCS_VECTOR_ALGORITHM, settings.SEARCH_TOP_K
    )
    try:
        yield Context(settings, redis, docs, EntityStore(redis, settings.ENTITY_GRAPH))
    finally:
        await redis.aclose()


def say(text: str) -> None:
    print(text, flush=True)


async def ingest(ctx: Context, args: argparse.Namespace) -> None:
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
        print(f"vagent-docs: {e}", file=sys.stderr)
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
            await _load_entities(ctx, [item.file], item.domain, replace=True)


async def _write(ctx: Context, parsed: list[Parsed], force: bool) -> batch.BatchReport:
    with tqdm(total=0, unit="chunk", desc="embedding", disable=None, file=sys.stderr) as bar:

        def total(n: int) -> None:
            bar.total = n
            bar.refresh()

        return await batch.write_batch(ctx.docs, parsed, force=force, on_chunks=bar.update, total=total)


async def list_docs(ctx: Context, args: argparse.Namespace) -> None:
    docs = await ctx.docs.documents(args.domain)
    if args.json:
        for d in docs:
            say(d.model_dump_json())
        return
    if not docs:
        say("no documents" + (f" in domain {args.domain}" if args.domain else ""))
        return
    rows = [("DOMAIN", "DOC_ID", "CATEGORY", "TAGS", "CHUNKS", "TITLE")]
    rows += [(d.domain, d.doc_id, d.category, ",".join(d.tags), str(d.chunks), d.title) for d in docs]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        say("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5])


async def delete(ctx: Context, args: argparse.Namespace) -> None:
    if args.domain:
        domains = [args.domain]
    else:
        domains = sorted({d.domain for d in await ctx.docs.documents() if d.doc_id == args.doc_id})
    if not domains:
        raise CliError(f"no document {args.doc_id!r}")
    if len(domains) > 1:
        raise CliError(f"{args.doc_id!r} exists in several domains ({', '.join(domains)}): give --domain")
    result = await ctx.docs.delete(domains[0], args.doc_id)
    if result is None:
        raise CliError(f"no document {args.doc_id!r} in domain {domains[0]}")
    say(f"deleted {result.doc_id} ({result.domain}): {result.deleted_chunks} chunks")


async def status(ctx: Context, args: argparse.Namespace) -> None:
    st = await ctx.docs.status()
    if args.json:
        say(st.model_dump_json())
        return
    say(f"index {st.index}: {st.documents} documents, {st.chunks} chunks")
    dims = f", {st.dimensions} dimensions" if st.dimensions else ""
    say(f"built with {st.embedding_model or '(nothing ingested yet)'}{dims}")
    say(f"configured embedding model: {ctx.docs.embedder.model_id}")


async def reindex(ctx: Context, args: argparse.Namespace) -> None:
    st = await ctx.docs.status()
    with tqdm(total=st.chunks, unit="chunk", desc="re-embedding", disable=None, file=sys.stderr) as bar:
        n = await ctx.docs.reindex(progress=bar.update)
    say(f"reindexed {n} chunks with {ctx.docs.embedder.model_id}")


async def _load_entities(ctx: Context, files: list[Path], domain: str, replace: bool) -> None:
    graph = load_files(files)
    result = await ctx.entities.load(domain, graph, replace=replace)
    say(
        f"loaded {result.entities} entities and {result.relations} relations into domain {domain}"
        + (" (replaced)" if result.replaced else "")
    )


async def entities(ctx: Context, args: argparse.Namespace) -> None:
    if args.action == "load":
        await _load_entities(ctx, args.files, args.domain, args.replace)
    else:
        removed = await ctx.entities.delete_domain(args.domain)
        say(f"deleted the entities of domain {args.domain}" if removed else f"{args.domain} had no entities")


COMMANDS: dict[str, Any] = {
    "ingest": ingest,
    "list": list_docs,
    "delete": delete,
    "status": status,
    "reindex": reindex,
    "entities": entities,
}


async def run(args: argparse.Namespace, settings: GraphSettings) -> None:
    async with context(settings) as ctx:
        await COMMANDS[args.command](ctx, args)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        settings = GraphSettings()
        # The command prints what it did; its logs only for problems unless asked for more.
        level = "WARNING" if settings.LOG_LEVEL.upper() == "INFO" else settings.LOG_LEVEL
        configure_logging(level, service="vagent-docs")
        quiet_parsers()
        asyncio.run(run(args, settings))
    except (
        CliError,
        DocumentError,
        EntityFileError,
        EntityStoreError,
        IndexMismatch,
        StoreBusy,
        EmbeddingError,
        ValueError,
    ) as exc:
        print(f"vagent-docs: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except RedisConnectionError as exc:
        print(f"vagent-docs: lost the connection to Redis ({type(exc).__name__})", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print(
            "vagent-docs: interrupted; documents already written stay, none is half-written", file=sys.stderr
        )
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
