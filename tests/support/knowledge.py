"""Documents in a real Redis index for tests: one embedder per process, an index per test."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import numpy as np
from redis.asyncio import Redis

from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.embeddings import Embedder, LocalEmbedder
from vagent_graph.knowledge.ingest import embed, parse, spec
from vagent_shared.knowledge import DocumentFormat, DocumentInfo


@functools.cache
def local_embedder() -> LocalEmbedder:
    """The offline model, loaded once for the whole test session (~0.5 s)."""
    return LocalEmbedder()


class RecordingEmbedder:
    """The offline model, recording each batch it is given; `fail` makes the next call fail
    (an embeddings endpoint that is down)."""

    def __init__(self) -> None:
        self.inner = local_embedder()
        self.model_id = self.inner.model_id
        self.batches: list[list[str]] = []
        self.fail = False
        self.called = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        self.called.set()
        if self.fail:
            self.fail = False
            raise RuntimeError("embedding endpoint down")
        return await self.inner.embed(texts)


@asynccontextmanager
async def doc_store(
    redis_url: str, embedder: Embedder | None = None, algorithm: str = "flat", index: str | None = None
) -> AsyncIterator[DocumentStore]:
    """A DocumentStore on a fresh index name, removed (with its keys) afterwards."""
    name = index or f"test_docs_{uuid.uuid4().hex[:10]}"
    redis = Redis.from_url(redis_url)
    try:
        yield DocumentStore(redis, embedder or local_embedder(), name, algorithm)
    finally:
        try:
            await redis.execute_command("FT.DROPINDEX", name)  # type: ignore[no-untyped-call]
        except Exception:
            pass
        keys = [k async for k in redis.scan_iter(match=f"{name}:*", count=1000)]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def ingest(
    store: DocumentStore,
    doc_id: str,
    text: str,
    *,
    domain: str = "acme",
    category: str = "general",
    tags: tuple[str, ...] = (),
    fmt: DocumentFormat = "markdown",
    title: str | None = None,
) -> DocumentInfo:
    """Parse, chunk, embed and write one document, as `vagent docs ingest` does."""
    doc = spec(doc_id=doc_id, domain=domain, category=category, tags=tags, title=title)
    return await store.put(await embed(parse(text.encode(), fmt, f"{doc_id}.md", doc), store.embedder))
