"""One ingestion run (the CLI's `ingest`, a manifest): collect, parse, embed, then write.

All files are read and parsed first. If any cannot be used, nothing is written (unless the
operator asked to skip bad files): a pipeline never leaves half a batch behind. Unchanged
documents (same bytes, same metadata, same embedding model) are skipped without
embedding them again, so re-running `make run` costs almost nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.ingest import DocumentSpec, Parsed, Prepared, doc_id_from_path, parse, spec
from vagent_graph.knowledge.parsing import DocumentError, detect_format
from vagent_shared.knowledge import DocumentInfo
from vagent_shared.validation import problems

SUPPORTED_SUFFIXES = (".md", ".markdown", ".txt", ".text", ".html", ".htm", ".pdf", ".docx")


@dataclass
class FileJob:
    """One file and what the operator says about it."""

    path: Path
    spec: DocumentSpec


@dataclass
class BatchReport:
    written: list[DocumentInfo] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    chunks_embedded: int = 0
    embed_seconds: float = 0.0


def expand(paths: Iterable[Path]) -> tuple[list[Path], list[str]]:
    """Files to ingest: files as given, folders searched for supported files (sorted)."""
    files: list[Path] = []
    errors: list[str] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUPPORTED_SUFFIXES
            )
            if not found:
                errors.append(f"{path}: no Markdown, text, HTML, PDF or Word files in this folder")
            files += found
        elif path.exists():
            files.append(path)
        else:
            errors.append(f"{path}: no such file or folder")
    return files, errors


def jobs_for(
    files: list[Path],
    *,
    domain: str,
    category: str,
    tags: tuple[str, ...],
    doc_id: str | None = None,
    title: str | None = None,
    source: str | None = None,
) -> tuple[list[FileJob], list[str]]:
    """One job per file with the same metadata; `doc_id`/`title` only make sense for one file."""
    jobs: list[FileJob] = []
    errors: list[str] = []
    if (doc_id or title) and len(files) != 1:
        return [], ["--doc-id and --title apply to exactly one file"]
    for path in files:
        try:
            jobs.append(
                FileJob(
                    path,
                    spec(
                        doc_id=doc_id or doc_id_from_path(path),
                        domain=domain,
                        category=category,
                        tags=tags,
                        title=title,
                        source=source if source is not None else path.name,
                    ),
                )
            )
        except DocumentError as exc:
            errors.append(f"{path}: {exc}")
    return jobs, errors


class ManifestDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: Path
    doc_id: str | None = None
    domain: str
    category: str
    tags: list[str] = Field(default_factory=list)
    title: str | None = None
    source: str | None = None


class ManifestEntities(BaseModel):
    model_config = ConfigDict(extra="forbid")

    file: Path
    domain: str


class Manifest(BaseModel):
    """A YAML list of documents (and entity files) with their metadata (docs/knowledge.md)."""

    model_config = ConfigDict(extra="forbid")

    documents: list[ManifestDocument] = Field(default_factory=list)
    entities: list[ManifestEntities] = Field(default_factory=list)


def load_manifest(path: Path) -> Manifest:
    """The manifest with file paths made relative to its folder; DocumentError if invalid."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        manifest = Manifest.model_validate(raw or {})
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"{path}: not valid YAML ({exc})") from None
    except ValidationError as exc:
        raise DocumentError(f"{path}: invalid manifest: {problems(exc)}") from None
    for d in manifest.documents:
        d.file = (path.parent / d.file).resolve()
    for e in manifest.entities:
        e.file = (path.parent / e.file).resolve()
    return manifest


def manifest_jobs(manifest: Manifest) -> tuple[list[FileJob], list[str]]:
    jobs: list[FileJob] = []
    errors: list[str] = []
    for d in manifest.documents:
        made, problems = jobs_for(
            [d.file],
            domain=d.domain,
            category=d.category,
            tags=tuple(d.tags),
            doc_id=d.doc_id,
            title=d.title,
            source=d.source,
        )
        jobs += made
        errors += problems
    return jobs, errors


def parse_all(jobs: list[FileJob]) -> tuple[list[Parsed], list[str]]:
    """Read and parse every file; the errors name the file and say what is wrong."""
    parsed: list[Parsed] = []
    errors: list[str] = []
    seen: dict[tuple[str, str], Path] = {}
    for job in jobs:
        key = (job.spec.domain, job.spec.doc_id)
        if key in seen:
            errors.append(f"{job.path}: document id {job.spec.doc_id!r} is also used by {seen[key]}")
            continue
        seen[key] = job.path
        try:
            data = job.path.read_bytes()
            parsed.append(parse(data, detect_format(job.path.name), job.path.name, job.spec))
        except OSError as exc:
            errors.append(f"{job.path}: cannot read the file ({exc.strerror or exc})")
        except DocumentError as exc:
            errors.append(str(exc) if str(exc).startswith(job.path.name) else f"{job.path}: {exc}")
    return parsed, errors


def unchanged(current: DocumentInfo | None, p: Parsed, model_id: str) -> bool:
    """The stored document is exactly what this run would write."""
    return (
        current is not None
        and current.sha256 == p.sha256
        and current.embedding_model == model_id
        and current.title == p.title
        and current.category == p.spec.category
        and current.tags == list(p.spec.tags)
        and current.source == p.spec.source
    )


async def write_batch(
    store: DocumentStore,
    parsed: list[Parsed],
    *,
    force: bool = False,
    on_chunks: Callable[[int], None] | None = None,
    total: Callable[[int], None] | None = None,
) -> BatchReport:
    """Embed what changed (all before writing), then write each document atomically."""
    import time

    report = BatchReport()
    todo: list[Parsed] = []
    for p in parsed:
        if not force and unchanged(await store.get(p.spec.domain, p.spec.doc_id), p, store.embedder.model_id):
            report.unchanged.append(p.spec.doc_id)
        else:
            todo.append(p)
    if total:
        total(sum(len(p.chunks) for p in todo))
    start = time.perf_counter()
    prepared: list[Prepared] = []
    for p in todo:
        prepared.append(Prepared(p, await store.embedder.embed(p.texts()), store.embedder.model_id))
        if on_chunks:
            on_chunks(len(p.chunks))
    report.embed_seconds = time.perf_counter() - start
    report.chunks_embedded = sum(len(p.chunks) for p in todo)
    for doc in prepared:
        report.written.append(await store.put(doc))
    return report
