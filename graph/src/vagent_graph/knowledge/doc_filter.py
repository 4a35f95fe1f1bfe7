"""The document filter: WHO may read WHICH chunks, as one RediSearch query clause. Pure.

Built from Readers (readers.py), pushed down into the Redis query (vector and full-text
alike), never applied in Python after a top-k: post-filtering would lose recall and let
response times tell what exists. Every value is escaped, so a grant or tag containing
query syntax (`|`, `}`, `-`, spaces, `*`, quotes...) matches only itself: it can neither
widen nor break the filter.
"""

from __future__ import annotations

from collections.abc import Iterable

from vagent_graph.knowledge.readers import Grants, Readers
from vagent_shared.knowledge import PUBLIC_TAG

#: Index fields the filter uses (doc_index.py declares them).
DOMAIN, DOC_ID, CATEGORY, TAGS, TAGGED = "domain", "doc_id", "category", "tags", "tagged"
#: TAGGED's value for a chunk whose document has at least one tag (`document_tag:*`).
HAS_TAGS = "yes"


def escape_tag(value: str) -> str:
    """A TAG query value that matches exactly `value`: every ASCII character that is not a
    letter or digit is backslash-escaped (RediSearch treats only ASCII as syntax)."""
    return "".join(f"\\{c}" if c.isascii() and not c.isalnum() else c for c in value)


def representable(value: str) -> bool:
    """Values with control or non-ASCII whitespace characters are never stored (ingestion
    refuses them), so a grant naming one can match nothing: it is left out, never sent."""
    return bool(value) and value.isprintable()


def tag_clause(field: str, values: Iterable[str]) -> str | None:
    """`@field:{a|b}` for the representable values, or None if there are none."""
    escaped = [escape_tag(v) for v in sorted(set(values)) if representable(v)]
    if not escaped:
        return None
    return f"@{field}:{{{'|'.join(escaped)}}}"


def grant_clause(grants: Grants) -> str | None:
    """What one reader may read: id OR category OR tag. None: nothing."""
    alternatives = [
        tag_clause(TAGGED, [HAS_TAGS]) if grants.all_tags else None,
        tag_clause(DOC_ID, grants.ids),
        tag_clause(CATEGORY, grants.classes),
        tag_clause(TAGS, grants.tags),
    ]
    present = [a for a in alternatives if a is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else "(" + " | ".join(present) + ")"


def document_filter(readers: Readers | None) -> str | None:
    """The clause every document query carries: the active domain AND, for every reader,
    what that reader may read (AND tagged public when the room is too large to check).

    None means "nothing may be read": the caller returns no results WITHOUT querying
    (an empty tag list would render as a match-all, and a query costs time that tells).
    """
    if readers is None or not representable(readers.domain):
        return None
    parts = [f"@{DOMAIN}:{{{escape_tag(readers.domain)}}}"]
    if readers.public_only:
        parts.append(f"@{TAGS}:{{{escape_tag(PUBLIC_TAG)}}}")
    for grants in readers.grants:
        if grants.everything:
            continue
        clause = grant_clause(grants)
        if clause is None:
            return None
        parts.append(clause)
    return " ".join(parts)
