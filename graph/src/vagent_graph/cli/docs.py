"""`vagent docs`: ingest, list, delete and reindex documents; load entities.

    vagent docs ingest PATH... --domain acme --category finance --tags q3,confidential
    vagent docs ingest --manifest deploy/dev/knowledge/manifest.yaml
    vagent docs list [--domain acme] [--json]
    vagent docs delete DOC_ID [--domain acme]
    vagent docs status [--json]
    vagent docs reindex
    vagent docs entities load FILE... --domain acme [--replace]
    vagent docs entities delete --domain acme

Reads the graph service's settings (REDIS_URL, DOCS_INDEX, EMBEDDINGS_*, ENTITY_GRAPH,
ENTITY_REDIS_URL), so what it writes is what the graph reads. The work is vagent_graph.knowledge's (batch, the
stores); this module is the command line, and docs_work.py what each command does, loaded
only when one runs (so `vagent --help`, completion and the other groups stay quick).
Exit codes: 0 done, 1 something could not be done (nothing half-written), 2 bad usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# Each command imports docs_work (the knowledge stack) when it runs: see the docstring.

app = typer.Typer(
    help="Manage vagent's documents and entities.",
    short_help="Documents and entities: ingest, list, delete, reindex.",
    no_args_is_help=True,
)
entities_app = typer.Typer(help="Knowledge-graph entities: load, delete.", no_args_is_help=True)
app.add_typer(entities_app, name="entities")


# ---- the command line --------------------------------------------------------------------------

Json = Annotated[bool, typer.Option("--json", help="JSON, one object per line")]


@app.command()
def ingest(
    paths: Annotated[list[Path] | None, typer.Argument(metavar="PATH", help="files or folders")] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="a YAML manifest of documents and entity files"),
    ] = None,
    domain: Annotated[
        str | None, typer.Option(metavar="DOMAIN", help="the tenant (ACL domain) the documents belong to")
    ] = None,
    category: Annotated[
        str | None,
        typer.Option(metavar="CATEGORY", help="the documents' category (granted by document_category:)"),
    ] = None,
    tags: Annotated[str, typer.Option(metavar="TAGS", help="comma-separated tags (document_tag:)")] = "",
    doc_id: Annotated[
        str | None,
        typer.Option(metavar="DOC_ID", help="the document id (one file only; default: the file name)"),
    ] = None,
    title: Annotated[
        str | None,
        typer.Option(metavar="TITLE", help="the title (one file only; default: from the document)"),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(metavar="SOURCE", help="where the document comes from (default: the file name)"),
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="ingest the good files when some are bad")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="re-embed documents that did not change")] = False,
) -> None:
    """Add or replace documents (Markdown, text, HTML, PDF)."""
    from vagent_graph.cli import docs_work as work

    args = work.IngestArgs(
        paths=paths or [],
        manifest=manifest,
        domain=domain,
        category=category,
        tags=work.tags_of(tags),
        doc_id=doc_id,
        title=title,
        source=source,
        skip_bad=skip_bad,
        force=force,
    )
    work.run(lambda ctx: work.ingest_files(ctx, args))


@app.command("list")
def list_command(
    domain: Annotated[str | None, typer.Option(metavar="DOMAIN", help="only this domain")] = None,
    as_json: Json = False,
) -> None:
    """List documents."""
    from vagent_graph.cli import docs_work as work

    work.run(lambda ctx: work.list_documents(ctx, domain, as_json))


@app.command()
def delete(
    doc_id: Annotated[str, typer.Argument(metavar="DOC_ID", help="the document id")],
    domain: Annotated[
        str | None,
        typer.Option(metavar="DOMAIN", help="needed when several domains have a document with this id"),
    ] = None,
) -> None:
    """Remove a document and all its chunks."""
    from vagent_graph.cli import docs_work as work

    work.run(lambda ctx: work.delete_document(ctx, doc_id, domain))


@app.command()
def status(as_json: Json = False) -> None:
    """What the index holds and which embedding model built it."""
    from vagent_graph.cli import docs_work as work

    work.run(lambda ctx: work.show_status(ctx, as_json))


@app.command()
def reindex() -> None:
    """Re-embed every chunk with the configured embedding model."""
    from vagent_graph.cli import docs_work as work

    work.run(work.reindex_all)


Domain = Annotated[str, typer.Option(metavar="DOMAIN", help="the tenant (ACL domain)")]


@entities_app.command("load")
def entities_load(
    files: Annotated[list[Path], typer.Argument(metavar="FILE", help="JSON or CSV files")],
    domain: Domain,
    replace: Annotated[bool, typer.Option("--replace", help="replace the domain's whole graph")] = False,
) -> None:
    """Load entities and relations from JSON or CSV files."""
    from vagent_graph.cli import docs_work as work

    work.run(lambda ctx: work.load_entities(ctx, files, domain, replace))


@entities_app.command("delete")
def entities_delete(domain: Domain) -> None:
    """Remove a domain's entities."""
    from vagent_graph.cli import docs_work as work

    work.run(lambda ctx: work.delete_entities(ctx, domain))
