"""Hybrid retrieval: vector KNN and BM25 full text on the same index, both carrying the
access filter, fused by reciprocal rank (RRF).

Why both: embeddings find paraphrases ("money for meals abroad" → per diem), full text
finds exact names and codes (TRV-2026, INC-0042) that embeddings blur. Why RRF: the two
scores are not comparable, ranks are. The filter is inside both Redis queries (a KNN
pre-filter and a full-text intersection): nothing is filtered after the top-k.

Any text is a valid query: its full-text terms never carry query syntax (query_terms), and
when one of the two queries fails, the other one answers alone (hybrid_search).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from redisvl.index import AsyncSearchIndex
from redisvl.query import TextQuery, VectorQuery
from redisvl.query.filter import FilterExpression
from redisvl.utils.stopwords import get_stopwords

from vagent_graph.knowledge.doc_filter import CATEGORY, DOC_ID, DOMAIN, TAGS
from vagent_graph.knowledge.doc_index import EMBEDDING, POSITION, SECTION, TEXT, TEXT_WEIGHTS, TITLE
from vagent_graph.observability import metrics
from vagent_shared.knowledge import TAG_SEPARATOR, SearchHit

log = structlog.get_logger(__name__)

RETURN_FIELDS = [DOC_ID, DOMAIN, CATEGORY, TAGS, TITLE, SECTION, TEXT, POSITION]
#: RRF's constant (Cormack et al. 2009): dampens the weight of the very first ranks.
RRF_K = 60
#: A chunk found only by its vector must be at least this similar (cosine) to the query:
#: without it, a question about anything would always "find" the nearest unrelated text.
MIN_VECTOR_SIMILARITY = 0.2
MAX_QUERY_TERMS = 32
#: At most this many chunks of one document in a result: a long document with many sections
#: must not crowd out every other document that answers the question.
MAX_CHUNKS_PER_DOCUMENT = 2
_STOPWORDS = frozenset(get_stopwords("english"))
#: What splits a query into tokens, as RediSearch splits the indexed text: whitespace, ASCII
#: control characters and ASCII punctuation except `_` (the index keeps `foo_bar` as one
#: token; it splits on nothing else: `x—y` is one token). Also the backslash, the query
#: syntax's escape character, the curly double quotes redisvl's TextQuery deletes from terms,
#: and surrogates, which are not UTF-8. So TextQuery sends every term exactly as it is.
_SEPARATOR = r"\s\x00-\x1f\x7f\u201c\u201d\ud800-\udfff" + re.escape(string.punctuation.replace("_", ""))
_TOKEN = re.compile(rf"[^{_SEPARATOR}]+")
#: Every term of query_terms matches this (fullmatch): no separator, hence no query syntax
#: (redisvl's TokenEscaper has nothing to escape, the query lexer reads one plain term), and
#: at least one letter or digit. A lone `_` is NOT a term: RediSearch's lexer skips it as
#: punctuation, which leaves `@text:()`, a syntax error.
TERM = re.compile(rf"(?=[^{_SEPARATOR}]*?[^\W_])[^{_SEPARATOR}]+")


def _in_word(c: str) -> bool:
    """A letter, digit, `_` or combining mark (Devanagari vowel signs, decomposed accents)."""
    return c.isalnum() or c == "_" or unicodedata.category(c).startswith("M")


def _token_terms(token: str) -> list[str]:
    """The token as the index has it, then, if it holds other characters (`x—y`, `hello🙂`),
    its words alone (`x`, `y`; `hello`): the text may have them apart."""
    if all(_in_word(c) for c in token):
        return [token]
    return [token, *("".join(run) for word, run in itertools.groupby(token, _in_word) if word)]


def query_terms(text: str) -> list[str]:
    """The words of `text` as the index tokenizes its fields (split on ASCII punctuation but
    `_`, lower case), without stop words and without tokens that have no letter or digit
    (`_`, `🙂`): "TRV-2026?" → ["trv", "2026"], "foo_bar" → ["foo_bar"]. Whatever the
    text, every term matches TERM, so the full-text query always parses."""
    terms = (t for token in _TOKEN.findall(text.lower()) for t in _token_terms(token))
    meaningful = (t for t in terms if t not in _STOPWORDS and TERM.fullmatch(t))
    return list(dict.fromkeys(meaningful))[:MAX_QUERY_TERMS]


@dataclass(frozen=True)
class Candidate:
    key: str
    fields: dict[str, Any]
    similarity: float | None  # cosine similarity, when the vector query found it


def fuse(vector: Sequence[Candidate], text: Sequence[Candidate], k: int) -> list[tuple[Candidate, float]]:
    """Reciprocal-rank fusion of two ranked lists; the best `k` with their fused score, at most
    MAX_CHUNKS_PER_DOCUMENT of any one document."""
    scores: dict[str, float] = {}
    found: dict[str, Candidate] = {}
    for ranked in (vector, text):
        for rank, cand in enumerate(ranked, 1):
            scores[cand.key] = scores.get(cand.key, 0.0) + 1.0 / (RRF_K + rank)
            if cand.similarity is not None or cand.key not in found:
                found[cand.key] = cand
    text_keys = {c.key for c in text}
    kept = [
        key for key in scores if key in text_keys or (found[key].similarity or 0.0) >= MIN_VECTOR_SIMILARITY
    ]
    # Equal fused scores (each list ranked the other's first second): the closer meaning wins.
    kept.sort(key=lambda key: (-scores[key], -(found[key].similarity or -1.0), key))
    per_doc: dict[str, int] = {}
    out: list[tuple[Candidate, float]] = []
    for key in kept:
        doc = str(found[key].fields.get(DOC_ID, key))
        if per_doc.get(doc, 0) < MAX_CHUNKS_PER_DOCUMENT:
            per_doc[doc] = per_doc.get(doc, 0) + 1
            out.append((found[key], scores[key]))
            if len(out) == k:
                break
    return out


def _candidates(rows: list[dict[str, Any]], with_distance: bool) -> list[Candidate]:
    out = []
    for row in rows:
        sim = 1.0 - float(row["vector_distance"]) if with_distance else None
        out.append(Candidate(str(row["id"]), row, sim))
    return out


async def vector_candidates(index: AsyncSearchIndex, flt: str, vector: np.ndarray, n: int) -> list[Candidate]:
    query = VectorQuery(
        vector=vector.astype(np.float32).tobytes(),
        vector_field_name=EMBEDDING,
        return_fields=RETURN_FIELDS,
        filter_expression=FilterExpression(flt),
        num_results=n,
        dialect=2,
    )
    return _candidates(await index.query(query), with_distance=True)


async def text_candidates(index: AsyncSearchIndex, flt: str, terms: list[str], n: int) -> list[Candidate]:
    if not terms:
        return []
    query = TextQuery(
        " ".join(terms),
        text_field_name=dict(TEXT_WEIGHTS),
        text_scorer="BM25STD",
        filter_expression=FilterExpression(flt),
        num_results=n,
        return_fields=RETURN_FIELDS,
        stopwords=None,  # already removed by query_terms
        dialect=2,
    )
    return _candidates(await index.query(query), with_distance=False)


def _tags(value: Any) -> list[str]:
    return [t for t in str(value or "").split(TAG_SEPARATOR) if t]


async def _failed(exc: BaseException) -> list[Candidate]:
    raise exc


async def hybrid_search(
    index: AsyncSearchIndex, flt: str, vector: np.ndarray | BaseException, text: str, k: int
) -> list[SearchHit]:
    """The best `k` chunks the filter allows, by vector and by text, both queries in flight
    at once. If one of them fails (`vector` may be the error that embedding the query raised),
    the other answers alone (logged as `search_half_failed`, counted in SEARCH_DEGRADED); if
    both fail, the vector half's error is raised."""
    n = max(20, 4 * k)
    outcomes = await asyncio.gather(
        _failed(vector) if isinstance(vector, BaseException) else vector_candidates(index, flt, vector, n),
        text_candidates(index, flt, query_terms(text), n),
        return_exceptions=True,
    )
    found: list[list[Candidate]] = []
    failed: list[tuple[str, Exception]] = []
    for half, outcome in zip(("vector", "text"), outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):  # CancelledError and the like: never swallowed
                raise outcome
            log.warning("search_half_failed", half=half, error_type=type(outcome).__name__)
            failed.append((half, outcome))
        found.append(outcome if isinstance(outcome, list) else [])
    if len(failed) == len(outcomes):
        raise failed[0][1]
    for half, _ in failed:
        metrics.SEARCH_DEGRADED.labels(half).inc()
    by_vector, by_text = found
    return [
        SearchHit(
            doc_id=str(c.fields[DOC_ID]),
            domain=str(c.fields[DOMAIN]),
            title=str(c.fields.get(TITLE, "")),
            section=str(c.fields.get(SECTION, "")),
            category=str(c.fields.get(CATEGORY, "")),
            tags=_tags(c.fields.get(TAGS)),
            position=int(c.fields.get(POSITION, 0)),
            text=str(c.fields.get(TEXT, "")),
            score=round(score, 6),
        )
        for c, score in fuse(by_vector, by_text, k)
    ]
