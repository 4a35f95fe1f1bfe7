"""The entity store's Cypher, as pure text and values (no I/O): the parameter header, the
compact reply format, the query texts and the rows <-> models mapping. The store
(entity_store.py) sends and receives them; the data model is explained there.

Every value travels as a query parameter. FalkorDB takes parameters as a text header
(`CYPHER name=value ... <query>`) that it parses with its Cypher lexer; this module writes
that header itself (`params_header`) instead of using the `falkordb` client: the same
quoting (backslash and double quote escaped inside double quotes), proven by tests to round-trip
every string, plus what the client does not do: it refuses NUL (FalkorDB cuts the command
at NUL) and unencodable strings before anything is sent, and it names parameters and map
keys only with validated identifiers. Replies are read in the compact format, where every
value carries its type (lists of tags stay lists whatever they contain).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vagent_graph.knowledge.entities import Entity, EntityLookup, Relation

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class ReplyError(RuntimeError):
    """A reply holding a value type this module's queries never return (the store reports
    it as its own error)."""


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


def as_text(value: object) -> str:
    """A reply string, whether the connection decodes responses or not."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def compact_value(cell: Any) -> object:
    """One `[type, value]` cell: 1 null, 2 string, 3 integer, 4 boolean, 5 double, 6 array,
    10 map. Nodes, edges and paths are never returned by this module's queries."""
    kind, value = int(cell[0]), cell[1]
    if kind == 1:
        return None
    if kind == 2:
        return as_text(value)
    if kind == 3:
        return int(value)
    if kind == 4:
        return as_text(value) == "true"
    if kind == 5:
        return float(as_text(value))
    if kind == 6:
        return [compact_value(v) for v in value]
    if kind == 10:
        return {as_text(value[i]): compact_value(value[i + 1]) for i in range(0, len(value), 2)}
    raise ReplyError(f"unexpected value type {kind} in a graph reply")


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
