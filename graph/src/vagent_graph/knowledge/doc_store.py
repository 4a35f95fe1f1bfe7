"""The document store: chunks in Redis hashes under the RediSearch index, written atomically.

A document is replaced as a whole in one MULTI/EXEC: its old chunks go and its new ones
come in the same transaction, so a search sees the old version or the new one, never a
mix, never duplicates or stale chunks. One writer at a time (a Redis lock), across the CLI,
the admin API and every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
import structlog
from redis.asyncio import Redis
from redis.exceptions import LockError
from redisvl.index import AsyncSearchIndex

from vagent_graph.knowledge import doc_index
from vagent_graph.knowledge.doc_filter import (
    CATEGORY,
    DOC_ID,
    DOMAIN,
    HAS_TAGS,
    TAGGED,
    TAGS,
    document_filter,
)
from vagent_graph.knowledge.doc_index import (
    EMBEDDING,
    POSITION,
    SECTION,
    SOURCE,
    TEXT,
    TITLE,
    IndexMeta,
    IndexMismatch,
)
from vagent_graph.knowledge.embeddings import Embedder
from vagent_graph.knowledge.ingest import Prepared, embedding_text
from vagent_graph.knowledge.readers import Readers
from vagent_graph.knowledge.retrieval import hybrid_search
from vagent_shared import redis_keys
from vagent_shared.knowledge import TAG_SEPARATOR, DeleteResult, DocumentInfo, IndexStatus, SearchHit

log = structlog.get_logger(__name__)

WRITE_LOCK_SECONDS = 60
WRITE_LOCK_WAIT_SECONDS = 30
Progress = Callable[[int], None]


class StoreBusy(RuntimeError):
    """Another writer (an ingestion, a reindex) holds the index for longer than we wait."""


class DocumentStore:
    def __init__(
        self, redis: Redis, embedder: Embedder, index: str, algorithm: str = "flat", top_k: int = 5
    ) -> None:
        self.redis, self.embedder, self.index, self.algorithm = redis, embedder, index, algorithm
        self.top_k = top_k
        self._search: tuple[IndexMeta, AsyncSearchIndex] | None = None

    # ---- reading -----------------------------------------------------------------------------
    async def search(self, readers: Readers | None, query: str, k: int | None = None) -> list[SearchHit]:
        """The best `k` (default: top_k) chunks every reader may read. Nothing may be read:
        [] at once, before any Redis query or embedding (an empty filter would match all)."""
        flt = document_filter(readers)
        if flt is None:
            return []
        query = query.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate: "?"
        index = await self.search_index()
        if index is None:
            return []
        vector: np.ndarray | Exception
        try:
            vector = (await self.embedder.embed([query]))[0]
        except Exception as exc:  # the embedding model is down: the full-text half still answers
            vector = exc
        return await hybrid_search(index, flt, vector, query, k or self.top_k)

    async def search_index(self) -> AsyncSearchIndex | None:
        """The index to query, or None when nothing was ever ingested; IndexMismatch when it
        was built with another embedding model (its vectors would be meaningless)."""
        meta = await doc_index.read_meta(self.redis, self.index)
        if meta is None:
            return None
        if meta.model_id != self.embedder.model_id:
            raise IndexMismatch(doc_index.mismatch_message(self.index, meta, self.embedder.model_id))
        if self._search is None or self._search[0] != meta:
            self._search = (meta, doc_index.search_index(self.redis, meta, self.index))
        return self._search[1]

    async def get(self, domain: str, doc_id: str) -> DocumentInfo | None:
        raw = await self.redis.hget(redis_keys.doc_meta(self.index, domain, doc_id), "info")  # type: ignore[misc]
        return DocumentInfo.model_validate_json(raw) if raw else None

    async def documents(self, domain: str | None = None) -> list[DocumentInfo]:
        keys = [
            k async for k in self.redis.scan_iter(match=redis_keys.doc_meta_pattern(self.index), count=500)
        ]
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "info")
            raws = await pipe.execute()
        docs = [DocumentInfo.model_validate_json(r) for r in raws if r]
        return sorted(
            (d for d in docs if domain is None or d.domain == domain), key=lambda d: (d.domain, d.doc_id)
        )

    async def status(self) -> IndexStatus:
        meta = await doc_index.read_meta(self.redis, self.index)
        docs = await self.documents()
        return IndexStatus(
            index=self.index,
            embedding_model=meta.model_id if meta else None,
            dimensions=meta.dims if meta else None,
            documents=len(docs),
            chunks=sum(d.chunks for d in docs),
        )

    # ---- writing -----------------------------------------------------------------------------
    @asynccontextmanager
    async def _writing(self, seconds: float = WRITE_LOCK_SECONDS) -> Any:
        lock = self.redis.lock(
            redis_keys.docs_write_lock(self.index), timeout=seconds, blocking_timeout=WRITE_LOCK_WAIT_SECONDS
        )
        if not await lock.acquire():
            raise StoreBusy("another ingestion or reindex is writing the document index; try again later")
        try:
            yield lock
        finally:
            try:
                await lock.release()
            except LockError:  # expired meanwhile: nothing of ours to release
                log.warning("docs_write_lock_expired", index=self.index)

    async def put(self, doc: Prepared) -> DocumentInfo:
        """Write (or replace) one document atomically; IndexMismatch if the index was built
        with another embedding model."""
        p = doc.parsed
        dims = int(doc.vectors.shape[1])
        async with self._writing():  # the index is created by the first writer only
            # Stamped under the lock: of concurrent writers, the one written last is the
            # newest, so the stored version is always the one with the latest ingested_at.
            info = DocumentInfo(
                doc_id=p.spec.doc_id,
                domain=p.spec.domain,
                title=p.title,
                category=p.spec.category,
                tags=list(p.spec.tags),
                source=p.spec.source,
                format=p.format,
                chunks=len(p.chunks),
                sha256=p.sha256,
                embedding_model=doc.model_id,
                ingested_at=datetime.now(UTC),
            )
            await doc_index.ensure_index(self.redis, self.index, doc.model_id, dims, self.algorithm)
            old = await self.get(info.domain, info.doc_id)
            async with self.redis.pipeline(transaction=True) as pipe:
                if old is not None:
                    pipe.delete(*self._chunk_keys(old))
                for chunk, vector in zip(p.chunks, doc.vectors, strict=True):
                    key = redis_keys.doc_chunk(self.index, info.domain, info.doc_id, chunk.position)
                    pipe.hset(
                        key,
                        mapping=self._chunk_fields(info, chunk.section, chunk.text, chunk.position, vector),
                    )
                pipe.hset(
                    redis_keys.doc_meta(self.index, info.domain, info.doc_id), "info", info.model_dump_json()
                )
                await pipe.execute()
        log.info(
            "document_ingested",
            domain=info.domain,
            doc_id=info.doc_id,
            chunks=info.chunks,
            replaced=bool(old),
        )
        return info

    def _meta_key(self, info: DocumentInfo) -> str:
        return redis_keys.doc_meta(self.index, info.domain, info.doc_id)

    def _chunk_keys(self, info: DocumentInfo) -> list[str]:
        return [redis_keys.doc_chunk(self.index, info.domain, info.doc_id, i) for i in range(info.chunks)]

    @staticmethod
    def _chunk_fields(
        info: DocumentInfo, section: str, text: str, position: int, vector: np.ndarray
    ) -> dict[Any, Any]:
        return {
            DOC_ID: info.doc_id,
            DOMAIN: info.domain,
            CATEGORY: info.category,
            TAGS: TAG_SEPARATOR.join(info.tags),
            TAGGED: HAS_TAGS if info.tags else "no",
            TITLE: info.title,
            SECTION: section,
            TEXT: text,
            POSITION: position,
            SOURCE: info.source,
            EMBEDDING: np.asarray(vector, dtype=np.float32).tobytes(),
        }

    async def delete(self, domain: str, doc_id: str) -> DeleteResult | None:
        """Remove a document and all its chunks; None if there is no such document."""
        async with self._writing():
            old = await self.get(domain, doc_id)
            if old is None:
                return None
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(*self._chunk_keys(old), redis_keys.doc_meta(self.index, domain, doc_id))
                await pipe.execute()
        log.info("document_deleted", domain=domain, doc_id=doc_id, chunks=old.chunks)
        return DeleteResult(doc_id=doc_id, domain=domain, deleted_chunks=old.chunks)

    async def reindex(self, progress: Progress | None = None, batch: int = 64) -> int:
        """Embed every chunk again with the configured model, then switch the index to it in
        one transaction (a new definition when the dimensions or algorithm change).
        Returns the number of chunks."""
        async with self._writing() as lock:
            docs = await self.documents()
            keys = [k for d in docs for k in self._chunk_keys(d)]
            texts = await self._embedding_texts(keys)
            vectors: list[np.ndarray] = []
            for i in range(0, len(texts), batch):
                vectors.append(await self.embedder.embed(texts[i : i + batch]))
                await lock.reacquire()  # a long reindex keeps the index to itself
                if progress:
                    progress(len(texts[i : i + batch]))
            dims = int(vectors[0].shape[1]) if vectors else 0
            await self._switch(docs, keys, np.vstack(vectors) if vectors else None, dims)
        return len(keys)

    async def _embedding_texts(self, keys: list[str]) -> list[str]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, [TITLE, SECTION, TEXT])
            rows = await pipe.execute()
        return [embedding_text(*(v.decode() if v else "" for v in row)) for row in rows]

    async def _switch(
        self, docs: list[DocumentInfo], keys: list[str], vectors: np.ndarray | None, dims: int
    ) -> None:
        old = await doc_index.read_meta(self.redis, self.index)
        new = IndexMeta(self.embedder.model_id, dims or (old.dims if old else 0), self.algorithm)
        if vectors is None and old is None:
            return  # nothing ingested, nothing to rebuild
        same_definition = old is not None and (old.dims, old.algorithm) == (new.dims, new.algorithm)
        if not same_definition and old is not None:  # wrong-sized vectors would not be indexed
            await doc_index.drop_definition(self.redis, self.index)
        async with self.redis.pipeline(transaction=True) as pipe:
            for key, vector in zip(keys, vectors if vectors is not None else [], strict=True):
                pipe.hset(key, EMBEDDING, np.asarray(vector, dtype=np.float32).tobytes())
            for d in docs:
                updated = d.model_copy(update={"embedding_model": new.model_id})
                pipe.hset(
                    redis_keys.doc_meta(self.index, d.domain, d.doc_id), "info", updated.model_dump_json()
                )
            pipe.hset(
                redis_keys.docs_index_meta(self.index), mapping={"model_id": new.model_id, "dims": new.dims}
            )
            await pipe.execute()
        if not same_definition:
            await doc_index.create_index(self.redis, self.index, new)
        self._search = None
        log.info("docs_reindexed", index=self.index, model=new.model_id, chunks=len(keys))
