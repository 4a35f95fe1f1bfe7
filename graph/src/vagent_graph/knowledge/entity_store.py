"""The entity store: one FalkorDB graph per tenant domain, read only through the entity filter.

Data model (key `redis_keys.entity_graph(prefix, domain)`, so crossing domains is impossible
by construction): nodes `(:Entity {id, name, name_lc, entity_type, tags, description})`, with
an index on `id`; edges `(:Entity)-[:REL {type}]->(:Entity)`. The relation type is a property
of ONE relationship type, never a label spliced into Cypher text. The query texts, the
parameter encoding and the reply decoding are pure and live in cypher.py; this module does
the I/O.

Why no `falkordb` client (it is not a dependency): the service already has an async redis-py
connection, and the graph commands used here (GRAPH.QUERY, GRAPH.RO_QUERY, GRAPH.DELETE) need
nothing but `execute_command` on it. What the client would add, cypher.py does more strictly:
it writes the `CYPHER name=value` header itself, refuses NUL and unencodable strings before
anything is sent, names parameters only with validated identifiers, and reads compact
replies, where every value carries its type.

Writes are atomic for readers: a replace builds the new graph under a temporary key and
swaps it in with RENAME (FalkorDB supports renaming graph keys); a merge is ONE query, which
FalkorDB applies entirely or (on any error) not at all.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import structlog
from pydantic import TypeAdapter, ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from vagent_graph.knowledge.cypher import (
    COUNTS,
    CREATE_ENTITIES,
    CREATE_RELATIONS,
    INDEX,
    MERGE,
    ReplyError,
    as_text,
    assemble,
    entity_of,
    entity_row,
    matches_query,
    params_header,
    relation_row,
    relations_query,
    result_rows,
)
from vagent_graph.knowledge.entities import EntityGraph, EntityLookup
from vagent_graph.knowledge.entity_filter import FALSE, entity_predicate
from vagent_graph.knowledge.readers import Readers
from vagent_shared import redis_keys
from vagent_shared.knowledge import Domain, EntityLoadResult

log = structlog.get_logger(__name__)

#: Rows per write query while building a replacement graph (bounded command size).
BATCH = 500
#: A replacement under construction that was abandoned (a killed loader) expires.
LOADING_TTL_S = 24 * 3600
LOOKUP_TIMEOUT_MS = 5000
#: A whole lookup (both queries, connecting included) ends after this: with the entity Redis
#: away or hung, the tool answers "unavailable" instead of holding the user's answer.
LOOKUP_DEADLINE_S = 8.0
MAX_LIMIT = 50
MAX_RELATIONS = 50
MAX_QUERY_CHARS = 200
_EMPTY_KEY = "empty key"
_DOMAIN: TypeAdapter[str] = TypeAdapter(Domain)


class EntityStoreError(RuntimeError):
    """A write did not produce what it should have; nothing visible was changed."""


class EntityStoreUnavailable(EntityStoreError):
    """The entity Redis did not answer in time (down, hung, or unreachable)."""


def _rows(reply: Any) -> list[list[object]]:
    """`result_rows`, with an unreadable reply reported as the store's own error."""
    try:
        return result_rows(reply)
    except ReplyError as exc:
        raise EntityStoreError(str(exc)) from exc


def _batches(rows: list[dict[str, object]], size: int) -> Iterator[list[dict[str, object]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def searchable(query: str) -> bool:
    """A query that can match something: names and ids are printable, so anything else
    cannot, and is not sent."""
    return 0 < len(query) <= MAX_QUERY_CHARS and query.isprintable()


class EntityStore:
    """Entities and relations of every domain, in FalkorDB graphs inside `redis`."""

    def __init__(
        self,
        redis: Redis,
        prefix: str = "vagent_kg",
        *,
        batch_size: int = BATCH,
        deadline_s: float = LOOKUP_DEADLINE_S,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._batch = max(1, batch_size)
        self._deadline = deadline_s

    def key(self, domain: str) -> str:
        """The graph key of `domain` (a valid domain name, or ValueError)."""
        try:
            return redis_keys.entity_graph(self._prefix, _DOMAIN.validate_python(domain))
        except ValidationError as exc:
            raise ValueError(f"invalid domain {domain!r}") from exc

    async def available(self) -> bool:
        """Whether the Redis answers and has the FalkorDB (`graph`) module loaded."""
        try:
            modules = await self._redis.module_list()
        except (RedisError, OSError):
            return False
        return any(as_text(m.get(b"name", m.get("name", ""))).lower() == "graph" for m in modules)

    # -- low level --------------------------------------------------------------------------

    async def _command(self, *args: object) -> Any:
        """A module command (redis-py has no typed method for GRAPH.*)."""
        return await self._redis.execute_command(*args)  # type: ignore[no-untyped-call]

    async def _write(
        self, key: str, query: str, params: Mapping[str, object] | None = None
    ) -> list[list[object]]:
        reply = await self._command("GRAPH.QUERY", key, params_header(params or {}) + query, "--compact")
        return _rows(reply)

    async def _read(self, key: str, query: str, params: Mapping[str, object]) -> list[list[object]]:
        """A read-only query; a domain without a graph reads as empty (never created)."""
        try:
            reply = await self._command(
                "GRAPH.RO_QUERY",
                key,
                params_header(params) + query,
                "--compact",
                "timeout",
                LOOKUP_TIMEOUT_MS,
            )
        except ResponseError as exc:
            if _EMPTY_KEY in str(exc):
                return []
            raise
        return _rows(reply)

    async def _ensure_index(self, key: str) -> None:
        try:
            await self._write(key, INDEX)
        except ResponseError as exc:
            if "already indexed" not in str(exc):
                raise

    # -- writes -----------------------------------------------------------------------------

    async def load(self, domain: str, graph: EntityGraph, *, replace: bool) -> EntityLoadResult:
        """Load `graph` into `domain`: `replace` swaps in a graph of exactly these entities;
        otherwise entities are merged by id (updated or added) and relations added. Readers
        see the old state or the new one, never a mix; a failure changes nothing."""
        key = self.key(domain)
        if replace:
            await self._replace(key, graph)
        else:
            await self._merge(key, graph)
        log.info(
            "entities_loaded",
            domain=domain,
            entities=len(graph.entities),
            relations=len(graph.relations),
            replaced=replace,
        )
        return EntityLoadResult(
            domain=domain, entities=len(graph.entities), relations=len(graph.relations), replaced=replace
        )

    async def _replace(self, key: str, graph: EntityGraph) -> None:
        """Build under a key no domain can have (`prefix~loading:...`), check it, then
        RENAME it over the live graph in one transaction (PERSIST drops the safety TTL)."""
        tmp = f"{self._prefix}~loading:{uuid.uuid4().hex}"
        try:
            await self._write(tmp, INDEX)
            await self._redis.expire(tmp, LOADING_TTL_S)
            await self._fill(tmp, graph)
            if await self._count(tmp) != (len(graph.entities), len(graph.relations)):
                raise EntityStoreError("the new graph is incomplete; the old one was kept")
            async with self._redis.pipeline(transaction=True) as tx:
                tx.rename(tmp, key)
                tx.persist(key)
                await tx.execute()
        except BaseException:
            await self._discard(tmp)
            raise

    async def _fill(self, key: str, graph: EntityGraph) -> None:
        for rows in _batches([entity_row(e) for e in graph.entities], self._batch):
            await self._write(key, CREATE_ENTITIES, {"rows": rows})
        for rows in _batches([relation_row(r) for r in graph.relations], self._batch):
            created = await self._write(key, CREATE_RELATIONS, {"rows": rows})
            if created != [[len(rows)]]:
                raise EntityStoreError("a relation's entity is missing; the old graph was kept")

    async def _discard(self, tmp: str) -> None:
        """Best effort: an abandoned temporary graph would expire anyway."""
        try:
            await self._redis.unlink(tmp)
        except (RedisError, OSError):
            log.warning("entity_graph_cleanup_failed", key=tmp)

    async def _merge(self, key: str, graph: EntityGraph) -> None:
        await self._ensure_index(key)
        params = {
            "entities": [entity_row(e) for e in graph.entities],
            "relations": [relation_row(r) for r in graph.relations],
            "expected": len(graph.relations),
        }
        try:
            await self._write(key, MERGE, params)
        except ResponseError as exc:
            if "Division by zero" in str(exc):
                raise EntityStoreError("a relation's entity is missing; nothing was changed") from None
            raise

    async def delete_domain(self, domain: str) -> bool:
        """Remove the domain's graph; False if it had none."""
        try:
            await self._command("GRAPH.DELETE", self.key(domain))
        except ResponseError as exc:
            if _EMPTY_KEY in str(exc):
                return False
            raise
        return True

    # -- reads ------------------------------------------------------------------------------

    async def counts(self, domain: str) -> tuple[int, int]:
        """(entities, relations) of the domain, for operators (no access filter: admin only)."""
        return await self._count(self.key(domain))

    async def _count(self, key: str) -> tuple[int, int]:
        rows = await self._read(key, COUNTS, {})
        if not rows:
            return 0, 0
        nodes, edges = rows[0]
        if not (isinstance(nodes, int) and isinstance(edges, int)):
            raise EntityStoreError("unexpected reply to a count")
        return nodes, edges

    async def lookup(
        self,
        readers: Readers | None,
        query: str,
        *,
        depth: int = 1,
        limit: int = 10,
        max_relations: int = MAX_RELATIONS,
    ) -> EntityLookup:
        """Entities the readers may ALL see whose name contains `query` (case-insensitively)
        or whose id is `query`, and the relations within `depth` (1 or 2) hops along which
        every node is allowed. Nothing may be seen (None, a reader who sees nothing), or a
        query no name can contain: an empty answer, and no query is sent."""
        if depth not in (1, 2):
            raise ValueError("depth must be 1 or 2")
        query = query.strip()
        if readers is None or not searchable(query):
            return EntityLookup()
        pred, params = entity_predicate(readers, "n")
        if pred == FALSE:
            return EntityLookup()
        try:
            key = self.key(readers.domain)
        except ValueError:
            return EntityLookup()  # no graph can exist for a domain that cannot be loaded
        limit = max(1, min(limit, MAX_LIMIT))
        params = {**params, "q": query, "q_lc": query.lower(), "limit": limit + 1}
        try:
            async with asyncio.timeout(self._deadline):
                rows = await self._read(key, matches_query(pred), params)
                matches = [entity_of(r) for r in rows[:limit]]
                found = EntityLookup(matches=matches, truncated=len(rows) > limit)
                if not matches:
                    return found
                return await self._related(key, readers, found, depth, max(1, max_relations))
        except TimeoutError:
            raise EntityStoreUnavailable(f"no answer within {self._deadline:g} s") from None

    async def _related(
        self, key: str, readers: Readers, found: EntityLookup, depth: int, max_relations: int
    ) -> EntityLookup:
        """The relations around the matches, in a second query. A replace may swap the graph
        in between; as every node of every path is filtered again here, what comes back is
        allowed in the graph it was read from either way."""
        preds = {var: entity_predicate(readers, var) for var in ("a", "m", "b")}
        params: dict[str, object] = {}
        for _, p in preds.values():
            params.update(p)  # the same names and values for every variable
        params |= {"ids": [e.id for e in found.matches], "rel_limit": max_relations + 1}
        text = relations_query(depth, {var: p[0] for var, p in preds.items()})
        rows = await self._read(key, text, params)
        return assemble(found, rows, max_relations)
