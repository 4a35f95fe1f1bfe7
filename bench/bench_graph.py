#!/usr/bin/env python3
"""Benchmark the graph service: what HTTP/SSE costs on top of the bare graph, and how much
Redis one conversation holds as it grows.

1. Latency. The same 20-chunk answer from a zero-delay OpenAI-compatible stand-in, measured
   BARE (in-process ``graph.astream`` of a graph built exactly as the service builds it) and
   SERVICE (``POST /api/v1/process_message`` to the real ``vagent-graph`` subprocess, SSE
   read by the bot's own GraphClient), sequentially and at ``--concurrency``. p50/p99 of
   time to the first text and to the end; the service/bare ratio shows the overhead of the service layer.
2. Redis. ``MEMORY USAGE`` summed over every key of ONE session after 10 and ``--turns``
   turns, on a dedicated Redis, to show whether a session's footprint stays bounded.

Everything runs locally: two Redis servers, the LLM stand-in (its own process, so it never
competes with the measured code for the GIL) and the service, all on 127.0.0.1 free ports,
torn down at the end or on Ctrl-C. A MISS never makes the exit code non-zero.

    .venv/bin/python bench/bench_graph.py            # or: make bench-graph
    .venv/bin/python bench/bench_graph.py --quick    # seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.common import (  # noqa: E402
    ANSWER,
    CHUNKS,
    INTERRUPTED,
    QUESTION,
    BenchError,
    cancel_on_sigint,
    default_results_path,
    fork_child,
    llm_standin,
    machine_info,
    make_results,
    place_processes,
    print_log_tail,
    print_machine,
    resolve_counts,
    run_main,
    start_together,
    stop_child,
    summary,
    verdict,
)
from redis_local import RedisServer, free_port  # noqa: E402
from tests.support.factories import ac, message_body, new_session  # noqa: E402
from tests.support.graph_process import TOKEN, GraphProcess  # noqa: E402
from vagent_bot.clients.graph_client import GraphClient  # noqa: E402
from vagent_graph.agents.descriptor import load_descriptor  # noqa: E402
from vagent_graph.models.llm import make_chat_model, model_name  # noqa: E402
from vagent_graph.resources import open_resources  # noqa: E402
from vagent_graph.tools.catalogue import default_registry  # noqa: E402
from vagent_graph.turn.events import STREAM_MODES, durability_for  # noqa: E402
from vagent_graph.workflow.graph import new_turn_input, run_config  # noqa: E402
from vagent_shared import AcContext, redis_keys  # noqa: E402
from vagent_shared.events import Done, ErrorEvent, TextChunk  # noqa: E402
from vagent_shared.settings import CommonSettings, GraphSettings  # noqa: E402
from vagent_shared.wire import ProcessMessageRequest  # noqa: E402

#: The service's text window (STREAM_COALESCE_MS default): BARE streams as the service does.
COALESCE_MS: int = GraphSettings.model_fields["STREAM_COALESCE_MS"].default

RATIO_TARGET = 1.3
#: Requests per worker in one block of a concurrent phase: the first and the last of each
#: worker's are not counted (run_phase), so a block counts about (BLOCK_ROUNDS - 2) each.
BLOCK_ROUNDS = 6
REDIS_RATIO_TARGET = 2.0
FIRST_CHECKPOINT = 10
DEFAULTS: dict[str, int] = {"requests": 500, "concurrency": 20, "turns": 200, "warmup": 10}
QUICK: dict[str, int] = {"requests": 10, "concurrency": 4, "turns": 12, "warmup": 3}
#: Libraries whose versions the report names: what the numbers depend on.
VERSIONS_OF = (
    "langgraph",
    "langgraph-checkpoint-redis",
    "langchain-openai",
    "fastapi",
    "uvicorn",
    "sse-starlette",
    "aiohttp",
    "redis",
)
#: The same user (all tools visible) for every request, so the LLM request carries tool schemas.
USER_AC: AcContext = ac()


# ---------------------------------------------------------------------------- statistics


@dataclass
class Sample:
    """One request: seconds to the first text, seconds to the end, text items seen (the
    model's CHUNKS pieces, coalesced per STREAM_COALESCE_MS window), and their text."""

    first: float
    total: float
    chunks: int
    text: str = ""


@dataclass
class Phase:
    """All counted requests of one mode at one concurrency (`executed`: also the uncounted
    ones at the edges of each block; see run_phase), and the time they all took."""

    mode: str
    concurrency: int
    samples: list[Sample]
    wall: float
    executed: int = 0

    @property
    def rps(self) -> float:
        """Completed requests per second over the phase's blocks, edges included."""
        return self.executed / self.wall if self.wall > 0 else 0.0

    def stats(self, attr: str) -> dict[str, float]:
        """p50/p99/mean/min/max in milliseconds, as printed and stored."""
        return summary([getattr(s, attr) * 1000 for s in self.samples])

    def to_json(self) -> dict[str, Any]:
        """The phase as stored in the results file."""
        return {
            "mode": self.mode,
            "concurrency": self.concurrency,
            "requests": len(self.samples),
            "requests_executed": self.executed,
            "wall_s": self.wall,
            "throughput_rps": self.rps,
            "first_event_ms": self.stats("first"),
            "total_ms": self.stats("total"),
            "text_items_min": min(s.chunks for s in self.samples),
            "text_items_max": max(s.chunks for s in self.samples),
            "whole_answer_every_time": all(s.text == ANSWER for s in self.samples),
        }


# --------------------------------------------------------------------- the LLM stand-in


def _warn_nagle(applied: bool) -> None:
    """Say so when the numbers include the stand-in's ~40 ms delayed-ACK stall."""
    if not applied:
        print("   WARNING: could not set TCP_NODELAY on the LLM stand-in; expect ~40 ms per call")


# ----------------------------------------------------------------------- graph building


def settings_from_env(env: dict[str, str]) -> GraphSettings:
    """GraphSettings exactly as the service subprocess will read them from `env`."""
    values: dict[str, Any] = {name: env[name] for name in GraphSettings.model_fields if name in env}
    return GraphSettings(**values)


@contextlib.asynccontextmanager
async def service_like_graph(settings: GraphSettings) -> AsyncIterator[CompiledStateGraph[Any]]:
    """The compiled graph exactly as the service's lifespan builds it (resources.open_resources)."""
    agent = load_descriptor(settings.AGENT_DESCRIPTOR)
    chat_model = make_chat_model(settings, agent)
    async with open_resources(
        settings, agent, default_registry(), chat_model, model_name(settings, agent)
    ) as resources:
        yield resources.graph


# ------------------------------------------------------------------------- one request


async def bare_request(graph: CompiledStateGraph[Any], session_id: str | None = None) -> Sample:
    """One in-process run; first = first text item (the answer's coalesced `custom` stream, as
    the service reads it), total = stream exhausted."""
    cfg = run_config(session_id or new_session().format(), coalesce_ms=COALESCE_MS)
    start = time.perf_counter()
    first: float | None = None
    chunks, pieces = 0, []
    graph_input = new_turn_input(QUESTION, USER_AC)
    run = graph.astream(  # stream modes and checkpoint policy as the service runs a new turn
        graph_input, cfg, stream_mode=STREAM_MODES, durability=durability_for(graph_input)
    )
    async for mode, payload in run:
        item = payload if mode == "custom" and isinstance(payload, dict) else {}
        if item.get("type") == "text" and item.get("content"):
            chunks += 1
            pieces.append(str(item["content"]))
            if first is None:
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    if first is None:
        raise BenchError("bare run streamed no text")
    return Sample(first, total, chunks, "".join(pieces))


async def service_request(client: GraphClient) -> Sample:
    """One POST through the bot's own graph client; first = first `text_chunk` event,
    total = `done` event (the stream is read to its end, so the connection is reused)."""
    req = ProcessMessageRequest.model_validate(message_body(new_session(), QUESTION, USER_AC))
    start = time.perf_counter()
    first: float | None = None
    total: float | None = None
    chunks, pieces = 0, []
    async for ev in client.process_message(req):
        if isinstance(ev, TextChunk):
            chunks += 1
            pieces.append(ev.content)
            if first is None:
                first = time.perf_counter() - start
        elif isinstance(ev, Done):
            total = time.perf_counter() - start
        elif isinstance(ev, ErrorEvent):
            raise BenchError(f"service answered an error event: {ev.message}")
    if first is None or total is None:
        raise BenchError("service stream ended without text or without done")
    return Sample(first, total, chunks, "".join(pieces))


async def run_phase(mode: str, request: Callable[[], Awaitable[Sample]], n: int, concurrency: int) -> Phase:
    """`n` requests by `concurrency` workers pulling from one counter.

    Only requests that ran while `concurrency` were in flight are counted: at c>1 each
    worker's first request is left out (all workers start at once, a burst that is not
    the steady state) and so is every request still running when the first worker found
    no more work (the drain, with fewer and fewer in flight). At c=1 every request counts.
    """
    todo = iter(range(n))
    runs: list[tuple[Sample, bool, float]] = []  # sample, worker's first, end time
    drain_at = math.inf

    async def worker() -> None:
        nonlocal drain_at
        first = True
        for _ in todo:
            sample = await request()
            runs.append((sample, first, time.perf_counter()))
            first = False
        drain_at = min(drain_at, time.perf_counter())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    wall = time.perf_counter() - start
    if concurrency == 1:
        counted = [s for s, _, _ in runs]
    else:
        counted = [s for s, first, end in runs if not first and end <= drain_at]
    return Phase(mode, concurrency, counted, wall, executed=len(runs))


#: Runs `n` requests of one mode at a concurrency: one block of run_interleaved.
Block = Callable[[int, int], Awaitable[Phase]]


async def warm_up(block: Block, n: int, concurrency: int) -> None:
    """Unmeasured: imports, caches and (for `concurrency` > 1) pooled connections."""
    await block(n, 1)
    if concurrency > 1:
        await block(concurrency, concurrency)


# ------------------------------------------------------------- the bot's client, apart


def _serve_client(conn: Connection) -> None:
    """Child process: the bot's GraphClient, running the blocks of SERVICE requests the
    parent asks for, until it says stop or goes away. Its own process, as the bot is in
    production: in the bench process, the bare graph's objects made every garbage
    collection during the client's reads slower (+1 ms to the first event, measured)."""
    loop = asyncio.new_event_loop()
    client: GraphClient | None = None
    try:
        url, token = conn.recv()
        client = GraphClient(url, token)

        async def request() -> Sample:
            assert client is not None
            return await service_request(client)

        while (job := conn.recv()) is not None:
            n, concurrency = job
            try:
                conn.send(loop.run_until_complete(run_phase("service", request, n, concurrency)))
            except Exception as exc:  # the parent raises it
                conn.send(BenchError(f"{type(exc).__name__}: {exc}"))
    except (EOFError, OSError):
        pass
    finally:
        if client is not None:
            loop.run_until_complete(client.aclose())
        loop.close()


class ClientProcess:
    """The SERVICE mode's requests, made by `_serve_client` in a process of its own.
    Start it (it forks) before any thread exists; `connect` once the service is up."""

    def __init__(self) -> None:
        self._conn, self._proc = fork_child(_serve_client, "bench-client")

    def connect(self, url: str, token: str) -> None:
        self._conn.send((url, token))

    async def block(self, n: int, concurrency: int) -> Phase:
        self._conn.send((n, concurrency))
        try:
            result = await asyncio.to_thread(self._conn.recv)
        except EOFError:
            raise BenchError(f"the client process exited (code {self._proc.exitcode})") from None
        if isinstance(result, Exception):
            raise result
        return result  # type: ignore[no-any-return]

    def stop(self) -> None:
        stop_child(self._conn, self._proc, None, 10)


# ------------------------------------------------------------------------ Redis memory


@dataclass
class MemoryPoint:
    """What one session holds in Redis after `turns` turns."""

    turns: int
    bytes: int
    keys: int
    by_prefix: dict[str, dict[str, int]] = field(default_factory=dict)
    other_keys: int = 0
    #: The audit stream (every access decision of the run, docs/audit.md): the service's
    #: record, not the session's state, so reported beside it.
    audit_stream_bytes: int = 0
    #: The turns' TurnTraces and the day's token counters (docs/traces.md, docs/budgets.md):
    #: records kept for TRACE_TTL_SECONDS / days whatever the session does, so reported apart
    #: (a trace grows with the turns by design; the session's state must not).
    record_keys: int = 0
    record_bytes: int = 0


#: Keys of the records kept beside the session (traces, usage counters): reported apart.
RECORD_PREFIXES = (redis_keys.TRACE_PREFIX.encode(), b"usage:")


async def session_footprint(redis: Redis, session_id: str, turns: int) -> MemoryPoint:
    """Sum MEMORY USAGE over every key naming the session. The checkpointer embeds the thread
    id verbatim (`checkpoint:<tid>:`, `checkpoint_write:<tid>:__empty__:...`,
    `write_keys_zset:<tid>:__empty__:shallow`); the Redis is dedicated, so a substring
    match cannot pick up another session whose id merely starts the same way."""
    tid, audit = session_id.encode(), CommonSettings().AUDIT_STREAM.encode()
    keys = [k async for k in redis.scan_iter(count=1000) if k != audit]
    records = [k for k in keys if k.startswith(RECORD_PREFIXES)]
    keys = [k for k in keys if not k.startswith(RECORD_PREFIXES)]
    mine = sorted(k for k in keys if tid in k)
    point = MemoryPoint(turns=turns, bytes=0, keys=len(mine), other_keys=len(keys) - len(mine))
    point.audit_stream_bytes = int(await redis.memory_usage(audit, samples=0) or 0)
    point.record_keys = len(records)
    for k in records:
        point.record_bytes += int(await redis.memory_usage(k, samples=0) or 0)
    for i in range(0, len(mine), 500):
        batch = mine[i : i + 500]
        pipe = redis.pipeline(transaction=False)
        for k in batch:
            pipe.memory_usage(k, samples=0)  # 0 = every element of aggregates, not a sample
        for k, used in zip(batch, await pipe.execute(), strict=True):
            prefix = k.split(b":", 1)[0].decode()
            slot = point.by_prefix.setdefault(prefix, {"keys": 0, "bytes": 0})
            slot["keys"] += 1
            slot["bytes"] += int(used or 0)
            point.bytes += int(used or 0)
    return point


async def measure_memory(
    service: GraphProcess, redis_url: str, turns: int, checkpoints: list[int]
) -> list[MemoryPoint]:
    """One session, `turns` turns (user message + normal 20-chunk answer) through the real
    service over HTTP - what the service keeps is what counts - on a dedicated Redis; the
    footprint is taken after each checkpoint turn."""
    session = new_session()
    points: list[MemoryPoint] = []
    redis = Redis.from_url(redis_url)
    try:
        client = GraphClient(service.url, TOKEN)
        try:
            for turn in range(1, turns + 1):
                body = message_body(session, f"{QUESTION} ({turn})", USER_AC)
                async for _ in client.process_message(ProcessMessageRequest.model_validate(body)):
                    pass
                if turn in checkpoints:
                    points.append(await session_footprint(redis, session.format(), turn))
        finally:
            await client.aclose()
    finally:
        await redis.aclose()
    return points


# ------------------------------------------------------------------------------ report


def print_latency(phases: list[Phase]) -> list[dict[str, Any]]:
    """Table of every phase, then the service/bare ratios per concurrency."""
    print("\n1) Latency: bare graph.astream vs HTTP/SSE service, milliseconds")
    print(
        f"   {'mode':<8}{'conc':>5}{'n':>6}{'run':>6}{'first p50':>11}{'first p99':>11}"
        f"{'total p50':>11}{'total p99':>11}{'req/s':>9}"
    )
    for p in phases:
        f, t = p.stats("first"), p.stats("total")
        print(
            f"   {p.mode:<8}{p.concurrency:>5}{len(p.samples):>6}{p.executed:>6}"
            f"{f['p50']:>11.2f}{f['p99']:>11.2f}{t['p50']:>11.2f}{t['p99']:>11.2f}{p.rps:>9.1f}"
        )
    ratios: list[dict[str, Any]] = []
    by = {(p.mode, p.concurrency): p for p in phases}
    for conc in sorted({p.concurrency for p in phases}):
        bare, svc = by[("bare", conc)], by[("service", conc)]
        r: dict[str, Any] = {"concurrency": conc, "target_p50": RATIO_TARGET}
        for q in ("p50", "p99"):
            for attr, name in (("first", "first_event"), ("total", "total")):
                r[f"{name}_{q}"] = svc.stats(attr)[q] / bare.stats(attr)[q]
        r["pass"] = r["first_event_p50"] <= RATIO_TARGET and r["total_p50"] <= RATIO_TARGET
        ratios.append(r)
    print(f"\n   service/bare ratios (target: at most {RATIO_TARGET:.2f} at p50)")
    for r in ratios:
        c = r["concurrency"]
        for name, label in (("first_event", "first-event"), ("total", "total")):
            print(
                f"   service/bare p50 {label:<12} c={c:<3} {r[f'{name}_p50']:6.2f}x  "
                f"{verdict(r[f'{name}_p50'], RATIO_TARGET)}"
            )
        print(
            f"   service/bare p99 first-event  c={c:<3} {r['first_event_p99']:6.2f}x   "
            f"total {r['total_p99']:.2f}x  (information)"
        )
    return ratios


def print_memory(points: list[MemoryPoint]) -> dict[str, Any]:
    """Bytes and keys of the session at each checkpoint, and the growth ratio."""
    print("\n2) Redis held by ONE session (sum of MEMORY USAGE over its keys, dedicated Redis)")
    for pt in points:
        parts = ", ".join(f"{k} {v['keys']} keys/{v['bytes']:,} B" for k, v in sorted(pt.by_prefix.items()))
        print(f"   redis bytes after {pt.turns:>4} turns: {pt.bytes:>11,} bytes in {pt.keys:>5} keys")
        print(f"      ({parts})")
        if pt.other_keys:
            print(f"   ({pt.other_keys} keys not naming the session were ignored)")
        if pt.record_keys:
            print(
                f"      + turn traces and usage counters: {pt.record_bytes:,} B in {pt.record_keys} keys "
                f"({pt.record_bytes / max(pt.turns, 1):,.0f} B per turn, kept TRACE_TTL_SECONDS)"
            )
    first, last = points[0], points[-1]
    ratio = last.bytes / first.bytes if first.bytes else math.nan
    print(
        f"   redis ratio {last.turns}/{first.turns} turns: {ratio:.2f}x  "
        f"{verdict(ratio, REDIS_RATIO_TARGET)} (target: at most {REDIS_RATIO_TARGET:.2f}x); "
        f"keys {first.keys} -> {last.keys}"
    )
    return {
        "checkpoints": [asdict(p) for p in points],
        "ratio": ratio,
        "key_ratio": last.keys / first.keys if first.keys else math.nan,
        "target": REDIS_RATIO_TARGET,
        "pass": ratio <= REDIS_RATIO_TARGET,
        "key_patterns": [
            "checkpoint:<thread_id>:",
            "checkpoint_write:<thread_id>:__empty__:<checkpoint_id>:<task_id>:<idx>",
            "write_keys_zset:<thread_id>:__empty__:shallow",
        ],
    }


# -------------------------------------------------------------------------------- main


@dataclass
class Config:
    """Resolved options: explicit flag > --quick > default."""

    requests: int
    concurrency: int
    turns: int
    warmup: int
    quick: bool
    json_path: Path
    log_level: str
    llm_thread: bool
    placement: str

    @property
    def checkpoints(self) -> list[int]:
        """Turns after which the footprint is taken: 10 (or fewer) and the last."""
        return sorted({min(FIRST_CHECKPOINT, self.turns), self.turns})


def parse_args(argv: Sequence[str] | None) -> Config:
    """Command line -> Config; numbers must be positive."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--requests", type=int, help=f"measured requests per phase (default {d['requests']})")
    p.add_argument("--concurrency", type=int, help=f"in-flight requests (default {d['concurrency']})")
    p.add_argument("--turns", type=int, help=f"turns of the Redis session (default {d['turns']})")
    p.add_argument("--warmup", type=int, help=f"unmeasured requests per mode (default {d['warmup']})")
    p.add_argument("--quick", action="store_true", help="tiny numbers for a smoke test: " + str(QUICK))
    p.add_argument("--json", type=Path, help="results file (default bench/results/graph-<timestamp>.json)")
    p.add_argument("--log-level", default="INFO", help="the service's LOG_LEVEL (default INFO, as deployed)")
    p.add_argument(
        "--llm-thread", action="store_true", help="run the LLM stand-in in a thread of this process"
    )
    p.add_argument(
        "--placement",
        choices=["split", "kernel"],
        default="split",
        help="split (default): bare and the service on one CPU, Redis, the LLM stand-in and the "
        "client on the others; kernel: let the kernel place every process",
    )
    a = p.parse_args(argv)
    vals = resolve_counts(a, DEFAULTS, QUICK)
    for k, v in vals.items():
        if v < (0 if k == "warmup" else 1):
            p.error(f"--{k} must be positive")
    return Config(
        **vals,
        quick=a.quick,
        json_path=a.json or default_results_path("graph"),
        log_level=a.log_level,
        llm_thread=a.llm_thread,
        placement=a.placement,
    )


async def latency_benchmark(cfg: Config, settings: GraphSettings, client: ClientProcess) -> list[Phase]:
    """Bare and service, sequential then concurrent, interleaved so drift hits both."""
    phases: list[Phase] = []
    async with service_like_graph(settings) as graph:

        async def bare() -> Sample:
            return await bare_request(graph)

        async def bare_block(n: int, concurrency: int) -> Phase:
            return await run_phase("bare", bare, n, concurrency)

        print(f"   warm-up: {cfg.warmup} sequential + {cfg.concurrency} concurrent per mode...", flush=True)
        await warm_up(bare_block, cfg.warmup, cfg.concurrency)
        await warm_up(client.block, cfg.warmup, cfg.concurrency)
        for conc in sorted({1, cfg.concurrency}):
            print(f"   measuring bare and service at concurrency {conc} ({cfg.requests} requests each)...")
            phases += await run_interleaved({"bare": bare_block, "service": client.block}, cfg.requests, conc)
    return phases


async def run_interleaved(modes: dict[str, Block], n: int, concurrency: int) -> list[Phase]:
    """At least `n` counted requests per mode, in alternating blocks (one request at
    concurrency 1, `BLOCK_ROUNDS * concurrency` otherwise), the order of the modes
    flipping every round, so a drift of the machine during the run (other load, CPU
    frequency) hits every mode alike. run_phase says which requests of a block count."""
    block = 1 if concurrency == 1 else BLOCK_ROUNDS * concurrency
    samples: dict[str, list[Sample]] = {m: [] for m in modes}
    walls: dict[str, float] = dict.fromkeys(modes, 0.0)
    executed: dict[str, int] = dict.fromkeys(modes, 0)
    order = list(modes)
    while any(len(samples[m]) < n for m in modes):
        for mode in order:
            if len(samples[mode]) < n:
                phase = await modes[mode](block, concurrency)
                samples[mode] += phase.samples
                walls[mode] += phase.wall
                executed[mode] += phase.executed
        order.reverse()
    return [Phase(m, concurrency, samples[m], walls[m], executed[m]) for m in modes]


def start_redis(stack: contextlib.ExitStack, data_dir: Path) -> RedisServer:
    """A local Redis 8 (search + JSON) on a free loopback port, stopped with the stack."""
    server = RedisServer(free_port(), data_dir)
    stack.callback(server.stop)
    return server.start()


async def measure_all(
    cfg: Config, settings: GraphSettings, mem_service: GraphProcess, mem_redis_url: str, client: ClientProcess
) -> tuple[list[Phase], list[dict[str, Any]], list[MemoryPoint]]:
    """Both parts in ONE event loop: langchain_openai caches its httpx client per process, and
    a pooled connection must not outlive the loop that opened it."""
    cancel_on_sigint()
    phases = await latency_benchmark(cfg, settings, client)
    ratios = print_latency(phases)
    print(f"\n   measuring the Redis footprint of one session over {cfg.turns} turns...", flush=True)
    points = await measure_memory(mem_service, mem_redis_url, cfg.turns, cfg.checkpoints)
    return phases, ratios, points


def run(cfg: Config) -> dict[str, Any]:
    """Start everything, measure, tear everything down (ExitStack: also on Ctrl-C)."""
    info = machine_info(VERSIONS_OF)
    started = datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-graph-")))
        redis = start_redis(stack, tmp / "redis")
        mem_redis = start_redis(stack, tmp / "redis-memory")  # dedicated: only the measured session
        llm_url, nodelay = stack.enter_context(llm_standin(cfg.llm_thread))
        _warn_nagle(nodelay)
        client = ClientProcess()  # forks: before the services start their log threads
        stack.callback(client.stop)
        service = GraphProcess(redis.url, tmp / "graph", llm_url, LOG_LEVEL=cfg.log_level)
        settings = settings_from_env(service.env)
        conf = {
            "requests": cfg.requests,
            "concurrency": cfg.concurrency,
            "turns": cfg.turns,
            "redis_checkpoints": cfg.checkpoints,
            "warmup": cfg.warmup,
            "quick": cfg.quick,
            "answer_words": len(ANSWER.split()),
            "answer_chunks": CHUNKS,
            "llm_standin": "thread of the bench process" if cfg.llm_thread else "separate process",
            "llm_tcp_nodelay": nodelay,
            "service_log_level": cfg.log_level,
            "model": settings.LLM_MODEL,
            "checkpoint_ttl_minutes": settings.CHECKPOINT_TTL_MINUTES,
        }
        print_header(info, conf, started)
        stack.callback(service.stop)  # registered first: start() may fail half-way
        mem_service = GraphProcess(mem_redis.url, tmp / "graph-memory", llm_url, LOG_LEVEL=cfg.log_level)
        stack.callback(mem_service.stop)
        start_together([service, mem_service])  # each on its own Redis
        client.connect(service.url, TOKEN)
        conf["placement"] = place_processes(cfg.placement, [service, mem_service])
        print(f"   placement: {conf['placement']}")
        try:
            measured = measure_all(cfg, settings, mem_service, mem_redis.url, client)
            phases, ratios, points = asyncio.run(measured)
        except Exception:
            if not INTERRUPTED.is_set():
                print_log_tail("service", service.logs(), 30)
            raise
        memory = print_memory(points)
    return make_results(
        started,
        info,
        conf,
        latency=[p.to_json() for p in phases],
        ratios=ratios,
        redis=memory,
    )


def print_header(info: dict[str, Any], conf: dict[str, Any], started: datetime) -> None:
    """Machine and configuration first, so a pasted result explains itself."""
    print_machine("vagent graph benchmark", info, started)
    print(
        f"   config  : {conf['requests']} requests per phase at concurrency 1 and {conf['concurrency']}, "
        f"warm-up {conf['warmup']}; answer {conf['answer_words']} words in {conf['answer_chunks']} chunks, "
        f"zero delay (TCP_NODELAY {'set' if conf['llm_tcp_nodelay'] else 'NOT set'})"
    )
    print(
        f"             LLM stand-in in a {conf['llm_standin']}; "
        f"service LOG_LEVEL={conf['service_log_level']}; "
        f"Redis session over {conf['turns']} turns (checkpoints {conf['redis_checkpoints']})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 after a complete run, MISS or not; 130 on Ctrl-C, 1 when a run fails."""
    cfg = parse_args(argv)
    return run_main(lambda: run(cfg), cfg.json_path)


if __name__ == "__main__":
    sys.exit(main())
