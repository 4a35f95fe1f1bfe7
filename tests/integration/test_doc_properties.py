"""Property-based proof of the document filter against a real Redis index.

A corpus of 1040 chunks (texts drawn from a pool of 200) in three tenants, with ids, categories
and tags that contain Redis query syntax (`|`, `}`, `-`, spaces, `*`...) and case variants;
random access contexts (random grants, wildcards, inactive roles, grants in other domains,
superusers, adversarial grant strings) and random room audiences. For every example, checked
against an oracle that uses only AcContext.can_access (not the code under test):
- search_documents never returns a chunk some reader may not read, nor one of another domain;
- an empty allow-list returns nothing and sends no query to Redis at all;
- the filtered vector query returns exactly the brute-force nearest allowed chunks (recall
  is not lost to filtering: the filter is in the query, not applied after a top-k).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from tests.support.acl_strategies import ADVERSARIAL_TAGS, audiences, contexts
from tests.support.knowledge import doc_store, local_embedder
from vagent_graph.knowledge.chunking import Chunk
from vagent_graph.knowledge.doc_filter import document_filter
from vagent_graph.knowledge.doc_store import DocumentStore
from vagent_graph.knowledge.ingest import Parsed, Prepared, spec
from vagent_graph.knowledge.readers import DOCUMENT_KINDS, readers_for
from vagent_graph.knowledge.retrieval import vector_candidates
from vagent_shared.access import AcContext
from vagent_shared.knowledge import PUBLIC_TAG, Audience

DOMAINS = ["acme", "globex", "we}ird|dom-*"]
ODD_IDS = [
    "a|b",
    "x}y",
    "-neg",
    "star*",
    "q3-2026",
    "(p)",
    "@x",
    "$v",
    "~t",
    "{b}",
    "日本",
    "Up",
    "up",
    "a.b",
    'q"t',
]
CATEGORIES = ["finance", "Finance", "hr", "with space", "a|b", "*", "-", "x}y", PUBLIC_TAG]
TAGS = [*ADVERSARIAL_TAGS, "q3"]
WORDS = (
    "revenue travel policy per diem incident database failover budget salary security password rotation "
    "customer project falcon quarterly results employee handbook office vacation expense approval manager "
    "contract invoice meals hotel flight replica backup audit risk hiring onboarding laptop vpn access"
).split()
QUERIES = [
    "what were the quarterly results?",
    "travel per diem for meals",
    "database failover replica",
    "salary budget approval",
    "security password rotation",
    "vpn laptop access onboarding",
    "INC-0042",
    "customer contract invoice",
]
N_DOCS, CHUNKS_PER_DOC = 260, 4
TEXT_POOL = 200  # distinct chunk texts


@dataclass(frozen=True)
class Doc:
    domain: str
    doc_id: str
    category: str
    tags: tuple[str, ...]


@dataclass
class Corpus:
    store: DocumentStore
    docs: dict[tuple[str, str], Doc]
    keys: list[tuple[str, str, int]]  # (domain, doc_id, position) per row of `vectors`
    vectors: np.ndarray
    redis: Redis

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"Corpus({len(self.keys)} chunks in {len(self.docs)} documents)"


def make_docs(rng: random.Random) -> list[Doc]:
    docs: dict[tuple[str, str], Doc] = {}
    while len(docs) < N_DOCS:
        domain = rng.choice(DOMAINS)
        doc_id = rng.choice(ODD_IDS) if rng.random() < 0.3 else f"doc-{len(docs)}"
        tags = tuple(sorted(set(rng.sample(TAGS, rng.randint(0, 3)))))
        docs.setdefault((domain, doc_id), Doc(domain, doc_id, rng.choice(CATEGORIES), tags))
    return list(docs.values())


def text_for(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "."


@pytest.fixture(scope="module")
async def corpus(redis_url: str) -> AsyncIterator[Corpus]:
    rng = random.Random(20261124)
    docs = make_docs(rng)
    # Chunks draw their text from a pool, embedded once: the offline model costs ~3-8 ms a
    # text, and what is proven is the filter over 1040 chunks, not 1040 different sentences.
    # (Equal texts in several documents also make ties the filtered KNN must break as the
    # brute-force scan does: only the similarities are compared.)
    pool = [text_for(rng) for _ in range(TEXT_POOL)]
    async with doc_store(redis_url, local_embedder()) as store:
        pool_vectors = await store.embedder.embed(pool)
        keys: list[tuple[str, str, int]] = []
        vectors: list[np.ndarray] = []
        for d in docs:
            picks = [rng.randrange(TEXT_POOL) for _ in range(CHUNKS_PER_DOC)]
            chunks = [Chunk(i, f"part {i}", pool[p]) for i, p in enumerate(picks)]
            doc = spec(doc_id=d.doc_id, domain=d.domain, category=d.category, tags=d.tags)
            parsed = Parsed(
                doc, f"Title of {d.doc_id}", "text", hashlib.sha256(d.doc_id.encode()).hexdigest(), chunks
            )
            vecs = pool_vectors[picks]
            await store.put(Prepared(parsed, vecs, store.embedder.model_id))
            keys += [(d.domain, d.doc_id, c.position) for c in chunks]
            vectors.append(vecs)
        assert len(keys) >= 1000
        yield Corpus(store, {(d.domain, d.doc_id): d for d in docs}, keys, np.vstack(vectors), store.redis)


def may_read(ctx: AcContext, doc: Doc) -> bool:
    """The oracle, from AcContext alone: the active domain, and id OR category OR a tag."""
    if doc.domain != ctx.active_acl_domain:
        return False
    return (
        ctx.can_access(f"document:{doc.doc_id}")
        or ctx.can_access(f"document_category:{doc.category}")
        or any(ctx.can_access(f"document_tag:{t}") for t in doc.tags)
    )


def everyone_may_read(asker: AcContext, audience: Audience | None, doc: Doc) -> bool:
    if audience is not None and audience.public_only and PUBLIC_TAG not in doc.tags:
        return False
    members = [m.ac_context for m in audience.members] if audience else []
    return may_read(asker, doc) and all(m is not None and may_read(m, doc) for m in members)


names = st.one_of(
    st.sampled_from(ODD_IDS + CATEGORIES + TAGS + ["*", "doc-1", "doc-2", "doc-3"]),
    st.text(min_size=1, max_size=12),
)
instances = st.one_of(
    st.builds(
        lambda k, n: f"{k}:{n}", st.sampled_from(["document", "document_category", "document_tag"]), names
    ),
    st.sampled_from(
        ["tool:search_documents", "agent:vagent", "entity:*", "document_tag:public|confidential"]
    ),
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[AcContext, Audience | None, str]:
    asker = draw(contexts(instances, DOMAINS))
    return asker, draw(audiences(instances, DOMAINS, asker.active_acl_domain)), draw(st.sampled_from(QUERIES))


async def ft_searches(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_FT.SEARCH", {}).get("calls", 0))


def adversarial(grants: list[str], domain: str = "acme") -> tuple[AcContext, None, str]:
    ctx = AcContext.model_validate(
        {
            "userId": "@a:x",
            "activeAclDomain": domain,
            "activeRoles": ["r"],
            "roles": {domain: [{"name": "r", "instances": grants}]},
        }
    )
    return ctx, None, QUERIES[1]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
@example(case=adversarial(["document_tag:public|confidential"]))
@example(case=adversarial(["document_tag:public} | @domain:{globex"]))
@example(case=adversarial(["document_tag:pub*", "document:doc-*", "document:doc:*", "document_tag:a|*"]))
@example(case=adversarial(["document_category:-finance", "document:"]))
@example(case=adversarial(["document_tag:*"], "we}ird|dom-*"))
@example(case=adversarial(["tool:search_documents"]))
async def test_search_never_leaks_and_never_loses(
    corpus: Corpus, case: tuple[AcContext, Audience | None, str]
) -> None:
    asker, audience, query = case
    readers = readers_for(asker, audience, DOCUMENT_KINDS)
    allowed = {k for k, d in corpus.docs.items() if everyone_may_read(asker, audience, d)}
    if readers is None or document_filter(readers) is None:
        before = await ft_searches(corpus.redis)
        assert await corpus.store.search(readers, query, k=30) == []
        assert await ft_searches(corpus.redis) == before, "an empty allow-list must not query Redis"
        assert not allowed, "a reader who may read something got nothing"
        return
    hits = await corpus.store.search(readers, query, k=30)
    for hit in hits:
        assert hit.domain == asker.active_acl_domain
        assert (hit.domain, hit.doc_id) in allowed, f"leaked {hit.doc_id!r} to {asker.granted_instances()}"
    await assert_exact_recall(corpus, readers, allowed, query)


async def assert_exact_recall(
    corpus: Corpus, readers: object, allowed: set[tuple[str, str]], query: str
) -> None:
    """The filtered KNN equals a brute-force scan of the allowed chunks."""
    flt = document_filter(readers)  # type: ignore[arg-type]
    assert flt is not None
    vector = (await corpus.store.embedder.embed([query]))[0]
    index = await corpus.store.search_index()
    assert index is not None
    got = await vector_candidates(index, flt, vector, 10)
    rows = [i for i, k in enumerate(corpus.keys) if (k[0], k[1]) in allowed]
    expected = sorted((float(corpus.vectors[i] @ vector) for i in rows), reverse=True)[:10]
    assert len(got) == len(expected)
    assert [round(c.similarity or 0, 3) for c in got] == [round(s, 3) for s in expected]
