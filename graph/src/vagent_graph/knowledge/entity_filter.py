"""The entity filter: WHO may see WHICH graph nodes, as one Cypher predicate. Pure.

Built from Readers (readers.py) and pushed into every graph query, for every node a query
touches (matches, neighbours, the middle node of a 2-hop path), so that what comes back is
already the allowed subgraph: nothing is filtered in Python afterwards, so nothing forbidden
ever leaves Redis, not even as a count.

The predicate text is fixed Cypher plus parameter names; every grant value travels as a query
parameter (a list of strings), never in the text, so an id, type or tag containing Cypher
syntax matches only itself. It agrees exactly with `Readers.allows` for every entity the
store can hold (entities.py: printable ids, types and tags).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vagent_graph.knowledge.readers import Grants, Readers
from vagent_shared.knowledge import PUBLIC_TAG

#: The node properties the predicate reads (entity_store.py writes them).
ID, TYPE, TAGS = "id", "entity_type", "tags"
TRUE, FALSE = "true", "false"
PUBLIC_PARAM = "public"
_VARIABLE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")

Params = dict[str, object]


def representable(value: str) -> bool:
    """Stored ids, types and tags are printable (entities.py refuses the rest), so a grant
    naming anything else can match nothing: it is left out rather than sent."""
    return bool(value) and value.isprintable()


def _values(values: Iterable[str]) -> list[str]:
    return sorted(v for v in set(values) if representable(v))


def grant_predicate(grants: Grants, var: str, index: int, params: Params) -> str:
    """What one reader may see: id OR type OR one of the tags (`Grants.allows`). Adds this
    reader's values to `params` as `r{index}_ids` / `_types` / `_tags`; FALSE if none."""
    if grants.everything:
        return TRUE
    alternatives: list[str] = []
    if grants.all_tags:
        alternatives.append(f"size({var}.{TAGS}) > 0")
    for name, values, test in (
        ("ids", grants.ids, f"{var}.{ID} IN ${{p}}"),
        ("types", grants.classes, f"{var}.{TYPE} IN ${{p}}"),
        ("tags", grants.tags, f"any({var}_tag IN {var}.{TAGS} WHERE {var}_tag IN ${{p}})"),
    ):
        kept = _values(values)
        if kept:
            param = f"r{index}_{name}"
            params[param] = kept
            alternatives.append(test.format(p=param))
    if not alternatives:
        return FALSE
    return "(" + " OR ".join(alternatives) + ")"


def entity_predicate(readers: Readers, var: str = "n") -> tuple[str, Params]:
    """The condition node `var` must meet: every reader may see it (AND it is tagged public
    when the room is too large to check). Returns (text, params); the params are the same
    for every `var`, so one query can filter several nodes with one set of params.

    TRUE: nobody restricts anything. FALSE: nothing may be seen, so callers send no query.
    """
    if not _VARIABLE.match(var):
        raise ValueError(f"not a Cypher variable name: {var!r}")
    params: Params = {}
    clauses: list[str] = []
    if readers.public_only:
        params[PUBLIC_PARAM] = PUBLIC_TAG
        clauses.append(f"${PUBLIC_PARAM} IN {var}.{TAGS}")
    for index, grants in enumerate(readers.grants):
        clause = grant_predicate(grants, var, index, params)
        if clause == FALSE:
            return FALSE, {}
        if clause != TRUE:
            clauses.append(clause)
    if not clauses:
        return TRUE, {}
    return " AND ".join(clauses), params
