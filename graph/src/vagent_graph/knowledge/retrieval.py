"""Hybrid retrieval: vector KNN and BM25 full text on the same index, both carrying the
access filter, fused by reciprocal rank (RRF).

Why both: embeddings find paraphrases ("money for meals abroad" → per diem), full text
finds exact names and codes (TRV-2026, INC-0042) that embeddings blur. Why RRF: the two
scores are not comparable, ranks are. The filter is inside both Redis queries (a KNN
pre-filter and a full-text intersection): nothing is filtered after the top-k.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from redisvl.index import AsyncSearchIndex
from redisvl.query import TextQuery, VectorQuery
from redisvl.query.filter import FilterExpression
from redisvl.utils.stopwords import get_stopwords

from vagent_graph.knowledge.doc_filter import DOC_ID, DOMAIN
from vagent_graph.knowledge.doc_index import EMBEDDING, POSITION, SECTION, TEXT, TEXT_WEIGHTS, TITLE
from vagent_shared.knowledge import SearchHit

RETURN_FIELDS = [DOC_ID, DOMAIN, TITLE, SECTION, TEXT, POSITION]
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
_WORD = re.compile(r"\w+")


def query_terms(text: str) -> list[str]:
    """The words of `text` as the index tokenizes its fields (on punctuation, lower case),
    without stop words: "TRV-2026?" → ["trv", "2026"]."""
    words = [w.lower() for w in _WORD.findall(text)]
    return list(dict.fromkeys(w for w in words if w not in _STOPWORDS))[:MAX_QUERY_TERMS]


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


async def hybrid_search(
    index: AsyncSearchIndex, flt: str, vector: np.ndarray, text: str, k: int
) -> list[SearchHit]:
    """The best `k` chunks the filter allows, by vector and by text, both queries in flight
    at once."""
    n = max(20, 4 * k)
    by_vector, by_text = await asyncio.gather(
        vector_candidates(index, flt, vector, n), text_candidates(index, flt, query_terms(text), n)
    )
    return [
        SearchHit(
            doc_id=str(c.fields[DOC_ID]),
            domain=str(c.fields[DOMAIN]),
            title=str(c.fields.get(TITLE, "")),
            section=str(c.fields.get(SECTION, "")),
            position=int(c.fields.get(POSITION, 0)),
            text=str(c.fields.get(TEXT, "")),
            score=round(score, 6),
        )
        for c, score in fuse(by_vector, by_text, k)
    ]
