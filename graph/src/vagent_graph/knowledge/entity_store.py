"""The entity store: one FalkorDB graph per tenant domain, read only through the entity filter.

Data model (key `redis_keys.entity_graph(prefix, domain)`, so crossing domains is impossible
by construction): nodes `(:Entity {id, name, name_lc, entity_type, tags, description})`, with
an index on `id`; edges `(:Entity)-[:REL {type}]->(:Entity)`. The relation type is a property
of ONE relationship type, never a label spliced into Cypher text.

Every value travels as a query parameter. FalkorDB takes parameters as a text header
(`CYPHER name=value ... <query>`) that it parses with its Cypher lexer; this module writes
that header itself (`params_header`) instead of using the `falkordb` client: the same
quoting (backslash and double quote escaped inside double quotes), proven by tests to round-trip
every string, plus what the client does not do: it refuses NUL (FalkorDB cuts the command
at NUL) and unencodable strings before anything is sent, and it names parameters and map
keys only with validated identifiers. Replies are read in the compact format, where every
value carries its type (lists of tags stay lists whatever they contain).

Writes are atomic for readers: a replace builds the new graph under a temporary key and
swaps it in with RENAME (FalkorDB supports renaming graph keys); a merge is ONE query, which
FalkorDB applies entirely or (on any error) not at all.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import structlog
from pydantic import TypeAdapter, ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from vagent_graph.knowledge.entities import Entity, EntityGraph, EntityLookup, Relation
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
MAX_LIMIT = 50
MAX_RELATIONS = 50
MAX_QUERY_CHARS = 200
_EMPTY_KEY = "empty key"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DOMAIN: TypeAdapter[str] = TypeAdapter(Domain)


class EntityStoreError(RuntimeError):
    """A write did not produce what it should have; nothing visible was changed."""


# ---- parameters: the CYPHER header ---------------------------------------------------------


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"not a parameter or key name: {name!r}")
    return f"`{name}`"


def cypher_string(value: str) -> str:
    """A double-quoted Cypher string that FalkorDB reads back as exactly `value`."""
    if "\x00" in value:
        raise ValueError("FalkorDB cannot take a NUL character in a query")
    value.encode("utf-8")  # a lone surrogate raises here, not half-way through a command
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cypher_value(value: object) -> str:
    """A parameter value as header text: strings, ints, booleans, null, lists and maps."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return cypher_string(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_ident(k)}:{cypher_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(cypher_value(v) for v in value) + "]"
    raise TypeError(f"cannot send a {type(value).__name__} as a Cypher parameter")


def params_header(params: Mapping[str, object]) -> str:
    """`CYPHER a=... b=... ` (or nothing), to put before the query text."""
    if not params:
        return ""
    return "CYPHER " + " ".join(f"{_ident(k)}={cypher_value(v)}" for k, v in params.items()) + " "


# ---- replies: the compact format -------------------------------------------------------------


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def compact_value(cell: Any) -> object:
    """One `[type, value]` cell: 1 null, 2 string, 3 integer, 4 boolean, 5 double, 6 array,
    10 map. Nodes, edges and paths are never returned by this module's queries."""
    kind, value = int(cell[0]), cell[1]
    if kind == 1:
        return None
    if kind == 2:
        return _text(value)
    if kind == 3:
        return int(value)
    if kind == 4:
        return _text(value) == "true"
    if kind == 5:
        return float(_text(value))
    if kind == 6:
        return [compact_value(v) for v in value]
    if kind == 10:
        return {_text(value[i]): compact_value(value[i + 1]) for i in range(0, len(value), 2)}
    raise EntityStoreError(f"unexpected value type {kind} in a graph reply")


def result_rows(reply: Any) -> list[list[object]]:
    """The rows of a compact reply (`[header, rows, stats]`; a write without RETURN: `[stats]`)."""
    if not isinstance(reply, list) or len(reply) < 3:
        return []
    return [[compact_value(c) for c in row] for row in reply[1]]


# ---- queries -----------------------------------------------------------------------------------

INDEX = "CREATE INDEX FOR (n:Entity) ON (n.id)"
_SET = (
    "n.name = e.name, n.name_lc = e.name_lc, n.entity_type = e.entity_type, "
    "n.tags = e.tags, n.description = e.description"
)
CREATE_ENTITIES = "UNWIND $rows AS e CREATE (n:Entity {id: e.id}) SET " + _SET
CREATE_RELATIONS = (
    "UNWIND $rows AS r MATCH (a:Entity {id: r.source}), (b:Entity {id: r.target}) "
    "CREATE (a)-[x:REL {type: r.type}]->(b) RETURN count(x)"
)
#: One query, so all or nothing. The last line divides by zero, failing (and so undoing) the
#: whole query, unless every relation found both its ends.
MERGE = (
    "UNWIND $entities AS e MERGE (n:Entity {id: e.id}) SET " + _SET + " "
    "WITH count(n) AS merged "
    "UNWIND $relations AS r MATCH (a:Entity {id: r.source}), (b:Entity {id: r.target}) "
    "MERGE (a)-[x:REL {type: r.type}]->(b) "
    "WITH count(x) AS linked "
    "RETURN linked / CASE WHEN linked = $expected THEN 1 ELSE 0 END"
)
COUNTS = (
    "MATCH (n:Entity) WITH count(n) AS nodes "
    "OPTIONAL MATCH (:Entity)-[r:REL]->(:Entity) RETURN nodes, count(r)"
)


def _fields(var: str) -> str:
    return f"{var}.id, {var}.name, {var}.entity_type, {var}.tags, {var}.description"


def matches_query(pred: str) -> str:
    """Allowed entities whose id is the query or whose name contains it (exact id first)."""
    return (
        "MATCH (n:Entity) WHERE (n.id = $q OR n.name_lc CONTAINS $q_lc) AND " + pred + " "
        "WITH n ORDER BY CASE WHEN n.id = $q THEN 0 ELSE 1 END, n.name, n.id LIMIT $limit "
        f"RETURN {_fields('n')}"
    )


def _edges(pattern: str, where: str) -> str:
    return (
        f"MATCH {pattern} WHERE a.id IN $ids AND {where} "
        "WITH DISTINCT r WITH r, startNode(r) AS s, endNode(r) AS e "
        "WITH s, r, e ORDER BY s.id, r.type, e.id LIMIT $rel_limit "
        f"RETURN {_fields('s')}, r.type AS type, {_fields('e')}"
    )


def relations_query(depth: int, pred: Mapping[str, str]) -> str:
    """Edges on paths of at most `depth` hops from the matches (`$ids`) on which EVERY node
    is allowed (`pred[var]` filters node `var`): a forbidden node cuts the path there."""
    one = _edges("(a:Entity)-[r:REL]-(b:Entity)", f"{pred['a']} AND {pred['b']}")
    if depth == 1:
        return one
    two = _edges(
        "(a:Entity)-[:REL]-(m:Entity)-[r:REL]-(b:Entity)", f"{pred['a']} AND {pred['m']} AND {pred['b']}"
    )
    return f"{one} UNION {two}"


# ---- rows <-> models -----------------------------------------------------------------------


def entity_row(e: Entity) -> dict[str, object]:
    return {
        "id": e.id,
        "name": e.name,
        "name_lc": e.name.lower(),
        "entity_type": e.entity_type,
        "tags": list(e.tags),
        "description": e.description,
    }


def relation_row(r: Relation) -> dict[str, object]:
    return {"source": r.source, "target": r.target, "type": r.type}


def entity_of(values: Sequence[object]) -> Entity:
    """An entity from the five `_fields` columns (validated: the store only holds valid ones)."""
    id_, name, entity_type, tags, description = values
    return Entity.model_validate(
        {"id": id_, "name": name, "entity_type": entity_type, "tags": tags or [], "description": description}
    )


def _batches(rows: list[dict[str, object]], size: int) -> Iterator[list[dict[str, object]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def searchable(query: str) -> bool:
    """A query that can match something: names and ids are printable, so anything else
    cannot, and is not sent."""
    return 0 < len(query) <= MAX_QUERY_CHARS and query.isprintable()


class EntityStore:
    """Entities and relations of every domain, in FalkorDB graphs inside `redis`."""

    def __init__(self, redis: Redis, prefix: str = "vagent_kg", *, batch_size: int = BATCH) -> None:
        self._redis = redis
        self._prefix = prefix
        self._batch = max(1, batch_size)

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
        return any(_text(m.get(b"name", m.get("name", ""))).lower() == "graph" for m in modules)

    # -- low level --------------------------------------------------------------------------

    async def _command(self, *args: object) -> Any:
        """A module command (redis-py has no typed method for GRAPH.*)."""
        return await self._redis.execute_command(*args)  # type: ignore[no-untyped-call]

    async def _write(
        self, key: str, query: str, params: Mapping[str, object] | None = None
    ) -> list[list[object]]:
        reply = await self._command("GRAPH.QUERY", key, params_header(params or {}) + query, "--compact")
        return result_rows(reply)

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
        return result_rows(reply)

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
        rows = await self._read(
            key, matches_query(pred), {**params, "q": query, "q_lc": query.lower(), "limit": limit + 1}
        )
        matches = [entity_of(r) for r in rows[:limit]]
        found = EntityLookup(matches=matches, truncated=len(rows) > limit)
        if not matches:
            return found
        return await self._related(key, readers, found, depth, max(1, max_relations))

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


def assemble(found: EntityLookup, rows: list[list[object]], max_relations: int) -> EntityLookup:
    """The lookup answer from relation rows (`_fields` of each end around the type): the
    relations in a stable order, at most `max_relations`, and the entities they reach."""
    known = {e.id: e for e in found.matches}
    neighbours: dict[str, Entity] = {}
    relations: dict[tuple[str, str, str], Relation] = {}
    for row in rows:
        source, target = entity_of(row[0:5]), entity_of(row[6:11])
        rel = Relation(source=source.id, target=target.id, type=str(row[5]))
        relations[(rel.source, rel.type, rel.target)] = rel
        for end in (source, target):
            if end.id not in known:
                neighbours.setdefault(end.id, end)
    ordered = [relations[k] for k in sorted(relations)]
    kept = ordered[:max_relations]
    reached = {id_ for r in kept for id_ in (r.source, r.target)}
    return EntityLookup(
        matches=found.matches,
        neighbours=sorted((e for e in neighbours.values() if e.id in reached), key=lambda e: (e.name, e.id)),
        relations=kept,
        truncated=found.truncated or len(ordered) > max_relations,
    )
