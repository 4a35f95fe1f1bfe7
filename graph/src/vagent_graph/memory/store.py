"""Where memories live: LangGraph's AsyncRedisStore on the service's Redis, its vector index
embedding each memory's text with the documents' embedder (the offline model by default).

One namespace per user and tenant (`redis_keys.memory_namespace`): a query for one user
never reads another's memories, nor another tenant's. Every memory found is re-checked
(`rules.recallable`) before anything reaches the model.

What the library does with our data (langgraph-checkpoint-redis 0.5.2, checked):
- a memory is two JSON documents: `vagent_memory:{ulid}` (prefix = the namespace as one
  escaped text word, key = the memory's id, value = the memory) and
  `vagent_memory_vectors:{ulid}` (prefix, key, the embedding; not the text). Both get the
  memory's TTL; deleting a memory deletes both.
- namespaces are matched as TEXT with a prefix wildcard (`@prefix:memory.U.D*`). Each label
  is a 32-hex word (`memory_label`), so a prefix names exactly one user (and tenant); every
  result is still checked here against the namespace, owner and tenant asked for.
- it works with the service's client as it is (bytes replies: decode_responses off), once
  built around a redisvl incompatibility (`async_redis_store`).
- `search` runs its own KNN on the store's vector index (see there why).

Who heard each memory is pushed down into Redis too: a small tag index of our own over the
same memory documents (`HEARERS_INDEX`: owner, hearers, everywhere) gives the ids of the
memories everyone reading heard, and the KNN ranks only those.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from langgraph.store.base import IndexConfig, SearchItem
from langgraph.store.redis import base as redis_store_base
from langgraph.store.redis.aio import AsyncRedisStore
from langgraph.store.redis.token_unescaper import TokenUnescaper
from pydantic import ValidationError
from redis.asyncio import Redis
from redisvl.exceptions import RedisSearchError
from redisvl.index import AsyncSearchIndex
from redisvl.query import VectorQuery
from redisvl.utils.token_escaper import TokenEscaper

from vagent_graph.knowledge.embeddings import LOCAL_DIMENSIONS, LOCAL_MODEL_ID, Embedder
from vagent_shared import redis_keys
from vagent_shared.memory import Memory, MemoryPolicy

log = structlog.get_logger(__name__)

#: The value field whose text is embedded.
TEXT_FIELD: Final = "text"
#: Index creations lost to another replica that we retry (check-then-create in redisvl).
SETUP_ATTEMPTS: Final = 4
#: Memories read per page when listing (all_of, delete_all).
LIST_PAGE: Final = 1000
#: Query vectors kept: recall pages through one question's results, one search per page.
QUERY_CACHE: Final = 256
#: Questions embedded together at most (a batch is padded to its longest question).
QUESTION_BATCH: Final = 16
#: Batches embedded at once (each in a thread of its own; onnxruntime runs them in parallel):
#: a question that arrives while one batch is embedded starts at once on the other core
#: instead of waiting for it (bench-memory's p99).
QUESTION_WORKERS: Final = 2
MINUTES_PER_DAY: Final = 1440
#: The store's vector field (its schema's name).
EMBEDDING_FIELD: Final = "embedding"
#: Our tag index over the memory documents: who owns and who heard each (recall's pushdown).
HEARERS_INDEX: Final = f"{redis_keys.MEMORY_STORE_PREFIX}_hearers"
HEARERS_SCHEMA: Final = (
    "ON", "JSON", "PREFIX", 1, f"{redis_keys.MEMORY_STORE_PREFIX}:", "SCHEMA",
    "$.key", "AS", "key", "TAG",
    "$.value.owner", "AS", "owner", "TAG",
    "$.value.domain", "AS", "domain", "TAG",
    "$.value.heard_by[*]", "AS", "heard", "TAG",
    "$.value.everywhere", "AS", "everywhere", "TAG",
)  # fmt: skip
#: The most memory ids a hearers query returns (max_per_user's upper bound).
HEARERS_LIMIT: Final = 10_000
_ESCAPER = TokenEscaper()
_UNESCAPER = TokenUnescaper()
_EPOCH = datetime.fromtimestamp(0, UTC)


class _RecentVectors:
    """The last few questions' embeddings, and those being computed. Why: recall reads a
    question's results page by page (one `search` per page), the question's embedding is
    started when the message arrives (`warm`), and embedding is most of a search's cost.
    Questions asked while the model embeds others are embedded together, in one batch (a
    batch of 10 costs ~9 ms of CPU per question against ~13 ms one by one, bench-memory).
    Questions only: a memory's text is embedded without this, so no forgotten text lingers."""

    def __init__(self, embedder: Embedder, size: int = QUERY_CACHE) -> None:
        self.embedder = embedder
        self.size = size
        self._rows: OrderedDict[str, asyncio.Future[list[float]]] = OrderedDict()
        self._queued: list[str] = []
        self._workers: set[asyncio.Task[None]] = set()

    async def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        futures = [self.warm(t) for t in texts]
        # Shielded: a caller that gives up does not cancel another's wait for the same text.
        return [await asyncio.shield(f) for f in futures]

    def warm(self, text: str) -> asyncio.Future[list[float]]:
        """The text's embedding: cached, being computed, or queued now (without waiting)."""
        future = self._rows.get(text)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            future = asyncio.get_running_loop().create_future()
            self._rows[text] = future
            self._queued.append(text)
            if sum(not w.done() for w in self._workers) < QUESTION_WORKERS:
                worker = asyncio.create_task(self._embed_queued(), name="memory-question-vectors")
                self._workers.add(worker)
                worker.add_done_callback(self._workers.discard)
        self._rows.move_to_end(text)
        self._evict()
        return future

    def _evict(self) -> None:
        """Beyond `size`, the oldest finished entries go (one still wanted stays)."""
        if len(self._rows) <= self.size:  # the usual case: nothing to scan
            return
        for text in [t for t, f in self._rows.items() if f.done()][: len(self._rows) - self.size]:
            del self._rows[text]

    async def _embed_queued(self) -> None:
        while self._queued:
            batch, self._queued = self._queued[:QUESTION_BATCH], self._queued[QUESTION_BATCH:]
            try:
                rows = (await self.embedder.embed(batch)).tolist()
            except Exception as exc:  # every waiter gets it; none stays cached
                for text in batch:
                    future = self._rows.pop(text, None)
                    if future is not None and not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: an unawaited warm-up logs nothing
                continue
            for text, row in zip(batch, rows, strict=True):
                future = self._rows.get(text)
                if future is not None and not future.done():
                    future.set_result(row)
            self._evict()

    async def aclose(self) -> None:
        """Stop embedding (the service ends): waiters are cancelled, nothing is kept."""
        workers = list(self._workers)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._workers.clear()
        for future in self._rows.values():
            future.cancel()
        self._rows.clear()
        self._queued.clear()


def namespace_text(namespace: tuple[str, ...]) -> str:
    """A namespace as the store writes it in a document's `prefix` (one escaped word)."""
    return str(_ESCAPER.escape(".".join(namespace)))


def decode_namespace(text: str) -> tuple[str, ...]:
    """A document's `prefix` back into the namespace (the store's own unescaping)."""
    return tuple(_UNESCAPER.unescape(text).split("."))


def ttl_minutes(policy: MemoryPolicy) -> int:
    """The Redis TTL of a memory written under `policy`, in the store's unit (minutes)."""
    return policy.ttl_days * MINUTES_PER_DAY


def oldest_first(memories: Sequence[Memory]) -> list[Memory]:
    return sorted(memories, key=lambda m: (m.created_at, m.id))


def beyond_limit(memories: Sequence[Memory], max_per_user: int) -> list[Memory]:
    """The oldest memories to drop so that at most `max_per_user` remain."""
    ordered = oldest_first(memories)
    return ordered[: max(0, len(ordered) - max_per_user)]


def parsed(item: SearchItem, namespace: tuple[str, ...], owner: str, domain: str | None) -> Memory | None:
    """The memory an item holds if it is the owner's, in `namespace` (and `domain`); None
    (logged without its text) when it does not parse or belongs elsewhere."""
    exact = (
        item.namespace == namespace if domain is not None else item.namespace[: len(namespace)] == namespace
    )
    if not exact:
        log.warning("memory_foreign_namespace_skipped", key=item.key)
        return None
    try:
        memory = Memory.model_validate(item.value)
    except ValidationError as exc:
        log.warning("memory_unreadable_skipped", key=item.key, errors=exc.error_count())
        return None
    if memory.owner != owner or (domain is not None and memory.domain != domain):
        log.warning("memory_foreign_owner_skipped", key=item.key)
        return None
    if redis_keys.memory_namespace(memory.owner, memory.domain) != item.namespace:
        log.warning("memory_misfiled_skipped", key=item.key)
        return None
    return memory


class MemoryStore:
    """The memories of every user: one AsyncRedisStore namespace per user and tenant."""

    def __init__(self, redis: Redis, embedder: Embedder, dims: int | None = None) -> None:
        """`dims`: the embedder's vector length (None: 384 for the offline model, else asked
        of the embedder at setup)."""
        self.redis = redis
        self.embedder = embedder
        self.dims = (
            dims if dims is not None else (LOCAL_DIMENSIONS if embedder.model_id == LOCAL_MODEL_ID else None)
        )
        self._vectors = _RecentVectors(embedder)
        self._store: AsyncRedisStore | None = None
        self._lock = asyncio.Lock()

    async def _embed_texts(self, texts: Sequence[str]) -> list[list[float]]:
        """The store's embedding function (memories' texts, as they are written)."""
        rows: list[list[float]] = (await self.embedder.embed(texts)).tolist()
        return rows

    async def _ready(self) -> AsyncRedisStore:
        if self._store is None:
            await self.setup()
        assert self._store is not None
        return self._store

    async def setup(self) -> None:
        """Create the store's indexes (idempotent; safe when several replicas start)."""
        async with self._lock:
            if self._store is not None:
                return
            if self.dims is None:
                self.dims = int((await self.embedder.embed(["dimensions"])).shape[1])
            # Built here, not in __init__: the library's batching task needs a running loop.
            index: IndexConfig = {
                "dims": self.dims,
                "embed": self._embed_texts,
                "fields": [TEXT_FIELD],
            }
            index["distance_type"] = "cosine"  # type: ignore[typeddict-unknown-key]
            store = async_redis_store(self.redis, index)
            await set_up_indexes(store)
            await set_up_hearers_index(self.redis)
            self._store = store

    async def aclose(self) -> None:
        """Stop the library's batching task and our questions' embedding (the Redis client is
        the caller's)."""
        await self._vectors.aclose()
        if self._store is not None:
            await self._store.__aexit__()
            self._store = None

    async def add(self, memory: Memory, policy: MemoryPolicy) -> list[Memory]:
        """Store `memory` (TTL: policy.ttl_days) in its owner's namespace for its domain; then
        drop the oldest beyond policy.max_per_user and return what was dropped."""
        store = await self._ready()
        namespace = redis_keys.memory_namespace(memory.owner, memory.domain)
        await store.aput(namespace, memory.id, memory.model_dump(mode="json"), ttl=ttl_minutes(policy))
        dropped = beyond_limit(await self.all_of(memory.owner, memory.domain), policy.max_per_user)
        if dropped:
            await self._delete(store, dropped)
        return dropped

    async def all_of(self, owner: str, domain: str | None = None) -> list[Memory]:
        """The owner's memories in `domain` (None: every tenant), oldest first."""
        store = await self._ready()
        namespace = redis_keys.memory_namespace(owner, domain)
        found: list[Memory] = []
        offset = 0
        while True:
            items = await store.asearch(namespace, limit=LIST_PAGE, offset=offset, refresh_ttl=False)
            found += [m for m in (parsed(i, namespace, owner, domain) for i in items) if m is not None]
            if len(items) < LIST_PAGE:
                break
            offset += LIST_PAGE
        return oldest_first(list({m.id: m for m in found}.values()))

    def warm(self, query: str) -> None:
        """Start embedding a question a search will soon be made for (returns at once)."""
        if query.strip():
            self._vectors.warm(query)

    async def search(
        self,
        owner: str,
        domain: str,
        query: str,
        limit: int,
        offset: int = 0,
        hearers: Collection[str] | None = (),
        heard: Collection[str] | None = None,
    ) -> list[Memory]:
        """The owner's memories in `domain` most relevant to `query` first (vector search).
        `hearers`: only memories heard by every one of them, or said `--everywhere` (None:
        only the latter; empty: no condition). Pushed down into Redis, never trusted alone:
        recall judges every memory found again (rules.py). `heard`: the ids `heard_ids`
        gave for these hearers already (recall asks once, for every page).

        On the store's own vector index, but not through its `asearch`: that path cost
        ~5x the Redis work at 20 concurrent conversations (bench-memory: every request queued
        through the store's batching task, a JSON client built per result, the whole
        document fetched) and pages wrongly (KNN k = limit, then `offset` of those skipped:
        a second page was always empty). Here: one KNN (k = offset + limit) filtered by the
        namespace, then one pipeline reading each hit's namespace and value."""
        store = await self._ready()
        namespace = redis_keys.memory_namespace(owner, domain)
        if not query.strip():  # nothing to compare with: the listing's order
            items = await store.asearch(namespace, limit=limit, offset=offset, refresh_ttl=False)
            return [m for m in (parsed(i, namespace, owner, domain) for i in items) if m is not None]
        where = f"@prefix:{namespace_text(namespace)}*"
        if hearers is None or hearers:
            if heard is None:
                heard = await self.heard_ids(owner, domain, hearers)
            if not heard:
                return []
            where += " @key:{" + "|".join(tag(i) for i in heard) + "}"
        vector = (await self._vectors([query]))[0]
        knn = VectorQuery(
            vector=vector,
            vector_field_name=EMBEDDING_FIELD,
            return_fields=["key"],
            filter_expression=where,
            num_results=offset + limit,
        )
        knn.paging(offset, limit)
        hits = await store.vector_index.query(knn)
        keys = [f"{redis_keys.MEMORY_STORE_PREFIX}:{str(hit['id']).split(':', 1)[1]}" for hit in hits]
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.execute_command("JSON.GET", key, "$.prefix", "$.key", "$.value")
            raws = await pipe.execute()
        found = []
        for raw in raws:
            if raw is None:  # expired or deleted since the KNN
                continue
            doc = json.loads(raw) if isinstance(raw, str | bytes) else raw  # parsed by redis-py or not
            if not isinstance(doc, dict) or not doc.get("$.prefix") or not doc.get("$.value"):
                continue
            item = SearchItem(
                namespace=decode_namespace(doc["$.prefix"][0]),
                key=str(doc["$.key"][0]),
                value=doc["$.value"][0],
                created_at=_EPOCH,
                updated_at=_EPOCH,
            )
            memory = parsed(item, namespace, owner, domain)
            if memory is not None:
                found.append(memory)
        return found

    async def heard_ids(self, owner: str, domain: str, hearers: Collection[str] | None) -> list[str]:
        """The ids of the owner's memories in `domain` heard by all of `hearers` or said
        `--everywhere` (None: only those)."""
        condition = "@everywhere:{true}"
        if hearers:
            every = " ".join("@heard:{" + tag(h) + "}" for h in sorted(hearers))
            condition = f"({condition} | ({every}))"
        reply = await self.redis.execute_command(  # type: ignore[no-untyped-call]
            "FT.SEARCH", HEARERS_INDEX, f"{owned(owner, domain)} {condition}",
            "RETURN", 1, "key", "LIMIT", 0, HEARERS_LIMIT, "DIALECT", 2,
        )  # fmt: skip
        return hearers_reply_ids(reply)

    async def count(self, owner: str, domain: str) -> int:
        """How many memories the owner has in `domain` (one counting query, no document read)."""
        reply = await self.redis.execute_command(  # type: ignore[no-untyped-call]
            "FT.SEARCH", HEARERS_INDEX, owned(owner, domain), "LIMIT", 0, 0, "DIALECT", 2
        )
        if isinstance(reply, dict):
            return int(reply.get(b"total_results") or reply.get("total_results") or 0)
        return int(reply[0])

    async def delete(self, owner: str, domain: str | None, ids: Sequence[str]) -> int:
        """Delete these of the owner's memories (None: in any tenant); how many were deleted."""
        store = await self._ready()
        wanted = set(ids)
        found = [m for m in await self.all_of(owner, domain) if m.id in wanted]
        return await self._delete(store, found)

    async def delete_all(self, owner: str, domain: str | None = None) -> int:
        """Delete all of the owner's memories in `domain` (None: every tenant); how many."""
        store = await self._ready()
        return await self._delete(store, await self.all_of(owner, domain))

    async def _delete(self, store: AsyncRedisStore, memories: Sequence[Memory]) -> int:
        """Both documents of each memory (the library deletes the vector with the value)."""
        if memories:
            await asyncio.gather(
                *(store.adelete(redis_keys.memory_namespace(m.owner, m.domain), m.id) for m in memories)
            )
        return len(memories)


def async_redis_store(redis: Redis, index: IndexConfig) -> AsyncRedisStore:
    """AsyncRedisStore on the service's client, under the memory prefixes.

    Why the swap: AsyncRedisStore.__init__ (langgraph-checkpoint-redis 0.5.2) first runs
    BaseRedisStore.__init__, which builds *sync* redisvl SearchIndexes on the client, then
    replaces both with AsyncSearchIndexes. redisvl 0.28 refuses an asyncio client in a sync
    SearchIndex (TypeError), so the store cannot be built at all. While it is built (plain
    synchronous code: nothing else runs on the loop meanwhile), the base module's
    `SearchIndex` is the async class; what it builds is replaced right after anyway."""
    original = redis_store_base.SearchIndex  # type: ignore[attr-defined]
    redis_store_base.SearchIndex = AsyncSearchIndex  # type: ignore[attr-defined]
    try:
        return AsyncRedisStore(
            redis_client=redis,
            index=index,
            store_prefix=redis_keys.MEMORY_STORE_PREFIX,
            vector_prefix=redis_keys.MEMORY_VECTOR_PREFIX,
        )
    finally:
        redis_store_base.SearchIndex = original  # type: ignore[attr-defined]


async def set_up_indexes(store: AsyncRedisStore) -> None:
    """The store's two search indexes, also when replicas start at the same moment.

    Why: redisvl's create checks whether the index exists, then creates it; a replica that
    loses that race gets "Index already exists" (as the checkpointer's did). Another try sees
    the index. Then the vector index must have our vector length: one built for another
    embedding model would fail every search."""
    for attempt in range(1, SETUP_ATTEMPTS + 1):
        try:
            await store.setup()
            break
        except RedisSearchError as exc:
            if "already exists" not in str(exc) or attempt == SETUP_ATTEMPTS:
                raise
    built = await vector_dims(store)
    wanted = store.index_config["dims"] if store.index_config else None
    if built is not None and wanted is not None and built != wanted:
        raise RuntimeError(
            f"The memory index '{redis_keys.MEMORY_VECTOR_PREFIX}' holds {built}-dimensional vectors, "
            f"but the embedding model gives {wanted}: drop that index and its memories, or "
            "configure the model it was built with."
        )


async def set_up_hearers_index(redis: Redis) -> None:
    """HEARERS_INDEX, once (another replica may have just made it)."""
    try:
        await redis.execute_command("FT.CREATE", HEARERS_INDEX, *HEARERS_SCHEMA)  # type: ignore[no-untyped-call]
    except Exception as exc:  # redis-py's ResponseError
        if "already exists" not in str(exc).lower():
            raise


def owned(owner: str, domain: str) -> str:
    """The hearers index's condition for one owner's memories in one tenant."""
    return "@owner:{" + tag(owner) + "} @domain:{" + tag(domain) + "}"


def tag(value: str) -> str:
    """`value` as one TAG term (its punctuation escaped)."""
    return str(_ESCAPER.escape(value))


def hearers_reply_ids(reply: Any) -> list[str]:
    """The `key` values of an FT.SEARCH reply (RESP2 list or RESP3 map)."""
    out: list[str] = []
    if isinstance(reply, dict):
        results: list[Any] = reply.get(b"results") or reply.get("results") or []
        for r in results:
            row: dict[Any, Any] = r.get(b"extra_attributes") or r.get("extra_attributes") or {}
            value = row.get(b"key", row.get("key"))
            if value is not None:
                out.append(value.decode() if isinstance(value, bytes) else str(value))
        return out
    for fields in reply[2::2] if isinstance(reply, list) else ():
        pairs = _pairs(fields)
        if "key" in pairs:
            value = pairs["key"]
            out.append(value.decode() if isinstance(value, bytes) else str(value))
    return out


async def vector_dims(store: AsyncRedisStore) -> int | None:
    """The vector length the memory vector index was built with (None: unknown)."""
    info: dict[str, Any] = await store.vector_index.info()
    for attribute in info.get("attributes", []):
        fields = _pairs(attribute)
        if fields.get("attribute") == "embedding" or fields.get("identifier") == "$.embedding":
            dim = fields.get("dim")
            return int(dim) if dim is not None else None
    return None


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    """FT.INFO's [name, value, name, value, ...] as a dict of str names."""
    text = [x.decode() if isinstance(x, bytes) else x for x in flat]
    return {str(text[i]).lower(): text[i + 1] for i in range(0, len(text) - 1, 2)}
