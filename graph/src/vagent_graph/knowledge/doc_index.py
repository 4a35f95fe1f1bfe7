"""The RediSearch document index (redisvl): one index, vector + full text on the same chunks.

Chunks are Redis hashes under `{index}:chunk:` (vagent_shared.redis_keys). The index
records which embedding model built it (`{index}:meta`); vectors of two models are never
mixed: a different model is refused until `vagent docs reindex` has rebuilt the vectors.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from redis.asyncio import Redis
from redisvl.index import AsyncSearchIndex
from redisvl.schema import IndexSchema

from vagent_graph.knowledge.doc_filter import CATEGORY, DOC_ID, DOMAIN, TAGGED, TAGS
from vagent_shared import redis_keys
from vagent_shared.knowledge import TAG_SEPARATOR

log = structlog.get_logger(__name__)

TITLE, SECTION, TEXT, POSITION, SOURCE, EMBEDDING = (
    "title",
    "section",
    "text",
    "position",
    "source",
    "embedding",
)
#: Full-text fields and their weights: a match in a title counts more than one in the body.
TEXT_WEIGHTS = {TITLE: 3.0, SECTION: 2.0, TEXT: 1.0}
#: HNSW search breadth (used when DOCS_VECTOR_ALGORITHM=hnsw): higher is closer to exact.
HNSW_EF_RUNTIME = 200


class IndexMismatch(RuntimeError):
    """The index was built with another embedding model; the message says what to do."""


@dataclass(frozen=True)
class IndexMeta:
    model_id: str
    dims: int
    algorithm: str


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _tag(name: str) -> dict[str, Any]:
    return {"name": name, "type": "tag", "attrs": {"case_sensitive": True, "separator": TAG_SEPARATOR}}


def index_schema(index: str, dims: int, algorithm: str) -> IndexSchema:
    """Tags are case-sensitive: a grant of `document:Q3` must not also open `q3`."""
    vector: dict[str, Any] = {"dims": dims, "distance_metric": "cosine", "datatype": "float32"}
    vector["algorithm"] = algorithm
    if algorithm == "hnsw":
        vector["ef_runtime"] = HNSW_EF_RUNTIME
    return IndexSchema.from_dict(
        {
            "index": {
                "name": index,
                "prefix": redis_keys.doc_chunk_prefix(index),
                "key_separator": ":",
                "storage_type": "hash",
            },
            "fields": [
                _tag(DOC_ID),
                _tag(DOMAIN),
                _tag(CATEGORY),
                _tag(TAGS),
                _tag(TAGGED),
                *({"name": n, "type": "text", "attrs": {"weight": w}} for n, w in TEXT_WEIGHTS.items()),
                {"name": POSITION, "type": "numeric"},
                {"name": EMBEDDING, "type": "vector", "attrs": vector},
            ],
        }
    )


def mismatch_message(index: str, built: IndexMeta, model_id: str) -> str:
    return (
        f"The document index '{index}' was built with the embedding model '{built.model_id}', "
        f"but the configured model is '{model_id}'. Run `vagent docs reindex` to rebuild its "
        "vectors (or configure the model it was built with)."
    )


async def read_meta(redis: Redis, index: str) -> IndexMeta | None:
    raw = await redis.hgetall(redis_keys.docs_index_meta(index))  # type: ignore[misc]
    if not raw:
        return None
    fields = {_text(k): _text(v) for k, v in raw.items()}
    return IndexMeta(fields["model_id"], int(fields["dims"]), fields.get("algorithm", "flat"))


def search_index(redis: Redis, meta: IndexMeta, index: str) -> AsyncSearchIndex:
    return AsyncSearchIndex(index_schema(index, meta.dims, meta.algorithm), redis_client=redis)


async def drop_definition(redis: Redis, index: str) -> None:
    """Drop the index definition, keeping the chunks (FT.DROPINDEX without DD)."""
    listed = await redis.execute_command("FT._LIST")  # type: ignore[no-untyped-call]
    if index in {_text(n) for n in listed}:
        await redis.execute_command("FT.DROPINDEX", index)  # type: ignore[no-untyped-call]


async def wait_indexed(search: AsyncSearchIndex, limit_seconds: float = 300.0) -> None:
    """FT.CREATE over existing hashes indexes them in the background: wait until done, so a
    search right after sees every chunk."""
    async with asyncio.timeout(limit_seconds):
        while True:
            details = await search.info()
            if float(details.get("percent_indexed", 1)) >= 1 and not int(details.get("indexing", 0)):
                return
            await asyncio.sleep(0.05)


async def create_index(redis: Redis, index: str, meta: IndexMeta) -> AsyncSearchIndex:
    """(Re)create the index definition over the existing chunk hashes, then record `meta`."""
    search = search_index(redis, meta, index)
    await drop_definition(redis, index)
    await search.create(overwrite=False)
    await wait_indexed(search)
    await redis.hset(  # type: ignore[misc]
        redis_keys.docs_index_meta(index),
        mapping={
            "model_id": meta.model_id,
            "dims": meta.dims,
            "algorithm": meta.algorithm,
            "created_at": datetime.now(UTC).isoformat(),
        },
    )
    log.info("docs_index_created", index=index, model=meta.model_id, dims=meta.dims, algorithm=meta.algorithm)
    return search


async def ensure_index(
    redis: Redis, index: str, model_id: str, dims: int, algorithm: str
) -> AsyncSearchIndex:
    """The index for writing vectors of `model_id`: created on first use, refused if it was
    built with another model (IndexMismatch)."""
    meta = await read_meta(redis, index)
    if meta is None:
        return await create_index(redis, index, IndexMeta(model_id, dims, algorithm))
    if meta.model_id != model_id or meta.dims != dims:
        raise IndexMismatch(mismatch_message(index, meta, model_id))
    search = search_index(redis, meta, index)
    if not await search.exists():  # the definition was dropped by hand: rebuild it over the chunks
        return await create_index(redis, index, meta)
    return search
