#!/usr/bin/env python3
"""Benchmark document retrieval: ingestion speed, and what the access filter costs a search.

1. Ingestion. ``--chunks`` chunks (default 10 000, in documents of 10) embedded with the
   configured model (the packaged offline model unless EMBEDDINGS_BASE_URL is set) and
   written with the store's atomic per-document transaction: chunks per second, embedding
   and writing apart.
2. Search. The same queries, in alternating blocks so host noise hits every mode alike:
   UNFILTERED (no filter at all: the floor), a user allowed ~5% of the chunks and one allowed
   ~50% (grants by category, as a real AcContext gives them). p50/p99 of the Redis part
   (vector KNN + BM25, both with the filter, fused) and of the whole ``search_documents``
   path (with the query's embedding). Target: filtered p50 within 1.5x of unfiltered.
3. Recall@10 of the filtered vector query against a brute-force scan (numpy) of exactly the
   allowed chunks. Target: equal (1.000): filtering must not lose results.

Both index algorithms are measured on the same vectors: FLAT (exact; the default,
DOCS_VECTOR_ALGORITHM) and HNSW (approximate). Everything runs on a Redis of its own on a
free 127.0.0.1 port, stopped at the end or on Ctrl-C. A MISS never makes the exit code
non-zero.

    .venv/bin/python bench/bench_rag.py            # or: make bench-rag
    .venv/bin/python bench/bench_rag.py --quick    # seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.common import (  # noqa: E402
    BenchError,
    cancel_on_sigint,
    default_results_path,
    machine_info,
    make_results,
    print_machine,
    resolve_counts,
    run_main,
    summary,
    verdict,
)
from redis_local import RedisServer, free_port  # noqa: E402
from tests.support.factories import ac  # noqa: E402
from vagent_graph.knowledge.chunking import Chunk  # noqa: E402
from vagent_graph.knowledge.doc_filter import document_filter  # noqa: E402
from vagent_graph.knowledge.doc_store import DocumentStore  # noqa: E402
from vagent_graph.knowledge.embeddings import make_embedder  # noqa: E402
from vagent_graph.knowledge.ingest import Parsed, Prepared, spec  # noqa: E402
from vagent_graph.knowledge.readers import DOCUMENT_KINDS, Readers, readers_for  # noqa: E402
from vagent_graph.knowledge.retrieval import hybrid_search, vector_candidates  # noqa: E402
from vagent_shared.logs import configure_logging  # noqa: E402
from vagent_shared.settings import GraphSettings  # noqa: E402

DEFAULTS = {"chunks": 10_000, "queries": 300}
QUICK = {"chunks": 200, "queries": 10}  # 200: one document of each category
CHUNKS_PER_DOC = 10
CATEGORIES = 20  # uniform: one category is ~5% of the chunks, ten are ~50%
TAGS = [f"tag-{i}" for i in range(40)]
DOMAIN = "bench"
RATIO_TARGET = 1.5
TOPICS = {
    "finance": ["revenue", "margin", "budget", "forecast", "invoice", "audit", "cash flow", "Q3"],
    "hr": ["per diem", "travel", "vacation", "salary band", "onboarding", "parental leave", "review"],
    "engineering": ["database", "failover", "replica", "deployment", "latency", "incident", "backup"],
    "security": ["password", "MFA", "phishing", "access review", "encryption", "VPN", "laptop"],
    "sales": ["customer", "contract", "renewal", "pipeline", "discount", "quota", "partner"],
}
TEMPLATES = [
    "The {a} process changed this quarter: every {b} now needs approval from the {c} owner.",
    "Teams report {a} figures monthly; the {b} summary goes to the steering group with the {c} notes.",
    "If the {a} fails, follow the {b} steps and record the {c} in the tracker within one day.",
    "Our policy on {a} applies to all staff; exceptions for {b} are granted by the head of {c}.",
    "The {a} target for next year depends on {b} growth and the cost of {c}.",
    "Questions about {a} go to the service desk; {b} questions go to the {c} team.",
]


@dataclass
class Corpus:
    parsed: list[Parsed]
    categories: list[int]  # per chunk, aligned with the vectors
    vectors: np.ndarray


def make_text(rng: random.Random, topic: str) -> str:
    words = TOPICS[topic]
    sentences = [
        rng.choice(TEMPLATES).format(a=rng.choice(words), b=rng.choice(words), c=rng.choice(words))
        for _ in range(rng.randint(3, 6))
    ]
    return " ".join(sentences)


def make_corpus(n_chunks: int, seed: int = 7) -> tuple[list[Parsed], list[int]]:
    rng = random.Random(seed)
    parsed, categories = [], []
    for d in range(max(1, n_chunks // CHUNKS_PER_DOC)):
        topic = rng.choice(list(TOPICS))
        category = d % CATEGORIES
        chunks = [Chunk(i, f"{topic} part {i}", make_text(rng, topic)) for i in range(CHUNKS_PER_DOC)]
        doc = spec(
            doc_id=f"doc-{d}", domain=DOMAIN, category=f"cat-{category}", tags=tuple(rng.sample(TAGS, 2))
        )
        sha = hashlib.sha256(str(d).encode()).hexdigest()
        parsed.append(Parsed(doc, f"{topic.title()} note {d}", "text", sha, chunks))
        categories += [category] * CHUNKS_PER_DOC
    return parsed, categories


def make_queries(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = TOPICS[rng.choice(list(TOPICS))]
        out.append(f"What is the rule for {rng.choice(words)} and {rng.choice(words)}?")
    return out


async def ingest(store: DocumentStore, parsed: list[Parsed], vectors: np.ndarray | None) -> dict[str, float]:
    """Embed (unless `vectors` are given) and write every document; seconds of each part."""
    embed_s = 0.0
    prepared = []
    offset = 0
    for p in parsed:
        n = len(p.chunks)
        if vectors is None:
            t = time.perf_counter()
            vecs = await store.embedder.embed(p.texts())
            embed_s += time.perf_counter() - t
        else:
            vecs = vectors[offset : offset + n]
        offset += n
        prepared.append(Prepared(p, vecs, store.embedder.model_id))
    t = time.perf_counter()
    for doc in prepared:
        await store.put(doc)
    return {"embed_seconds": embed_s, "write_seconds": time.perf_counter() - t}


def user(instances: list[str]) -> Readers:
    readers = readers_for(ac("@bench:x", instances, domain=DOMAIN), None, DOCUMENT_KINDS)
    if readers is None:
        raise BenchError("a benchmark user may read nothing")
    return readers


MODES: dict[str, tuple[Readers | None, set[int]]] = {
    "unfiltered": (None, set(range(CATEGORIES))),
    "5% user": (user(["document_category:cat-0"]), {0}),
    "50% user": (user([f"document_category:cat-{i}" for i in range(10)]), set(range(10))),
}


def filter_for(readers: Readers | None) -> str:
    """ "*" (no filter at all) for the floor; the product's filter otherwise."""
    if readers is None:
        return "*"
    flt = document_filter(readers)
    if flt is None:
        raise BenchError("empty filter")
    return flt


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await fn()
    return (time.perf_counter() - t) * 1000


async def measure_search(
    store: DocumentStore, queries: list[str], qvecs: np.ndarray
) -> dict[str, dict[str, dict[str, float]]]:
    """p50/p99 per mode of the Redis part and of the whole path, modes alternating by block."""
    index = await store.search_index()
    if index is None:
        raise BenchError("no index")
    redis_ms: dict[str, list[float]] = {m: [] for m in MODES}
    full_ms: dict[str, list[float]] = {m: [] for m in MODES}
    block = 10
    for start in range(0, len(queries), block):
        for mode, (readers, _) in MODES.items():
            flt = filter_for(readers)
            for i in range(start, min(start + block, len(queries))):
                q, v = queries[i], qvecs[i]
                redis_ms[mode].append(await timed(partial(hybrid_search, index, flt, v, q, 5)))
                full_ms[mode].append(await timed(partial(full_search, store, readers, q)))
    return {m: {"redis": summary(redis_ms[m]), "search_documents": summary(full_ms[m])} for m in MODES}


async def full_search(store: DocumentStore, readers: Readers | None, query: str) -> None:
    """The tool's path: embed the query, then the filtered hybrid search (the floor: no filter)."""
    if readers is not None:
        await store.search(readers, query, 5)
        return
    index = await store.search_index()
    assert index is not None
    vector = (await store.embedder.embed([query]))[0]
    await hybrid_search(index, "*", vector, query, 5)


async def measure_recall(store: DocumentStore, corpus: Corpus, qvecs: np.ndarray) -> dict[str, float]:
    """Mean recall@10 of the filtered KNN against a brute-force scan of the allowed chunks."""
    index = await store.search_index()
    assert index is not None
    out = {}
    for mode, (readers, allowed) in MODES.items():
        rows = np.array([i for i, c in enumerate(corpus.categories) if c in allowed])
        sub = corpus.vectors[rows]
        recalls = []
        for v in qvecs:
            got = await vector_candidates(index, filter_for(readers), v, 10)
            exact = np.sort(sub @ v)[::-1][:10]
            found = np.array(sorted((c.similarity or 0.0 for c in got), reverse=True))
            # By similarity, not by key: equal vectors may come back in any order.
            recalls.append(float(np.sum(found >= exact[-1] - 1e-4)) / len(exact) if len(found) else 0.0)
        out[mode] = float(np.mean(recalls))
    return out


async def run_async(conf: dict[str, Any]) -> dict[str, Any]:
    cancel_on_sigint()
    with tempfile.TemporaryDirectory(prefix="bench-rag-") as tmp:
        server = RedisServer(free_port(), Path(tmp)).start()
        redis = Redis.from_url(server.url, socket_timeout=60)
        try:
            return await measure_all(redis, conf)
        finally:
            await redis.aclose()
            server.stop()


async def measure_all(redis: Redis, conf: dict[str, Any]) -> dict[str, Any]:
    configure_logging("WARNING", service="bench-rag")  # the table, not the stores' info lines
    embedder = make_embedder(GraphSettings())
    await embedder.embed(["warm up the model"])
    parsed, categories = make_corpus(conf["chunks"])
    n = sum(len(p.chunks) for p in parsed)
    queries = make_queries(conf["queries"])
    qvecs = await embedder.embed(queries)
    results: dict[str, Any] = {"chunks": n, "embedding_model": embedder.model_id, "algorithms": {}}
    vectors: np.ndarray | None = None
    for algorithm in ("flat", "hnsw"):
        store = DocumentStore(redis, embedder, f"bench_{algorithm}", algorithm)
        times = await ingest(store, parsed, vectors)
        if vectors is None:  # the first index: its ingestion is what is measured
            results["ingest"] = ingest_figures(n, times)
            print_ingest(results["ingest"], embedder.model_id)
            vectors = await stored_vectors(redis, store, parsed)
        corpus = Corpus(parsed, categories, vectors)
        search = await measure_search(store, queries, qvecs)
        recall = await measure_recall(store, corpus, qvecs)
        results["algorithms"][algorithm] = {"search": search, "recall_at_10": recall}
        print_search(algorithm, search, recall, corpus)
    return results


async def stored_vectors(redis: Redis, store: DocumentStore, parsed: list[Parsed]) -> np.ndarray:
    """The vectors as written (so the second index and the brute force use the very same)."""
    from vagent_shared import redis_keys

    rows = []
    async with redis.pipeline(transaction=False) as pipe:
        for p in parsed:
            for c in p.chunks:
                key = redis_keys.doc_chunk(store.index, p.spec.domain, p.spec.doc_id, c.position)
                pipe.hget(key, "embedding")
        for raw in await pipe.execute():
            rows.append(np.frombuffer(raw, dtype=np.float32))
    return np.vstack(rows)


def ingest_figures(n: int, times: dict[str, float]) -> dict[str, float]:
    total = times["embed_seconds"] + times["write_seconds"]
    return {
        "chunks": n,
        "chunks_per_second": n / total,
        "embed_chunks_per_second": n / times["embed_seconds"] if times["embed_seconds"] else float("nan"),
        "write_chunks_per_second": n / times["write_seconds"],
        **times,
    }


def print_ingest(figures: dict[str, float], model: str) -> None:
    print(
        f"\ningestion of {figures['chunks']:,} chunks: {figures['chunks_per_second']:.0f} chunks/s "
        f"(embedding {figures['embed_chunks_per_second']:.0f}/s with {model}; "
        f"writing {figures['write_chunks_per_second']:.0f}/s)"
    )


def print_search(
    algorithm: str, search: dict[str, dict[str, dict[str, float]]], recall: dict[str, float], corpus: Corpus
) -> None:
    n = len(corpus.categories)
    print(f"\n{algorithm.upper()} index: search p50 / p99 in ms (k=5), recall@10 vs brute force")
    head = ("mode", "allowed", "redis p50", "p99", "tool p50", "p99", "recall@10")
    print("   {:<11} {:>8} {:>10} {:>7} {:>9} {:>7} {:>10}".format(*head))
    floor = search["unfiltered"]["redis"]["p50"]
    for mode, (_, allowed) in MODES.items():
        share = sum(1 for c in corpus.categories if c in allowed) / n
        r, f = search[mode]["redis"], search[mode]["search_documents"]
        print(
            f"   {mode:<11} {share:>7.1%} {r['p50']:>10.2f} {r['p99']:>7.2f} {f['p50']:>9.2f} "
            f"{f['p99']:>7.2f} {recall[mode]:>10.3f}"
        )
    for mode in ("5% user", "50% user"):
        ratio = search[mode]["redis"]["p50"] / floor
        print(f"   filtered/unfiltered redis p50 {mode:<9} {ratio:.2f}x  {verdict(ratio, RATIO_TARGET)}")
        exact = "PASS" if recall[mode] >= 0.9995 else "MISS"
        print(f"   recall@10 {mode:<9} {recall[mode]:.3f} (brute force 1.000)  {exact}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, help=f"chunks in the corpus (default {DEFAULTS['chunks']})")
    p.add_argument("--queries", type=int, help=f"queries per mode (default {DEFAULTS['queries']})")
    p.add_argument("--quick", action="store_true", help="tiny numbers for a smoke test: " + str(QUICK))
    p.add_argument("--json", type=Path, help="results file (default bench/results/rag-<timestamp>.json)")
    args = p.parse_args(argv)
    args.counts = resolve_counts(args, DEFAULTS, QUICK)
    args.json_path = args.json or default_results_path("rag")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = datetime.now(UTC)
    info = machine_info(["redisvl", "onnxruntime", "redis"])
    print_machine("vagent RAG benchmark", info, started)
    conf = dict(args.counts)
    print(
        f"   config  : {conf['chunks']:,} chunks in documents of {CHUNKS_PER_DOC}, "
        f"{conf['queries']} queries per mode"
    )
    figures = asyncio.run(run_async(conf))
    return make_results(started, info, conf, **figures)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 after a complete run, MISS or not; 130 on Ctrl-C, 1 when a run fails."""
    args = parse_args(argv)
    return run_main(lambda: run(args), args.json_path)


if __name__ == "__main__":
    sys.exit(main())
