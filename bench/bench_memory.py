#!/usr/bin/env python3
"""Benchmark memory recall: what recalling a user's memories adds to a turn, with 1,000 users
x 200 memories each in one Redis, at 20 concurrent conversations; Redis bytes per memory.

1. Fill. ``--users`` x ``--per-user`` memories in the store's own documents (LangGraph's
   AsyncRedisStore layout: a JSON document with the memory, one with its vector, both with
   the TTL), written with pipelines. Their vectors are random unit vectors, not embeddings:
   embedding 200,000 texts on 2 cores would take ~10 minutes and the KNN costs the same
   (FLAT: exact distances over the owner's memories). One user's memories are written
   through ``MemoryStore.add`` with real embeddings first, and the filled documents are
   checked to have exactly that shape. Redis bytes per memory: ``used_memory`` delta / count.
2. Store level (diagnostics). Recall exactly as a turn does it (``Memories.recall``: the
   owner's memories most relevant to the question, page by page, each page through
   ``rules.recallable``), at ``--conversations`` conversations whose "model" is a plain
   wait of ``--model-ms`` (300: a stress far above a real model's pace, ~66 questions/s at
   20 conversations), ``--stress-turns`` turns each, in three modes alternating by block:
   no recall, recall, recall of questions already embedded. Also: the recall step for a user
   without memories (nothing to rank: no embedding), one page of the library's
   ``asearch`` against ``MemoryStore.search``, and another user's memories recalled (0).
3. Turns through the graph (the headline and the verdict; bench/memory_turns.py). The paced
   model stand-in of bench_capacity (first token after ``--ttft-ms``, then ``--chunks``
   chunks ``--chunk-ms`` apart: 300 + 120 x 25 ms = a 3.3 s answer) and TWO graph services
   on the filled Redis, the packaged agent with ``memory:`` enabled (ON) and disabled (OFF).
   ``--conversations`` conversations of filled users at once (half DMs, half group rooms
   whose one other reader heard ~30% of the owner's memories), ``--warmup`` unmeasured
   turns each on each graph, then ``--turns`` measured turns each per mode, alternating by
   blocks of 5, with the bot's GraphClient. Reported: time to the first text chunk and to
   ``done``, p50/p99 per mode and ON - OFF (target: added <= 10 ms p50, <= 30 ms p99), the
   graphs' CPU per turn and RSS, errors, and the recalls the ON graph made (its /metrics;
   none on OFF: else the run fails) with its ``memory_recalled`` audit records (memories
   per recall; another user's: must be 0). A MISS never makes the exit code non-zero.

Everything runs on free 127.0.0.1 ports (its own Redis, the stand-in, the graphs), stopped
at the end, on an error or on Ctrl-C. The defaults take ~8 minutes on 2 cores.

    .venv/bin/python bench/bench_memory.py            # or: make bench-memory
    .venv/bin/python bench/bench_memory.py --quick    # < 1 minute, for smoke tests
    options: --users --per-user --conversations --turns --warmup --ttft-ms --chunk-ms
             --chunks --stress-turns --model-ms --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from redis.asyncio import Redis
from redis.commands.search.query import Query
from ulid import ULID

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.bench_capacity import git_state  # noqa: E402
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
)
from bench.memory_turns import DOMAIN, graph_turns, other_of, passed, print_graph_turns, user_id  # noqa: E402
from redis_local import RedisServer, free_port  # noqa: E402
from tests.support.factories import ac  # noqa: E402
from vagent_graph.knowledge.embeddings import make_embedder  # noqa: E402
from vagent_graph.memory.memories import MIN_PAGE as PAGE  # noqa: E402
from vagent_graph.memory.memories import Memories  # noqa: E402
from vagent_graph.memory.store import TEXT_FIELD, MemoryStore, ttl_minutes  # noqa: E402
from vagent_graph.services import Services  # noqa: E402
from vagent_shared import redis_keys  # noqa: E402
from vagent_shared.knowledge import Audience, AudienceMember  # noqa: E402
from vagent_shared.logs import configure_logging  # noqa: E402
from vagent_shared.memory import Memory, MemoryPolicy  # noqa: E402
from vagent_shared.readers import Readership  # noqa: E402
from vagent_shared.settings import GraphSettings  # noqa: E402

DEFAULTS = {
    "users": 1_000,
    "per_user": 200,
    "conversations": 20,
    "turns": 20,
    "warmup": 1,
    "ttft_ms": 300,
    "chunk_ms": 25,
    "chunks": 120,
    "stress_turns": 20,
    "model_ms": 300,
}
QUICK = {
    "users": 20,
    "per_user": 20,
    "conversations": 4,
    "turns": 4,
    "warmup": 1,
    "ttft_ms": 50,
    "chunk_ms": 10,
    "chunks": 10,
    "stress_turns": 4,
    "model_ms": 20,
}
POLICY = MemoryPolicy(enabled=True)
#: Turns per block before the modes swap.
BLOCK = 5
#: Memories written (and documents encoded) per pipeline.
FILL_BATCH = 500
GROUP_SHARE = 0.3
DIMS = 384
FACTS = [
    "I drink {x} every morning",
    "My favourite city is {x}",
    "Please answer me in {x}",
    "I am allergic to {x}",
    "My team works on {x}",
    "Remind me that the {x} review is on Fridays",
    "I prefer {x} for travel",
    "My manager is interested in {x}",
]
WORDS = [
    "green tea",
    "York",
    "German",
    "peanuts",
    "databases",
    "budget",
    "trains",
    "security",
    "coffee",
    "Lisbon",
]
QUESTIONS = [
    "What do I usually drink?",
    "Which language should you answer in?",
    "Where would I like to travel next?",
    "What is my team working on at the moment?",
    "Is there anything I cannot eat?",
    "When is the review again?",
    "What does my manager care about?",
    "Book me something for the trip to {x}",
]


def make_text(rng: random.Random, n: int) -> str:
    return f"{rng.choice(FACTS).format(x=rng.choice(WORDS))} (note {n})"


def make_memory(rng: random.Random, owner_n: int, i: int, t0: datetime) -> Memory:
    owner = user_id(owner_n)
    group = rng.random() < GROUP_SHARE
    return Memory(
        id=f"m{owner_n:05d}-{i:04d}",
        owner=owner,
        domain=DOMAIN,
        text=make_text(rng, i),
        created_at=t0 + timedelta(seconds=i),
        room_id=f"!group{owner_n}:bench" if group else f"!dm{owner_n}:bench",
        heard_by=tuple(sorted({owner, other_of(owner_n)})) if group else (owner,),
    )


# ---------------------------------------------------------------------------- the fill


def documents(memory: Memory, vector: np.ndarray, now: datetime) -> tuple[bytes, bytes]:
    """The two JSON documents AsyncRedisStore writes for a memory (aio.py `_batch_put_ops`)."""
    prefix = store_prefix_text(redis_keys.memory_namespace(memory.owner, memory.domain))
    micros = int(now.timestamp() * 1_000_000)
    doc = {
        "prefix": prefix,
        "key": memory.id,
        "value": memory.model_dump(mode="json"),
        "created_at": micros,
        "updated_at": micros,
    }
    vec = {
        "prefix": prefix,
        "key": memory.id,
        "field_name": TEXT_FIELD,
        "embedding": vector.tolist(),
        "created_at": now.timestamp(),
        "updated_at": now.timestamp(),
    }
    return orjson.dumps(doc), orjson.dumps(vec)


def store_prefix_text(namespace: tuple[str, ...]) -> str:
    """The namespace as the store writes it (its own escaping)."""
    from langgraph.store.redis.base import _namespace_to_text

    return _namespace_to_text(namespace)


def random_unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIMS)).astype(np.float32)
    out: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


async def fill(redis: Redis, users: range, per_user: int, seed: int = 5) -> float:
    """Every user's memories in the store's documents; seconds taken."""
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    t0, now = datetime(2026, 1, 1, tzinfo=UTC), datetime.now(UTC)
    ttl = ttl_minutes(POLICY) * 60
    started = time.perf_counter()
    batch: list[Memory] = []

    async def flush() -> None:
        vectors = random_unit_vectors(nrng, len(batch))
        async with redis.pipeline(transaction=False) as pipe:
            for memory, vector in zip(batch, vectors, strict=True):
                doc, vec = documents(memory, vector, now)
                ulid = str(ULID())
                key = f"{redis_keys.MEMORY_STORE_PREFIX}:{ulid}"
                vkey = f"{redis_keys.MEMORY_VECTOR_PREFIX}:{ulid}"
                pipe.execute_command("JSON.SET", key, "$", doc)
                pipe.execute_command("JSON.SET", vkey, "$", vec)
                pipe.expire(key, ttl)
                pipe.expire(vkey, ttl)
            await pipe.execute()
        batch.clear()

    for n in users:
        for i in range(per_user):
            batch.append(make_memory(rng, n, i, t0))
            if len(batch) >= FILL_BATCH:
                await flush()
    if batch:
        await flush()
    return time.perf_counter() - started


async def check_shape(redis: Redis, store: MemoryStore, filled_owner: str) -> None:
    """A memory written by MemoryStore.add and a filled one are the same documents (same
    fields, same TTL); the filled one is found by search and parses."""
    real = make_memory(random.Random(1), 99_999, 0, datetime.now(UTC))
    await store.add(real, POLICY)
    shapes = {}
    for owner in (real.owner, filled_owner):
        prefix = store_prefix_text(redis_keys.memory_namespace(owner, DOMAIN))
        for index in (redis_keys.MEMORY_STORE_PREFIX, redis_keys.MEMORY_VECTOR_PREFIX):
            found = await redis.ft(index).search(Query(f"@prefix:{prefix}").paging(0, 1).no_content())
            key = found.docs[0].id  # type: ignore[union-attr]
            doc: Any = await redis.json().get(key)  # type: ignore[misc]
            ttl = await redis.ttl(key)
            shapes[(owner == real.owner, index)] = (sorted(doc), sorted(doc.get("value", {})), ttl > 0)
    for index in (redis_keys.MEMORY_STORE_PREFIX, redis_keys.MEMORY_VECTOR_PREFIX):
        if shapes[(True, index)] != shapes[(False, index)]:
            raise BenchError(f"filled {index} documents differ from the store's: {shapes}")
    if not await store.search(filled_owner, DOMAIN, "what do I drink?", 1):
        raise BenchError("a filled memory is not found by MemoryStore.search")
    assert await store.delete_all(real.owner) == 1


async def used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


# ---------------------------------------------------------------------------- recall


def readership(n: int, group: bool) -> Readership:
    audience = Audience(members=[AudienceMember(user_id=other_of(n))], member_count=3) if group else None
    return Readership(ac(user_id(n), [], domain=DOMAIN), audience)


async def recall(store: MemoryStore, who: Readership, query: str, k: int) -> list[Memory]:
    """Recall exactly as a turn does it: memories.Memories.recall (no audit trail here)."""
    policy = POLICY.model_copy(update={"recall_k": k})
    found = await Memories(store, policy, Services()).recall(who, "", query)
    return found.memories


class Conversations:
    """`n` conversations of random users, each with its questions and model waits, fixed by
    the seed so both modes run the very same turns."""

    def __init__(self, n: int, users: int, turns: int, model_ms: int, seed: int = 9) -> None:
        rng = random.Random(seed)
        owners = rng.sample(range(users), n)
        self.who = [readership(o, group=i % 2 == 1) for i, o in enumerate(owners)]
        self.questions = [
            [f"{rng.choice(QUESTIONS).format(x=rng.choice(WORDS))} ({i}.{t})" for t in range(turns)]
            for i in range(n)
        ]
        self.waits = [[model_ms / 1000 * rng.uniform(0.8, 1.2) for _ in range(turns)] for _ in range(n)]


async def run_turns(
    store: MemoryStore, convs: Conversations, turns: range, with_recall: bool, k: int
) -> tuple[list[float], list[float], Counter[str]]:
    """Every conversation's `turns` at once; turn ms, recall ms, and what was recalled."""
    turn_ms: list[float] = []
    recall_ms: list[float] = []
    seen: Counter[str] = Counter()

    async def conversation(i: int) -> None:
        who = convs.who[i]
        for t in turns:
            start = time.perf_counter()
            if with_recall:
                got = await recall(store, who, convs.questions[i][t], k)
                recall_ms.append((time.perf_counter() - start) * 1000)
                seen["recalls"] += 1
                seen["memories"] += len(got)
                seen["foreign"] += sum(m.owner != who.ac.user_id for m in got)
            await asyncio.sleep(convs.waits[i][t])  # the model call
            turn_ms.append((time.perf_counter() - start) * 1000)

    await asyncio.gather(*(conversation(i) for i in range(len(convs.who))))
    return turn_ms, recall_ms, seen


async def empty_store_recall(store: MemoryStore, convs: Conversations, k: int) -> list[float]:
    """The recall step for a user without memories (recall sees there is nothing to rank and
    embeds nothing), the same questions, one conversation at a time."""
    nobody = readership(-1, group=False)
    out = []
    for questions in convs.questions:
        for q in questions[: max(1, len(questions) // 4)]:
            start = time.perf_counter()
            await recall(store, nobody, f"{q} (nobody)", k)  # not a cached question
            out.append((time.perf_counter() - start) * 1000)
    return out


async def library_vs_store(store: MemoryStore, convs: Conversations) -> dict[str, dict[str, float]]:
    """One page of a search, one at a time: the library's own `asearch` against
    `MemoryStore.search` (why the store runs its own KNN), each with its own questions'
    embedding, alternating."""
    library = await store._ready()
    lib_ms: list[float] = []
    own_ms: list[float] = []
    for who, questions in zip(convs.who, convs.questions, strict=True):
        owner = who.ac.user_id
        for q in questions[: max(1, len(questions) // 4)]:
            start = time.perf_counter()
            await library.asearch(
                redis_keys.memory_namespace(owner, DOMAIN), query=f"{q} (a)", limit=PAGE, refresh_ttl=False
            )
            lib_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            await store.search(owner, DOMAIN, f"{q} (b)", PAGE)
            own_ms.append((time.perf_counter() - start) * 1000)
    return {"library_asearch": summary(lib_ms), "memory_store_search": summary(own_ms)}


async def measure_recall(store: MemoryStore, conf: dict[str, Any]) -> dict[str, Any]:
    """Per block: the baseline turns, the same turns with recall, then once more with the
    questions already embedded (what the Redis part and the rules add on their own)."""
    convs = Conversations(conf["conversations"], conf["users"], conf["stress_turns"], conf["model_ms"])
    warm = Conversations(conf["conversations"], conf["users"], 2, conf["model_ms"], seed=99)
    k = POLICY.recall_k
    await run_turns(store, warm, range(2), True, k)  # warm-up: pools, the model (other questions)
    turns: dict[str, list[float]] = {"baseline": [], "recall": [], "pre_embedded": []}
    step: dict[str, list[float]] = {"recall": [], "pre_embedded": []}
    seen: Counter[str] = Counter()
    for start in range(0, conf["stress_turns"], BLOCK):
        block = range(start, min(start + BLOCK, conf["stress_turns"]))
        for mode in ("baseline", "recall", "pre_embedded"):
            if mode == "pre_embedded":
                await store._vectors([q for qs in convs.questions for q in qs[block.start : block.stop]])
            t_ms, r_ms, s = await run_turns(store, convs, block, mode != "baseline", k)
            turns[mode] += t_ms
            if mode != "baseline":
                step[mode] += r_ms
            if mode == "recall":
                seen += s
            seen["foreign"] += s["foreign"] if mode == "pre_embedded" else 0
    base, with_recall, pre = (summary(turns[m]) for m in ("baseline", "recall", "pre_embedded"))
    return {
        "turn_ms": {"baseline": base, "recall": with_recall, "pre_embedded": pre},
        "added_ms": {q: with_recall[q] - base[q] for q in ("p50", "p99")},
        "ratio": {q: with_recall[q] / base[q] for q in ("p50", "p99")},
        "added_without_embedding_ms": {q: pre[q] - base[q] for q in ("p50", "p99")},
        "recall_step_ms": summary(step["recall"]),
        "recall_step_pre_embedded_ms": summary(step["pre_embedded"]),
        "empty_store_recall_ms": summary(await empty_store_recall(store, convs, k)),
        "one_page_ms": await library_vs_store(store, convs),
        "recalls": seen["recalls"],
        "memories_recalled_per_turn": seen["memories"] / max(1, seen["recalls"]),
        "foreign_memories": seen["foreign"],
    }


# ---------------------------------------------------------------------------- the run


async def store_level(redis_url: str, conf: dict[str, Any]) -> dict[str, Any]:
    """The fill, its shape check and the store-level diagnostics (this process's own
    embedder and store, closed before the graphs start)."""
    cancel_on_sigint()
    redis = Redis.from_url(redis_url, socket_timeout=60)
    try:
        return await measure_store(redis, conf)
    finally:
        await redis.aclose()


async def measure_store(redis: Redis, conf: dict[str, Any]) -> dict[str, Any]:
    configure_logging("WARNING", service="bench-memory")
    embedder = make_embedder(GraphSettings())
    await embedder.embed(["warm up the model"])
    store = MemoryStore(redis, embedder)
    await store.setup()
    try:
        before = await used_memory(redis)
        count = conf["users"] * conf["per_user"]
        seconds = await fill(redis, range(conf["users"]), conf["per_user"])
        after = await used_memory(redis)
        per_memory = (after - before) / count
        print(
            f"\nfill: {count:,} memories of {conf['users']:,} users in {seconds:.1f} s "
            f"({count / seconds:,.0f}/s; random unit vectors, store's document layout)"
        )
        print(
            f"redis memory per memory: {per_memory:,.0f} bytes "
            f"(used_memory {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB, 2 keys each)"
        )
        await check_shape(redis, store, user_id(0))
        print("filled documents: same fields and TTL as MemoryStore.add's; found by MemoryStore.search")
        recall_figures = await measure_recall(store, conf)
    finally:
        await store.aclose()
    print_recall(recall_figures, conf)
    return {
        "embedding_model": embedder.model_id,
        "fill": {"memories": count, "seconds": seconds, "per_second": count / seconds},
        "redis": {"used_memory_before": before, "used_memory_after": after, "bytes_per_memory": per_memory},
        "recall": recall_figures,
    }


def print_recall(r: dict[str, Any], conf: dict[str, Any]) -> None:
    base, rec = r["turn_ms"]["baseline"], r["turn_ms"]["recall"]
    print(
        f"\nstore level (diagnostics), {conf['conversations']} concurrent conversations, "
        f"{r['recalls']} recalls (recall_k {POLICY.recall_k}, pages of {PAGE})"
    )
    for q in ("p50", "p99"):
        print(
            f"   stress, a {conf['model_ms']} ms model: turn {q} without recall {base[q]:7.1f} ms, "
            f"with recall {rec[q]:7.1f} ms: {r['ratio'][q]:.3f}x, added {r['added_ms'][q]:5.1f} ms"
        )
    step, empty = r["recall_step_ms"], r["empty_store_recall_ms"]
    pre, pre_added = r["recall_step_pre_embedded_ms"], r["added_without_embedding_ms"]
    print(f"   recall step alone     p50 {step['p50']:5.1f} ms  p99 {step['p99']:5.1f} ms")
    print(
        f"   question pre-embedded p50 {pre['p50']:5.1f} ms  p99 {pre['p99']:5.1f} ms "
        f"(added to the turn: p50 {pre_added['p50']:.1f} ms, p99 {pre_added['p99']:.1f} ms)"
    )
    print(
        f"   empty store (1 conv.) p50 {empty['p50']:5.1f} ms  p99 {empty['p99']:5.1f} ms "
        "(a user without memories: nothing to rank, so no embedding)"
    )
    lib, own = r["one_page_ms"]["library_asearch"], r["one_page_ms"]["memory_store_search"]
    print(
        f"   one page (1 conv.)    p50 {own['p50']:5.1f} ms  p99 {own['p99']:5.1f} ms "
        f"(the library's asearch: p50 {lib['p50']:.1f} ms, p99 {lib['p99']:.1f} ms)"
    )
    print(
        f"   recalled {r['memories_recalled_per_turn']:.1f} memories per turn; "
        f"another user's: {r['foreign_memories']}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--users", type=int, help=f"users (default {d['users']})")
    p.add_argument("--per-user", dest="per_user", type=int, help=f"memories each (default {d['per_user']})")
    p.add_argument("--conversations", type=int, help=f"concurrent (default {d['conversations']})")
    p.add_argument(
        "--turns", type=int, help=f"measured graph turns per conversation and mode (default {d['turns']})"
    )
    p.add_argument(
        "--warmup", type=int, help=f"unmeasured graph turns each, per mode (default {d['warmup']})"
    )
    p.add_argument(
        "--ttft-ms", dest="ttft_ms", type=int, help=f"paced model's first token (default {d['ttft_ms']})"
    )
    p.add_argument(
        "--chunk-ms", dest="chunk_ms", type=int, help=f"ms between its chunks (default {d['chunk_ms']})"
    )
    p.add_argument("--chunks", type=int, help=f"chunks of its answer (default {d['chunks']})")
    p.add_argument(
        "--stress-turns",
        dest="stress_turns",
        type=int,
        help=f"store-level turns per conversation and mode (default {d['stress_turns']})",
    )
    p.add_argument(
        "--model-ms", dest="model_ms", type=int, help=f"store-level model wait (default {d['model_ms']})"
    )
    p.add_argument("--quick", action="store_true", help="tiny numbers for a smoke test: " + str(QUICK))
    p.add_argument("--json", type=Path, help="results file (default bench/results/memory-<timestamp>.json)")
    args = p.parse_args(argv)
    args.counts = resolve_counts(args, DEFAULTS, QUICK)
    c = args.counts
    if min(c.values()) < 0 or min(c["users"], c["per_user"], c["conversations"], c["turns"], c["chunks"]) < 1:
        p.error("every number must be >= 0, and --users --per-user --conversations --turns --chunks >= 1")
    args.json_path = args.json or default_results_path("memory")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = datetime.now(UTC)
    info = machine_info(["langgraph-checkpoint-redis", "redisvl", "onnxruntime", "redis", "langgraph"])
    print_machine("vagent memory benchmark", info, started)
    conf = dict(args.counts)
    print(
        f"   config  : {conf['users']:,} users x {conf['per_user']} memories, "
        f"{conf['conversations']} conversations x {conf['turns']} graph turns per mode"
    )
    conf["code"] = git_state()  # the graph code measured (the working tree)
    print(f"   code    : {conf['code']}")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-memory-")))
        (tmp / "redis").mkdir()
        server = RedisServer(free_port(), tmp / "redis")
        stack.callback(server.stop)
        server.start()
        figures = asyncio.run(store_level(server.url, conf))
        assert server.proc is not None
        turns = graph_turns(server.url, server.proc.pid, tmp, conf)
    print_graph_turns(turns, conf)
    return make_results(started, info, conf, **figures, graph_turns=turns, **{"pass": passed(turns)})


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 after a complete run, MISS or not; 130 on Ctrl-C, 1 when a run fails."""
    args = parse_args(argv)
    return run_main(lambda: run(args), args.json_path)


if __name__ == "__main__":
    sys.exit(main())
