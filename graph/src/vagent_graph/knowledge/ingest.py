"""From a file's bytes to chunks and vectors, ready to be written in one transaction.

Everything that can fail (reading, parsing, validating metadata, embedding) happens here,
before the store writes anything: a bad file leaves the index as it was.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vagent_graph.knowledge.chunking import Chunk, chunk_document
from vagent_graph.knowledge.embeddings import Embedder
from vagent_graph.knowledge.parsing import DocumentError, parse_document
from vagent_shared.knowledge import DocId, DocumentFormat, Domain, Label
from vagent_shared.validation import problems


class DocumentSpec(BaseModel):
    """What the operator says about a document (CLI flags, manifest, admin API)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    doc_id: DocId
    domain: Domain
    category: Label
    tags: tuple[Label, ...] = ()
    title: str | None = Field(default=None, max_length=300)
    source: str = Field(default="", max_length=1000)


def spec(**fields: object) -> DocumentSpec:
    """A DocumentSpec, or DocumentError with a readable list of what is wrong."""
    try:
        return DocumentSpec.model_validate(fields)
    except ValidationError as exc:
        raise DocumentError(f"invalid document metadata: {problems(exc)}") from None


def doc_id_from_path(path: Path) -> str:
    """The default id of a file's document: its name without extension, as a slug, so
    re-ingesting the same file replaces the same document."""
    slug = re.sub(r"[^\w.-]+", "-", path.stem.strip().lower()).strip("-.")
    return slug or "document"


def embedding_text(title: str, section: str, text: str) -> str:
    """What is embedded for a chunk: its text in the context of its title and section."""
    head = " — ".join(p for p in (title, section) if p)
    return f"{head}\n{text}" if head else text


@dataclass(frozen=True)
class Parsed:
    """A document parsed and chunked, not yet embedded (cheap: decides whether to embed)."""

    spec: DocumentSpec
    title: str
    format: DocumentFormat
    sha256: str
    chunks: list[Chunk]

    def texts(self) -> list[str]:
        return [embedding_text(self.title, c.section, c.text) for c in self.chunks]


@dataclass(frozen=True)
class Prepared:
    parsed: Parsed
    vectors: np.ndarray
    model_id: str


def parse(data: bytes, fmt: DocumentFormat, name: str, doc: DocumentSpec) -> Parsed:
    """Parse and chunk; DocumentError (naming `name`) when the file cannot be used."""
    parsed = parse_document(data, fmt, name=name)
    chunks = chunk_document(parsed)
    if not chunks:
        raise DocumentError(f"{name}: no text to index")
    title = (doc.title or parsed.title or doc.doc_id).strip()
    return Parsed(doc, title, fmt, hashlib.sha256(data).hexdigest(), chunks)


async def embed(parsed: Parsed, embedder: Embedder) -> Prepared:
    vectors = await embedder.embed(parsed.texts())
    return Prepared(parsed, vectors, embedder.model_id)


async def embed_all(items: Sequence[Parsed], embedder: Embedder) -> list[Prepared]:
    return [await embed(p, embedder) for p in items]
