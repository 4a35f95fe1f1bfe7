"""The document store on a real Redis index with the real offline embedding model: replace,
delete, hybrid retrieval, the filter pushed into Redis, and refusing to mix models."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from tests.support.factories import ac
from tests.support.knowledge import doc_store, ingest
from tests.support.llm_server import EMBEDDING_DIMS, ScriptedLLMServer
from vagent_graph.knowledge.doc_index import IndexMismatch
from vagent_graph.knowledge.embeddings import RemoteEmbedder
from vagent_graph.knowledge.readers import DOCUMENT_KINDS, readers_for
from vagent_graph.services import Services
from vagent_graph.tools import ToolContext, documents
from vagent_graph.tools.base import result_text

TRAVEL = """# Travel policy

## Booking
Book flights and hotels through the travel desk at least two weeks ahead.

## Per diem
The daily allowance for meals on business trips is 60 EUR. The policy code is TRV-2026.
"""
RUNBOOK = """# Database failover runbook

## When
Use it when the primary database stops answering, as in incident INC-0042.

## Steps
Promote the replica, point the application at it, and open a ticket.
"""


def everyone(domain: str = "acme"):  # type: ignore[no-untyped-def]
    return readers_for(ac("@u:x", ["document:*"], domain=domain), None, DOCUMENT_KINDS)


async def chunk_keys(redis_url: str, index: str) -> list[bytes]:
    redis = Redis.from_url(redis_url)
    try:
        return [k async for k in redis.scan_iter(match=f"{index}:chunk:*")]
    finally:
        await redis.aclose()


async def ft_searches(redis_url: str) -> int:
    redis = Redis.from_url(redis_url)
    try:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_FT.SEARCH", {}).get("calls", 0))
    finally:
        await redis.aclose()


async def test_search_finds_paraphrases_and_exact_codes(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        await ingest(store, "travel", TRAVEL, category="hr")
        await ingest(store, "runbook", RUNBOOK, category="engineering")
        meals = await store.search(everyone(), "how much money do I get for food when travelling?")
        assert meals[0].doc_id == "travel" and "60 EUR" in meals[0].text
        assert meals[0].section == "Travel policy > Per diem"
        code = await store.search(everyone(), "INC-0042")
        assert code[0].doc_id == "runbook" and "INC-0042" in code[0].text
        policy = await store.search(everyone(), "TRV-2026")
        assert policy[0].doc_id == "travel" and "TRV-2026" in policy[0].text


async def test_reingesting_replaces_without_duplicates_or_stale_chunks(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        first = await ingest(store, "travel", TRAVEL + "\n## Extra\n" + "More words here. " * 200)
        assert first.chunks >= 4
        second = await ingest(store, "travel", "# Travel policy\n\nThe allowance is now 70 EUR per day.")
        assert second.chunks == 1
        assert len(await chunk_keys(redis_url, store.index)) == 1
        hits = await store.search(everyone(), "daily allowance for meals", k=10)
        assert [h.text for h in hits] == ["The allowance is now 70 EUR per day."]
        assert [d.doc_id for d in await store.documents()] == ["travel"]


async def test_delete_removes_every_chunk(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        await ingest(store, "travel", TRAVEL)
        await ingest(store, "runbook", RUNBOOK)
        result = await store.delete("acme", "travel")
        assert result is not None and result.deleted_chunks >= 2
        assert await store.delete("acme", "travel") is None
        assert all(h.doc_id == "runbook" for h in await store.search(everyone(), "per diem travel", k=10))
        assert [d.doc_id for d in await store.documents()] == ["runbook"]


async def test_same_id_in_two_domains_are_two_documents(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        await ingest(store, "policy", "# Policy\n\nAcme pays 60 EUR.", domain="acme")
        await ingest(store, "policy", "# Policy\n\nGlobex pays 99 USD.", domain="globex")
        acme = await store.search(everyone("acme"), "how much is paid", k=10)
        globex = await store.search(everyone("globex"), "how much is paid", k=10)
        assert [h.text for h in acme] == ["Acme pays 60 EUR."]
        assert [h.text for h in globex] == ["Globex pays 99 USD."]
        assert {(d.domain, d.doc_id) for d in await store.documents()} == {
            ("acme", "policy"),
            ("globex", "policy"),
        }


async def test_the_filter_is_in_the_query_and_an_empty_allow_list_sends_none(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        await ingest(store, "travel", TRAVEL, category="hr", tags=("public",))
        await ingest(store, "runbook", RUNBOOK, category="engineering", tags=("internal",))
        public = readers_for(ac("@c:x", ["document_tag:public"]), None, DOCUMENT_KINDS)
        question = "database failover INC-0042, and booking travel"
        assert (await store.search(everyone(), question))[0].doc_id == "runbook"
        hits = await store.search(public, question, k=20)
        assert hits and all(h.doc_id == "travel" for h in hits)  # the best match is not readable
        before = await ft_searches(redis_url)
        nothing = readers_for(ac("@d:x", ["tool:search_documents"]), None, DOCUMENT_KINDS)
        assert await store.search(nothing, "database failover") == []
        assert await ft_searches(redis_url) == before


async def test_tags_and_ids_are_case_sensitive(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        await ingest(store, "Secret", "# S\n\nThe vault code is 1234.", tags=("Confidential",))
        lower = readers_for(
            ac("@u:x", ["document:secret", "document_tag:confidential"]), None, DOCUMENT_KINDS
        )
        assert await store.search(lower, "vault code") == []
        exact = readers_for(ac("@u:x", ["document_tag:Confidential"]), None, DOCUMENT_KINDS)
        assert [h.doc_id for h in await store.search(exact, "vault code")] == ["Secret"]


async def test_concurrent_writers_of_one_document_leave_exactly_one_version(redis_url: str) -> None:
    async with doc_store(redis_url) as store:
        versions = [
            f"# V\n\nVersion {i} says {i * 11}." + (" Filler text." * 150 * (i % 3)) for i in range(6)
        ]
        infos = await asyncio.gather(*(ingest(store, "doc", v) for v in versions))
        (current,) = await store.documents()
        assert current.ingested_at == max(i.ingested_at for i in infos)
        assert len(await chunk_keys(redis_url, store.index)) == current.chunks


async def test_another_embedding_model_is_refused_until_reindexed(
    redis_url: str, llm_server: ScriptedLLMServer
) -> None:
    async with doc_store(redis_url) as store:
        await ingest(store, "travel", TRAVEL)
        await ingest(store, "runbook", RUNBOOK)
        remote = RemoteEmbedder(llm_server.base_url, "stand-in-embedder", "k", timeout=10)
        async with doc_store(redis_url, remote, index=store.index) as other:
            with pytest.raises(IndexMismatch, match="reindex"):
                await ingest(other, "new", "# New\n\nSomething new.")
            with pytest.raises(IndexMismatch):
                await other.search(everyone(), "travel")
            chunks = (await other.status()).chunks
            assert await other.reindex() == chunks
            status = await other.status()
            assert (status.embedding_model, status.dimensions) == (remote.model_id, EMBEDDING_DIMS)
            assert {d.embedding_model for d in await other.documents()} == {remote.model_id}
            hits = await other.search(everyone(), "promote the replica database")
            assert hits[0].doc_id == "runbook"
            with pytest.raises(IndexMismatch):  # and now the old model is the one refused
                await store.search(everyone(), "travel")


async def test_an_unreachable_embeddings_endpoint_leaves_the_full_text_half(
    redis_url: str, llm_server: ScriptedLLMServer
) -> None:
    """The query cannot be embedded: the vector half fails, the full-text half still finds the
    exact words (counted as a degraded search)."""
    remote = RemoteEmbedder(llm_server.base_url, "stand-in-embedder", "k", timeout=5)
    degraded = {"half": "vector"}
    async with doc_store(redis_url, remote) as store:
        await ingest(store, "travel", TRAVEL)
        llm_server.embeddings_fail = True
        before = REGISTRY.get_sample_value("vagent_graph_search_degraded_total", degraded) or 0.0
        assert [h.doc_id for h in await store.search(everyone(), "per diem")][:1] == ["travel"]
        assert REGISTRY.get_sample_value("vagent_graph_search_degraded_total", degraded) == before + 1
        assert await store.search(everyone(), "_") == []  # no words either: an honest empty answer
        ctx = ToolContext(
            ac=ac("@u:x", ["tool:search_documents", "document:*"]), session_id="s", services=Services(store)
        )
        out = await documents.TOOL.run(documents.SearchDocumentsArgs(query="per diem"), ctx, None)
        assert "Per diem" in result_text(out) or "per diem" in result_text(out)
        llm_server.embeddings_fail = False
        assert (await store.search(everyone(), "per diem"))[0].doc_id == "travel"


async def test_without_a_document_store_the_tool_says_search_is_unavailable() -> None:
    ctx = ToolContext(ac=ac("@u:x", ["document:*"]), session_id="s")
    out = await documents.TOOL.run(documents.SearchDocumentsArgs(query="per diem"), ctx, None)
    assert result_text(out) == documents.UNAVAILABLE
