"""Document search on a real Redis index takes any text, and one failing half of the hybrid
search degrades to the other half instead of losing the whole search.

- Any query (arbitrary Unicode, RediSearch operators, a lone `_`...) returns a list, and its
  full-text query really runs: no "search_half_failed" for the text half (which would hide
  a syntax error behind the vector results). A code named in a document is still found.
- The vector half failing (a vector of the wrong size, refused by Redis) or the text half
  failing (a term Redis cannot parse) leaves the other half's results, counted in
  vagent_graph_search_degraded_total{half}; both failing raises; cancellation propagates.
- Hits carry their document's category and tags.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from redisvl.exceptions import RedisSearchError

from tests.support.factories import ac
from tests.support.knowledge import doc_store, ingest, local_embedder
from vagent_graph.knowledge import retrieval
from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.readers import DOCUMENT_KINDS, Readers, readers_for

TRAVEL = """# Travel policy

## Per diem
The daily allowance for meals on business trips is 60 EUR. The policy code is TRV-2026.
"""
RUNBOOK = """# Database failover runbook

## When
Use it when the primary database stops answering, as in incident INC-0042.

## Flags
Set the flag replica_promote_timeout before promoting the replica.
"""
ADVERSARIAL = [
    "_",
    "what does _ mean",
    "@title:(x)",
    "@text:{x}",
    "a|b",
    "-x",
    "~y",
    "*",
    "%abc%",
    "{a}",
    "[1 2]",
    "\\",
    '"',
    "'",
    "$p",
    "   ",
    "",
    "🙂",
    "INC-0042",
    "w'x'",
    "=> { $weight: 2 }",
    "isempty as inf -inf 1e999",
    "“quoted”",
    "\x00\x07",
    "\u200f\u202eשלום\u202c",
    "e\u0301",
    "x" * 3000,
]
ALPHABET = st.characters(codec="utf-8")  # every Unicode character but surrogates (not text)


def everyone() -> Readers:
    readers = readers_for(ac("@u:x", ["document:*"], domain="acme"), None, DOCUMENT_KINDS)
    assert readers is not None
    return readers


def degraded(half: str) -> float:
    return REGISTRY.get_sample_value("vagent_graph_search_degraded_total", {"half": half}) or 0.0


@dataclass
class Docs:
    store: DocumentStore

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return "Docs(travel, runbook)"


@pytest.fixture(scope="module")
async def docs(redis_url: str) -> AsyncIterator[Docs]:
    async with doc_store(redis_url, local_embedder()) as store:
        await ingest(store, "travel", TRAVEL, category="hr", tags=("policy", "public"))
        await ingest(store, "runbook", RUNBOOK, category="engineering", tags=("ops",))
        yield Docs(store)


queries = st.one_of(
    st.text(ALPHABET, max_size=80),
    st.sampled_from(ADVERSARIAL),
    st.lists(st.one_of(st.sampled_from(ADVERSARIAL), st.text(ALPHABET, max_size=8)), max_size=6).map(
        " ".join
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=queries, noise=st.text(ALPHABET, max_size=24))
@example(query="_", noise="")
@example(query="what does _ mean", noise="_")
@example(query="@title:(x) | -y ~z", noise="%*%")
async def test_any_text_is_a_query_and_a_named_code_is_still_found(
    docs: Docs, query: str, noise: str
) -> None:
    text_failures = degraded("text")
    hits = await docs.store.search(everyone(), query)
    assert isinstance(hits, list)
    named = await docs.store.search(everyone(), f"{noise} INC-0042 {query}")
    assert "runbook" in {h.doc_id for h in named}
    assert degraded("text") == text_failures, "the full-text query failed (and was hidden)"


async def test_a_word_with_underscores_is_found_as_the_index_keeps_it(docs: Docs) -> None:
    text_failures = degraded("text")
    hits = await docs.store.search(everyone(), "what does _ mean in replica_promote_timeout?")
    assert hits and hits[0].doc_id == "runbook" and "replica_promote_timeout" in hits[0].text
    assert degraded("text") == text_failures


async def test_hits_carry_their_documents_category_and_tags(docs: Docs) -> None:
    hits = await docs.store.search(everyone(), "daily allowance for meals TRV-2026")
    travel = next(h for h in hits if h.doc_id == "travel")
    assert (travel.category, travel.tags) == ("hr", ["policy", "public"])
    runbook = (await docs.store.search(everyone(), "INC-0042"))[0]
    assert (runbook.doc_id, runbook.category, runbook.tags) == ("runbook", "engineering", ["ops"])


class WrongSizeEmbedder:
    """The same model id as the index, but vectors Redis refuses (half the dimensions)."""

    def __init__(self) -> None:
        self.model_id = local_embedder().model_id

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = await local_embedder().embed(texts)
        return np.ascontiguousarray(vectors[:, : vectors.shape[1] // 2])


def unparsable_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text half sends the lone `_` that used to reach Redis: a real syntax error."""
    monkeypatch.setattr(retrieval, "query_terms", lambda text: ["_"])


async def test_a_failing_vector_half_leaves_the_text_results(docs: Docs) -> None:
    broken = DocumentStore(docs.store.redis, WrongSizeEmbedder(), docs.store.index)
    before = degraded("vector")
    hits = await broken.search(everyone(), "INC-0042")
    assert [h.doc_id for h in hits] == ["runbook"] and "INC-0042" in hits[0].text
    assert degraded("vector") == before + 1


async def test_a_failing_text_half_leaves_the_vector_results(
    docs: Docs, monkeypatch: pytest.MonkeyPatch
) -> None:
    unparsable_terms(monkeypatch)
    before = degraded("text")
    hits = await docs.store.search(everyone(), "how much money do I get for food when travelling?")
    assert hits and hits[0].doc_id == "travel" and "60 EUR" in hits[0].text
    assert degraded("text") == before + 1


async def test_both_halves_failing_is_an_error(docs: Docs, monkeypatch: pytest.MonkeyPatch) -> None:
    unparsable_terms(monkeypatch)
    broken = DocumentStore(docs.store.redis, WrongSizeEmbedder(), docs.store.index)
    before = degraded("vector"), degraded("text")
    with pytest.raises(RedisSearchError, match="vector"):  # the first half's error
        await broken.search(everyone(), "INC-0042")
    assert (degraded("vector"), degraded("text")) == before  # not answered at all


async def test_cancellation_is_never_taken_for_a_failed_half(
    docs: Docs, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def cancelled(*args: object) -> list[retrieval.Candidate]:
        raise asyncio.CancelledError

    monkeypatch.setattr(retrieval, "text_candidates", cancelled)
    before = degraded("text")
    with pytest.raises(asyncio.CancelledError):
        await docs.store.search(everyone(), "INC-0042")
    assert degraded("text") == before
