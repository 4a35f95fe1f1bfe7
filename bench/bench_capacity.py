#!/usr/bin/env python3
"""Capacity of ONE graph process: how many concurrent conversations it carries behind a
model paced like a hosted one, what each costs, and what a parked question costs.

1. Ramp. One ``vagent-graph`` (one uvicorn worker) in front of a stand-in paced like a
   hosted model (``bench/paced_llm.py``: first token after ``--ttft-ms``, then a chunk every
   ``--chunk-ms``, ``--chunks`` chunks), clients in a process of their own using the bot's
   GraphClient. Per step, ``N`` conversations run at once, each a real session: quick history
   turns first, then ``--turns`` measured turns back to back; ``--tool-share``
   of them ask for a tool each turn (a read-only ``database_query``: two model calls per
   turn). Per step: the service's added first-token latency p50/p99 (client-observed time to
   the first ``text_chunk`` minus the model's own scheduled time), completion rate, errors,
   graph CPU seconds per conversation/turn/model chunk, RSS. The ramp stops for a variant
   after a step with errors or an added p99 far beyond the target.
2. Baseline. With ``--baseline-ref REF``, REF's graph service runs from a temporary git
   worktree (PYTHONPATH wins over the venv's editable installs; checked), same venv,
   stand-in, Redis and client; the two variants alternate step by step.
3. Parking. ``--park`` sessions each left at a pending confirmation (``delete_records``) on a
   dedicated Redis: Redis bytes per parked session, the graph's RSS before and after, and a
   sample answered afterwards to show they resume.
4. MCP (``--mcp``). Instead of the baseline, ONE graph process with an MCP server in its
   descriptor (``mcp_servers:``, ``credential: user``) carries two variants that alternate
   step by step: ``builtin``, whose tool turns call ``database_query``, and ``mcp``, whose
   tool turns call the read-only echo tool of ``tests/support/mcp_server.py`` with the
   asking user's own API key, fetched from a ``vagent-credentials`` registry started with a
   temporary policy (one random key per bench user). Every measured turn is a tool turn
   (``--tool-share`` 1 by default); the history turns (the first of them runs the variant's
   tool at once, which also puts the user's credential in the graph's cache) run before
   the CPU reading starts, so CPU per turn is CPU per tool turn. Printed: both variants'
   added first-token p99 and CPU per turn, MCP/built-in, the verdict against the target, and
   the MCP server's calls grouped by the fingerprint (SHA-256) of the key they carried,
   which must be exactly their users' keys (a MISMATCH is printed and the exit code is 1).
5. Tracing (``--tracing``). Beside ``current`` (tracing off: no OTEL_* variable), a second
   graph process ``traced`` exports every span over OTLP/HTTP (the SDK's defaults: batch
   processor, 5 s schedule) to a real receiver in this process (``tests/support/otlp_receiver``,
   decoding each export with opentelemetry-proto); the two alternate step by step on the same
   core. Printed per step: both added first-token p99s and CPU per conversation, traced/off;
   then the median CPU ratio against the target (tracing costs at most 5% CPU per
   conversation) and the spans received per turn.

6. Peers (``--peer relay|langgraph``, issue 34). Beside the graph, on its core, alternating
   step by step with the same conversations: ``bench/relay.py`` (a plain FastAPI + httpx
   per-chunk relay) or LangGraph's own server (``langgraph dev``, in-memory runtime, serving
   ``bench/langgraph_peer/``; ``make bench-langgraph-venv`` first). Printed: CPU per turn and
   per chunk of both and the ratio against the issue's target.
7. Profile (``--profile``). One more step of the graph under ``py-spy record``: its CPU by
   module group (self and self+children), per turn and per chunk; the raw profile is kept.

    .venv/bin/python bench/bench_capacity.py                 # or: make bench-capacity
    .venv/bin/python bench/bench_capacity.py --baseline-ref 7ba0554
    .venv/bin/python bench/bench_capacity.py --mcp           # MCP tool turns vs built-in ones
    .venv/bin/python bench/bench_capacity.py --tracing       # OpenTelemetry exported vs off
    .venv/bin/python bench/bench_capacity.py --peer relay --steps 40   # the held-out check
    .venv/bin/python bench/bench_capacity.py --peer langgraph --steps 50
    .venv/bin/python bench/bench_capacity.py --profile       # where the CPU goes, 50 conversations
    .venv/bin/python bench/bench_capacity.py --quick         # seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.common import (  # noqa: E402
    INTERRUPTED,
    BenchError,
    child_pids,
    default_results_path,
    fork_child,
    machine_info,
    make_results,
    pin_threads,
    print_log_tail,
    print_machine,
    run_main,
    start_together,
    stop_child,
    stop_together,
    summary,
)
from bench.paced_llm import TOOL_ARG_PIECES  # noqa: E402
from redis_local import RedisServer, free_port  # noqa: E402
from tests.support.factories import ALL_TOOLS, DOMAIN, ac, message_body, new_session  # noqa: E402
from tests.support.graph_process import TOKEN, GraphProcess  # noqa: E402
from tests.support.mcp_server import McpTestServer, fingerprint, tool  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402
from tests.support.procs import ServiceProcess, credential_registry  # noqa: E402
from vagent_bot.clients.graph_client import GraphClient  # noqa: E402
from vagent_shared.events import Done, ErrorEvent, HitlRequest, TextChunk, TextFinal  # noqa: E402
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest  # noqa: E402

#: The issue's targets (on 2 cores): 1000 concurrent conversations, 0 errors, added p99 <= 100 ms.
P99_TARGET_MS = 100.0
#: A variant's ramp stops after a step whose added p99 exceeds this many times the target.
STOP_FACTOR = 10.0
#: Quick (unpaced) turns before a conversation's measured turns: the session has history.
HISTORY_TURNS = 2
#: A measured turn that takes longer than this counts as an error (timeout).
TURN_TIMEOUT_S = 120.0
PARK_TEXT = "[park] delete the old records"
CONTROL_TEXT = "[quick] a question answered at once"
#: Conversations parking at once, and how many are parked before the "before" RSS reading.
PARK_CONCURRENCY = 50
PARK_WARMUP = 300
RESUME_SAMPLE = 20
DEFAULTS: dict[str, Any] = {
    "steps": "10,25,50,100,200,500,1000",
    "ttft_ms": 300.0,
    "chunk_ms": 25.0,
    "chunks": 120,
    "tool_share": 0.25,
    "park": 10_000,
    "turns": 4,
}
QUICK: dict[str, Any] = {
    **DEFAULTS,
    "steps": "5,10",
    "park": 20,
    "turns": 2,
    "ttft_ms": 50.0,
    "chunk_ms": 10.0,
    "chunks": 10,
}
#: --mcp: what changes from the defaults (an explicit option still wins): every measured turn
#: a tool turn, steps around the target's 50, no parking.
MCP_DEFAULTS: dict[str, Any] = {"steps": "10,25,50,100", "tool_share": 1.0, "park": 0}
MCP_QUICK: dict[str, Any] = {"tool_share": 1.0, "park": 0}
#: --tracing: the most CPU per conversation tracing may add (issue 23).
TRACING_TARGET = 0.05
#: --tracing: the batch processor's export schedule (the SDK's default, 5 s); --quick exports
#: every 0.5 s (OTEL_BSP_SCHEDULE_DELAY), so the wait for the last spans is short.
EXPORT_SCHEDULE_S = 5.0
QUICK_EXPORT_SCHEDULE_S = 0.5
#: Parking: the pause before each RSS reading, for the graph to finish what the last
#: requests left (--quick: shorter; its figures are only checked to exist).
SETTLE_S = 1.0
QUICK_SETTLE_S = 0.2
VERSIONS_OF = (
    "langgraph",
    "langgraph-checkpoint-redis",
    "langchain-openai",
    "fastapi",
    "uvicorn",
    "aiohttp",
    "mcp",
    "httpx",
)
USER_AC = ac()
#: --mcp: the MCP server's name in the descriptor: its tool is `bench__echo` (what the paced
#: stand-in calls for `[mcp]`), its grant `mcp_server:bench`, its credentials `mcp:bench`.
MCP_SERVER = "bench"
MCP_GRANTS = [*ALL_TOOLS, f"mcp_server:{MCP_SERVER}"]
#: The issue's target for an MCP tool turn, at MCP_TARGET_STEP concurrent conversations.
MCP_TARGET_STEP = 50
MCP_CPU_RATIO_TARGET = 1.2
MCP_P99_DELTA_TARGET_MS = 20.0
#: How a turn's message names its user, for the MCP server's record (echo's `text`).
USER_TAG = re.compile(r"\[user (@[^\]\s]+)\]")
#: --peer: what changes from the defaults (an explicit option still wins): plain streamed
#: turns (a peer runs no tools), the issue's held-out step of 40 conversations, no parking.
PEER_DEFAULTS: dict[str, Any] = {"steps": "40", "tool_share": 0.0, "park": 0}
PEER_QUICK: dict[str, Any] = {"tool_share": 0.0, "park": 0}
#: --profile alone: the issue's 50 conversations, plain and tool turns as by default, no parking.
PROFILE_DEFAULTS: dict[str, Any] = {"steps": "50", "park": 0}
#: Issue 34's held-out check: graph CPU per streamed turn at most this times the relay's,
#: at RELAY_TARGET_STEP conversations; and LangGraph's server at least LANGGRAPH_TARGET x vagent.
RELAY_TARGET = 0.6
RELAY_TARGET_STEP = 40
LANGGRAPH_TARGET = 5.0
#: --peer langgraph: the graph's id in bench/langgraph_peer/langgraph.json, and its venv
#: (`make bench-langgraph-venv`, requirements/bench-langgraph.txt).
LANGGRAPH_GRAPH_ID = "agent"
LANGGRAPH_DIR = ROOT / "bench" / "langgraph_peer"
LANGGRAPH_VENV = ROOT / ".data" / "bench-langgraph-venv"
#: --profile: py-spy's samples per second (from the bench's core, --nonblocking: the graph
#: is never paused), and where the raw profile goes.
PROFILE_RATE = 200


# ---------------------------------------------------------------------------- one turn


@dataclass
class Turn:
    """One measured turn as the client saw it (seconds from its POST)."""

    conv: int
    tool: bool
    start: float
    first: float = math.nan
    end: float = math.nan
    chunks: int = 0
    error: str = ""


def request_for(conv: int, session: Any, text: str, ac_context: Any = USER_AC) -> ProcessMessageRequest:
    body = message_body(session, text, ac_context)
    return ProcessMessageRequest.model_validate(body)


async def one_turn(client: GraphClient, req: ProcessMessageRequest, turn: Turn, loop_start: float) -> None:
    """POST one message, read the stream to `done`; fill `turn` (times relative to its start)."""
    t0 = time.perf_counter()
    turn.start = t0 - loop_start
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            async for ev in client.process_message(req):
                if isinstance(ev, TextChunk):
                    turn.chunks += 1
                    if math.isnan(turn.first):
                        turn.first = time.perf_counter() - t0
                elif isinstance(ev, ErrorEvent):
                    turn.error = f"error event: {ev.message}"[:200]
                elif isinstance(ev, Done):
                    turn.end = time.perf_counter() - t0
    except Exception as exc:  # counted, never fatal: the report says how many and which
        turn.error = f"{type(exc).__name__}: {exc}"[:200]
    if not turn.error and (math.isnan(turn.end) or math.isnan(turn.first)):
        turn.error = "stream ended without text or without done"


# ----------------------------------------------------------------- the client process


@dataclass
class StepJob:
    url: str
    conversations: int
    tool_share: float
    turns: int
    turn_seconds: float
    seed: int
    #: what a tool turn's message carries: "[tool]" (database_query) or "[mcp]" (the MCP tool)
    marker: str = "[tool]"
    #: None: every conversation's AcContext is USER_AC; else each conversation's own user
    #: (@cap<i>:localhost) with these grants, named in its messages (USER_TAG)
    grants: list[str] | None = None
    #: --mcp: all history turns first (the first one runs the tool at once), then tell the
    #: parent and wait for "go" (its CPU reading), then the measured turns
    split_history: bool = False
    #: the server's API: "graph" (vagent's, also bench/relay.py) or "langgraph" (LangGraph's
    #: server: a thread per conversation, /threads/{id}/runs/stream)
    api: str = "graph"
    #: quick turns each conversation makes before its measured ones (--history)
    history: int = HISTORY_TURNS


@dataclass
class StepOutcome:
    """What the client process measured in one step."""

    turns: list[Turn]
    windowed: list[Turn]
    history_errors: list[str]
    history_turns: int
    window_start: float
    window_end: float
    wall: float
    client_cpu_s: float
    loop_lag_ms: dict[str, float]


@contextlib.asynccontextmanager
async def graph_client(url: str) -> AsyncIterator[GraphClient]:
    """The bot's GraphClient over a session without its 100-connection cap: here one
    client process plays every user at once, where the bot's own pool would queue them."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, connect=30, sock_read=TURN_TIMEOUT_S),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    try:
        yield GraphClient(url, TOKEN, session=session)
    finally:
        await session.close()


class Talker:
    """How a conversation talks to the server under test: vagent's API (the bot's
    GraphClient; bench/relay.py speaks it too). One session per conversation."""

    def __init__(self, client: GraphClient) -> None:
        self.client = client

    async def session(self, user: str) -> Any:
        return new_session(user=user)

    async def turn(self, session: Any, text: str, who: Any, turn: Turn, loop_start: float) -> None:
        await one_turn(self.client, request_for(0, session, text, who), turn, loop_start)


class LangGraphTalker(Talker):
    """LangGraph's server API through its own SDK (langgraph_sdk): a thread per
    conversation, each turn one `POST /threads/{id}/runs/stream` with the user's message,
    `stream_mode="messages-tuple"` (the token stream a chat client reads)."""

    def __init__(self, client: Any) -> None:
        self.lg = client

    async def session(self, user: str) -> Any:
        thread = await self.lg.threads.create(metadata={"user": user})
        return thread["thread_id"]

    async def turn(self, session: Any, text: str, who: Any, turn: Turn, loop_start: float) -> None:
        t0 = time.perf_counter()
        turn.start = t0 - loop_start
        try:
            async with asyncio.timeout(TURN_TIMEOUT_S):
                async for part in self.lg.runs.stream(
                    session,
                    LANGGRAPH_GRAPH_ID,
                    input={"messages": [{"role": "user", "content": text}]},
                    stream_mode="messages-tuple",
                ):
                    if part.event == "messages":
                        msg = part.data[0] if isinstance(part.data, list) and part.data else {}
                        if isinstance(msg, dict) and msg.get("content") and msg.get("type") != "human":
                            turn.chunks += 1
                            if math.isnan(turn.first):
                                turn.first = time.perf_counter() - t0
                    elif part.event == "error":
                        turn.error = f"error event: {part.data}"[:200]
            turn.end = time.perf_counter() - t0
        except Exception as exc:  # counted, never fatal
            turn.error = f"{type(exc).__name__}: {exc}"[:200]
        if not turn.error and (math.isnan(turn.end) or math.isnan(turn.first)):
            turn.error = "stream ended without text"


@contextlib.asynccontextmanager
async def langgraph_client(url: str) -> AsyncIterator[LangGraphTalker]:
    """langgraph_sdk's client over an httpx client without a connection cap (get_client's
    default pool holds 100): one client process plays every user at once."""
    from langgraph_sdk.client import LangGraphClient

    transport = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)
    )
    timeout = httpx.Timeout(connect=30, read=TURN_TIMEOUT_S, write=30, pool=30)
    async with httpx.AsyncClient(base_url=url, transport=transport, timeout=timeout) as http:
        yield LangGraphTalker(LangGraphClient(http))


async def run_step(job: StepJob, conn: Connection | None = None) -> StepOutcome:
    """`job.conversations` conversations at once: each starts at a random moment within one
    turn's time (a smooth arrival, not a burst), makes its history turns, then `job.turns`
    measured turns back to back. The steady window runs from the moment the last
    conversation starts measuring to the moment the first one is done: only turns that
    START inside it are in the latency figures (all N conversations were in flight).
    With `job.split_history`, every conversation makes its history turns first; then the
    parent is told (through `conn`) and the random start applies to the measured turns."""
    if job.api == "langgraph":
        async with langgraph_client(job.url) as talker:
            return await _run_step(job, talker, conn)
    async with graph_client(job.url) as client:
        return await _run_step(job, Talker(client), conn)


async def _run_step(job: StepJob, talker: Talker, conn: Connection | None = None) -> StepOutcome:
    rng = random.Random(job.seed)
    loop_start = time.perf_counter()
    measure_start = loop_start
    cpu0 = sum(os.times()[:2])
    turns: list[Turn] = []
    history_errors: list[str] = []
    history_count = 0
    n = job.conversations
    started_measuring = 0
    window: dict[str, float] = {}
    lags: list[float] = []
    stop_lag = asyncio.Event()
    history_left = n
    history_done, go = asyncio.Event(), asyncio.Event()
    if not job.split_history:
        go.set()

    async def lag_probe() -> None:
        while not stop_lag.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.05)
            lags.append((time.perf_counter() - t - 0.05) * 1000)

    async def conversation(i: int) -> None:
        nonlocal history_count, started_measuring, history_left
        tool = int((i + 1) * job.tool_share) > int(i * job.tool_share)  # spread evenly
        user = f"@cap{i}:localhost"
        who, tag = (USER_AC, "") if job.grants is None else (ac(user, job.grants), f" [user {user}]")
        if not job.split_history:
            await asyncio.sleep(rng.uniform(0, job.turn_seconds))
        try:
            session = await talker.session(user)
        except Exception as exc:  # counted like a failed history turn
            session = None
            history_errors.append(f"session: {type(exc).__name__}: {exc}"[:200])
        try:
            for h in range(job.history if session is not None else 0):
                t = Turn(i, False, 0.0)
                quick = f"[quick] {job.marker} " if job.split_history and tool and h == 0 else "[quick] "
                text = f"{quick}history question {h}{tag}"
                await talker.turn(session, text, who, t, loop_start)
                history_count += 1
                if t.error:
                    history_errors.append(t.error)
                    break
        finally:
            history_left -= 1
            if not history_left:
                history_done.set()
        await go.wait()
        if job.split_history:
            await asyncio.sleep(rng.uniform(0, job.turn_seconds))
        started_measuring += 1
        if started_measuring == n:
            window["start"] = time.perf_counter() - loop_start
        for k in range(1, job.turns + 1):
            text = f"{job.marker + ' ' if tool else ''}How are the orders going? ({k}){tag}"
            t = Turn(i, tool, 0.0)
            if session is None:
                t.error = "no session"
            else:
                await talker.turn(session, text, who, t, loop_start)
            turns.append(t)
            if t.error:
                return
        window.setdefault("end", time.perf_counter() - loop_start)

    async def barrier() -> None:
        """split_history: every history turn done -> tell the parent, wait for its "go"."""
        nonlocal measure_start, cpu0
        await history_done.wait()
        assert conn is not None
        conn.send(("history", history_count, list(history_errors)))
        await asyncio.to_thread(conn.recv)
        measure_start, cpu0 = time.perf_counter(), sum(os.times()[:2])
        lags.clear()
        go.set()

    probe = asyncio.create_task(lag_probe())
    tasks = [conversation(i) for i in range(n)]
    try:
        await asyncio.gather(*tasks, *([barrier()] if job.split_history else []))
    finally:
        stop_lag.set()
        await probe
    wall = time.perf_counter() - measure_start
    ws, we = window.get("start", wall), window.get("end", wall)
    lag = summary(lags)
    return StepOutcome(
        turns=turns,
        windowed=[t for t in turns if ws <= t.start < we],
        history_errors=history_errors,
        history_turns=history_count,
        window_start=ws,
        window_end=we,
        wall=wall,
        client_cpu_s=sum(os.times()[:2]) - cpu0,
        loop_lag_ms={"p50": lag["p50"], "p99": lag["p99"], "max": lag["max"]},
    )


@dataclass
class ParkJob:
    url: str
    sessions: int
    warmup: int
    resume_sample: int
    #: "[park] ...": each session ends at a pending confirmation; "[quick] ...": the control,
    #: an ordinary finished one-turn session (nothing pending)
    text: str = PARK_TEXT


async def park_sessions(conn: Connection, job: ParkJob) -> dict[str, Any]:
    """Park `job.sessions` sessions at a pending confirmation, PARK_CONCURRENCY at a time;
    after the first `job.warmup` tell the parent (it reads RSS/Redis), then after all; then
    answer a sample "yes" and check that the run resumes to a final answer."""
    async with graph_client(job.url) as client:
        return await _park_sessions(conn, job, client)


async def _park_sessions(conn: Connection, job: ParkJob, client: GraphClient) -> dict[str, Any]:
    errors: list[str] = []
    parked: list[tuple[str, str]] = []  # session id, interrupt id
    todo = iter(range(job.sessions))

    async def park_one(i: int) -> None:
        session = new_session(user=f"@park{i}:localhost")
        hitl: HitlRequest | None = None
        done = False
        try:
            async for ev in client.process_message(request_for(i, session, job.text)):
                if isinstance(ev, HitlRequest):
                    hitl = ev
                elif isinstance(ev, Done):
                    done = True
                elif isinstance(ev, ErrorEvent):
                    errors.append(ev.message[:200])
                    return
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        if job.text == PARK_TEXT and hitl is None:
            errors.append("no hitl_request")
        elif job.text != PARK_TEXT and (hitl is not None or not done):
            errors.append("no done, or an unexpected question")
        else:
            parked.append((session.format(), hitl.interrupt_id if hitl else ""))

    async def worker(limit: int) -> None:
        for i in todo:
            if i >= limit:
                return
            await park_one(i)

    t0 = time.perf_counter()
    # phase 1: the warm-up sessions; phase 2: the rest
    await asyncio.gather(*(worker(job.warmup) for _ in range(PARK_CONCURRENCY)))
    todo = iter(range(job.warmup, job.sessions))
    conn.send(("warm", len(parked), list(errors)))
    await asyncio.to_thread(conn.recv)  # the parent has read its numbers
    await asyncio.gather(*(worker(job.sessions) for _ in range(PARK_CONCURRENCY)))
    park_seconds = time.perf_counter() - t0
    conn.send(("parked", len(parked), list(errors)))
    await asyncio.to_thread(conn.recv)
    resumed, resume_errors = 0, []
    for sid, iid in parked[: job.resume_sample]:
        final = False
        try:
            req = FeedbackRequest(session_id=sid, response="yes", interrupt_id=iid, ac_context=USER_AC)
            async for ev in client.submit_feedback(req):
                if isinstance(ev, TextFinal):
                    final = True
                elif isinstance(ev, ErrorEvent):
                    resume_errors.append(ev.message[:200])
        except Exception as exc:
            resume_errors.append(f"{type(exc).__name__}: {exc}"[:200])
        resumed += final
    return {
        "parked": len(parked),
        "errors": errors[:20],
        "error_count": len(errors),
        "park_seconds": park_seconds,
        "resume_tried": min(job.resume_sample, len(parked)),
        "resumed": resumed,
        "resume_errors": resume_errors[:5],
        "sample_session_ids": [sid for sid, _ in parked[-200:]],
    }


def _serve_client(conn: Connection) -> None:
    """Child process: run the step or parking jobs the parent sends until it says stop."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        loop = asyncio.new_event_loop()
    try:
        while (job := conn.recv()) is not None:
            try:
                if isinstance(job, StepJob):
                    conn.send(loop.run_until_complete(run_step(job, conn)))
                else:
                    conn.send(("result", loop.run_until_complete(park_sessions(conn, job))))
            except Exception as exc:  # the parent raises it
                conn.send(BenchError(f"client: {type(exc).__name__}: {exc}"))
    except (EOFError, OSError):
        pass
    finally:
        loop.close()


class ClientProcess:
    """The clients, in a process of their own (fork before any thread exists)."""

    def __init__(self) -> None:
        self.conn, self.proc = fork_child(_serve_client, "capacity-clients")

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def recv(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise BenchError(f"the client process did not answer within {timeout:.0f} s")
        try:
            result = self.conn.recv()
        except EOFError:
            raise BenchError(f"the client process exited (code {self.proc.exitcode})") from None
        if isinstance(result, Exception):
            raise result
        return result

    def stop(self) -> None:
        stop_child(self.conn, self.proc, None, 10)


# ------------------------------------------------------------------- /proc readings


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and of its live descendants: a server that runs its work in a
    child process (none of the measured ones does today) is still measured whole."""
    total = cpu_seconds(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(child)
    return total


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def place(placement: str, graph_pids: Sequence[int]) -> str:
    """split: the graph processes on the first CPU, everything else (this process, the
    clients, the stand-in, Redis) on the others, so the measured process never shares
    its core with the load it is measured under. kernel: no pinning."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if placement == "kernel" or len(cpus) < 2:
        return "left to the kernel" + ("" if placement == "kernel" else " (fewer than 2 usable CPUs)")
    graph, rest = {cpus[0]}, set(cpus[1:])
    try:
        os.sched_setaffinity(0, rest)
    except OSError as exc:
        return f"left to the kernel (pinning refused: {exc})"
    pinned = {*graph_pids, *(d for g in graph_pids for d in descendants(g))}
    for pid in child_pids():
        pin_threads(pid, graph if pid in pinned else rest)
    for pid in pinned:
        pin_threads(pid, graph)
    others = ",".join(map(str, cpus[1:]))
    return f"split: graph on CPU {cpus[0]}; clients, stand-in, Redis and the bench on CPU {others}"


# ------------------------------------------------------------------ fixtures


@contextlib.contextmanager
def paced_standin(ttft_ms: float, chunk_ms: float, chunks: int) -> Iterator[tuple[str, int]]:
    """bench/paced_llm.py in its own process: (base URL, pid)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "bench" / "paced_llm.py"),
            "--ttft-ms",
            str(ttft_ms),
            "--chunk-ms",
            str(chunk_ms),
            "--chunks",
            str(chunks),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise BenchError(f"the paced stand-in did not start: {line}{proc.stdout.read()[-2000:]}")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def standin_stats(llm_url: str, reset: bool = True) -> dict[str, Any]:
    base = llm_url.removesuffix("/v1")
    r = httpx.get(f"{base}/stats" + ("?reset=1" if reset else ""), timeout=10)
    return r.json()  # type: ignore[no-any-return]


@contextlib.contextmanager
def baseline_worktree(ref: str) -> Iterator[tuple[Path, str]]:
    """A detached git worktree of `ref` under .data/ (git-ignored), removed at the end."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise BenchError(f"--baseline-ref {ref!r} is not a commit: {commit.stderr.strip()}")
    sha = commit.stdout.strip()
    base = ROOT / ".data" / "bench-worktrees"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{sha[:10]}-", dir=base))
    path.rmdir()
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path), sha], cwd=ROOT, check=True)
    try:
        yield path, sha
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False)


def imported_from(env: dict[str, str]) -> str:
    """Where the service's interpreter, in `env`, imports vagent_graph from."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import vagent_graph, vagent_shared; print(vagent_graph.__file__); print(vagent_shared.__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return out.stdout.strip()


def git_state() -> str:
    """HEAD, and whether the service's code differs from it (the working tree runs)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "graph/src", "shared/src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    changed = len(dirty.stdout.splitlines())
    return head.stdout.strip() + (
        f" + {changed} uncommitted changes in graph/src, shared/src" if changed else ""
    )


def start_redis(stack: contextlib.ExitStack, data_dir: Path) -> RedisServer:
    server = RedisServer(free_port(), data_dir)
    stack.callback(server.stop)
    return server.start()


# -------------------------------------------------------------------------------- --mcp


@dataclass
class McpBench:
    """--mcp's fixtures: the MCP test server, the credential registry, and each bench user's
    API key for the server (in the registry's policy, never printed)."""

    server: McpTestServer
    registry: ServiceProcess
    keys: dict[str, str]
    #: every call of the run (warm-up included), for the summary
    calls: list[dict[str, Any]] = field(default_factory=list)
    listings: int = 0

    def __post_init__(self) -> None:
        self.fingerprints = {user: fingerprint(key) for user, key in self.keys.items()}

    def server_cpu(self) -> float:
        """CPU seconds of the MCP server process so far."""
        return cpu_seconds(self.server.proc.pid) if self.server.proc is not None else math.nan

    def take_calls(self) -> tuple[list[dict[str, Any]], int]:
        """The calls and the number of tools/list the server recorded since the last take
        (the run is between steps: nothing is in flight)."""
        calls, listings = self.server.calls(), len(self.server.listings())
        self.server.clear()
        self.calls += calls
        self.listings += listings
        return calls, listings


def start_mcp(stack: contextlib.ExitStack, tmp: Path, cfg: Config) -> tuple[McpBench, dict[str, str]]:
    """The registry (a temporary policy: a random API key per bench user for `mcp:bench`),
    the MCP test server (one read-only echo tool), and the graph's environment for them: a
    copy of the packaged descriptor plus `mcp_servers:` (`credential: user`)."""
    users = [f"@cap{i}:localhost" for i in range(max(cfg.steps))]
    keys = {u: f"bench-{secrets.token_hex(16)}" for u in users}
    resource = {"type": "api_key", "users": keys}
    policy = {"domains": {DOMAIN: {"resources": {f"mcp:{MCP_SERVER}": resource}}}}
    policy_path = tmp / "credentials.yaml"
    policy_path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    registry = credential_registry(tmp, policy_path, CREDENTIALS_HOST="127.0.0.1", LOG_LEVEL=cfg.log_level)
    stack.callback(registry.stop)
    echo = tool(
        "echo",
        params={"text": "string"},
        annotations={"readOnlyHint": True},
        description="Echoes the text it is given.",
    )
    server = McpTestServer({"name": "bench-mcp", "tools": [echo]}, tmp / "mcp")
    stack.callback(server.stop)
    start_together([registry, server])  # independent of each other; the graph starts after both
    from cryptography.fernet import Fernet

    descriptor = yaml.safe_load((ROOT / "graph/src/vagent_graph/agents/vagent.yaml").read_text())
    descriptor["mcp_servers"] = [
        {
            "name": MCP_SERVER,
            "url": "${BENCH_MCP_URL}",
            "transport": "streamable_http",
            "credential": "user",
            "confirm": "auto",
            "trust_annotations": True,  # its read-only echo runs without a confirmation
            "timeout_seconds": 30,
        }
    ]
    agent = tmp / "agent.yaml"
    agent.write_text(yaml.safe_dump(descriptor, sort_keys=False), encoding="utf-8")
    env = {
        "AGENT_DESCRIPTOR": str(agent),
        "BENCH_MCP_URL": server.url,
        "CREDENTIAL_REGISTRY_URL": registry.base_url,
        "CREDENTIAL_CACHE_KEY": Fernet.generate_key().decode(),
    }
    return McpBench(server, registry, keys), env


def check_mcp_listed(service: GraphProcess) -> dict[str, Any]:
    """The graph's /health must show the MCP server up with its one tool."""
    health = httpx.get(f"{service.url}/health", timeout=10).json()
    status = (health.get("mcp_servers") or {}).get(MCP_SERVER)
    if not status or not status.get("up") or status.get("tools") != 1:
        raise BenchError(f"the graph did not list the MCP server's tool: {status}")
    return dict(status)


def _user_order(user: str | None) -> tuple[bool, int, str]:
    return user is None, len(user or ""), user or ""


def credential_groups(calls: Sequence[dict[str, Any]], fingerprints: dict[str, str]) -> dict[str, Any]:
    """The MCP server's calls grouped by the fingerprint of the X-API-Key they carried, each
    group with the users whose turns made them (USER_TAG in the echoed text). `ok` only if
    every group is one user's calls under that user's own key (so each user's calls carried
    that user's key only) and no call carried an Authorization header as well."""
    owner = {fp: user for user, fp in fingerprints.items()}
    by_fp: dict[str, Counter[str]] = {}
    mismatches: list[str] = []
    for c in calls:
        fps = c.get("fingerprints") or {}
        fp = fps.get("x-api-key") or "(no X-API-Key)"
        m = USER_TAG.search(str((c.get("arguments") or {}).get("text", "")))
        user = m.group(1) if m else "(no user named)"
        by_fp.setdefault(fp, Counter())[user] += 1
        if fps.get("authorization"):
            mismatches.append(f"MISMATCH: a call of {user} also carried an Authorization header")
    groups: list[dict[str, Any]] = []
    for fp, users in by_fp.items():
        key_of = owner.get(fp)
        match = key_of is not None and set(users) == {key_of}
        groups.append(
            {
                "fingerprint": fp,
                "key_of": key_of,
                "users": dict(users),
                "calls": sum(users.values()),
                "match": match,
            }
        )
        if not match:
            whose = f"the key of {key_of}" if key_of else "nobody's key"
            made = ", ".join(f"{u} ({k})" for u, k in sorted(users.items()))
            mismatches.append(f"MISMATCH: key {fp[:16]} ({whose}) carried calls of {made}")
    groups.sort(key=lambda g: _user_order(g["key_of"]))
    return {
        "calls": len(calls),
        "users": len({u for g in groups for u in g["users"]}),
        "fingerprints": len(groups),
        "groups": groups,
        "mismatches": mismatches,
        "ok": not mismatches,
    }


def print_mcp_comparison(cfg: Config, variants: list[Variant]) -> dict[str, Any]:
    """Per step, builtin vs mcp: added first-token p50/p99 of the tool turns, CPU per turn,
    MCP/built-in; and the verdict on the target at MCP_TARGET_STEP conversations."""
    builtin, mcpv = variants
    by_b = {r["conversations"]: r for r in builtin.rows}
    print("\n2) MCP tool turn vs built-in tool turn (the same graph process, alternating step by step)")
    print(
        f"   {'conv':>6} | {'builtin':>7} {'add p50':>8} {'add p99':>8} {'cpu ms':>7} | "
        f"{'mcp':>7} {'add p50':>8} {'add p99':>8} {'cpu ms':>7} | {'p99 +ms':>8} {'cpu mcp/b':>9} "
        f"{'+cpu ms':>8}"
    )
    steps: list[dict[str, Any]] = []
    for r in mcpv.rows:
        b = by_b.get(r["conversations"])
        if b is None:
            continue
        bt, mt = b["added_first_tool_ms"], r["added_first_tool_ms"]
        step = {
            "conversations": r["conversations"],
            "builtin_added_p50_ms": bt["p50"],
            "builtin_added_p99_ms": bt["p99"],
            "builtin_cpu_ms_per_turn": b["cpu_ms_per_turn"],
            "mcp_added_p50_ms": mt["p50"],
            "mcp_added_p99_ms": mt["p99"],
            "mcp_cpu_ms_per_turn": r["cpu_ms_per_turn"],
            "p99_delta_ms": mt["p99"] - bt["p99"],
            "cpu_ratio": r["cpu_ms_per_turn"] / b["cpu_ms_per_turn"],
            "cpu_ms_extra_per_turn": r["cpu_ms_per_turn"] - b["cpu_ms_per_turn"],
            "errors": b["errors"] + r["errors"],
        }
        steps.append(step)
        print(
            f"   {step['conversations']:>6} | {b['turns_completed']:>7} {bt['p50']:>8.1f} {bt['p99']:>8.1f} "
            f"{b['cpu_ms_per_turn']:>7.1f} | {r['turns_completed']:>7} {mt['p50']:>8.1f} {mt['p99']:>8.1f} "
            f"{r['cpu_ms_per_turn']:>7.1f} | {step['p99_delta_ms']:>+8.1f} {step['cpu_ratio']:>8.2f}x "
            f"{step['cpu_ms_extra_per_turn']:>+8.1f}"
        )
    print("   (add p50/p99: ms added to the tool turns' first token; cpu ms: graph CPU per measured turn)")
    if cfg.tool_share < 1:
        print(
            f"   note: --tool-share {cfg.tool_share}: only that share of the turns call a tool, so CPU "
            "per turn understates the difference per tool turn"
        )
    target = (
        f"target: at {MCP_TARGET_STEP} concurrent conversations an MCP tool turn costs at most "
        f"{MCP_CPU_RATIO_TARGET:.1f}x the CPU of the built-in tool turn and adds at most "
        f"{MCP_P99_DELTA_TARGET_MS:.0f} ms to its first-token p99"
    )
    print(f"   {target}")
    ratios = [x["cpu_ratio"] for x in steps]
    median_ratio = statistics.median(ratios) if ratios else math.nan
    at = next((x for x in steps if x["conversations"] == MCP_TARGET_STEP), None)
    result: dict[str, Any] = {
        "steps": steps,
        "cpu_ratio_median": median_ratio,
        "target": target,
        "target_step": MCP_TARGET_STEP,
        "cpu_ratio_target": MCP_CPU_RATIO_TARGET,
        "p99_delta_target_ms": MCP_P99_DELTA_TARGET_MS,
        "pass": None,
    }
    if at is None:
        print(
            f"   verdict: not measured (no step of {MCP_TARGET_STEP} conversations in both variants); "
            f"MCP/built-in CPU per turn, median over the steps: {median_ratio:.2f}x (information)"
        )
        return result
    cpu_ok = bool(at["cpu_ratio"] <= MCP_CPU_RATIO_TARGET)
    p99_ok = bool(at["p99_delta_ms"] <= MCP_P99_DELTA_TARGET_MS)
    result.update(cpu_pass=cpu_ok, p99_pass=p99_ok, at_target=at)
    result["pass"] = cpu_ok and p99_ok
    print(
        f"   at {MCP_TARGET_STEP}: CPU per tool turn MCP/built-in {at['cpu_ratio']:.2f}x "
        f"({'PASS' if cpu_ok else 'MISS'}), first-token p99 {at['p99_delta_ms']:+.1f} ms "
        f"({'PASS' if p99_ok else 'MISS'}) -> {'PASS' if result['pass'] else 'MISS'}; "
        f"CPU ratio median over the steps {median_ratio:.2f}x"
    )
    return result


def print_credential_groups(cfg: Config, mcp: McpBench, shown: int = 12) -> dict[str, Any]:
    """Every call of the run on the MCP server, grouped by the key it carried."""
    check = credential_groups(mcp.calls, mcp.fingerprints)
    print(
        "\n3) The MCP server's calls, grouped by the key they carried (SHA-256 of X-API-Key), "
        "whole run (warm-up and every step)"
    )
    print(f"   {'key sha256':<18} {'key of':<18} {'calls':>6}  turns of")
    groups = check["groups"]
    listed = [g for g in groups if not g["match"]] + [g for g in groups if g["match"]][:shown]
    for g in listed:
        made = ", ".join(f"{u} ({k})" for u, k in sorted(g["users"].items(), key=lambda x: _user_order(x[0])))
        flag = "" if g["match"] else "   MISMATCH"
        print(f"   {g['fingerprint'][:16]:<18} {g['key_of'] or '-':<18} {g['calls']:>6}  {made}{flag}")
    if len(groups) > len(listed):
        print(f"   ... and {len(groups) - len(listed)} more keys, each carrying its own user's calls only")
    verdict = "OK" if check["ok"] else "MISMATCH"
    print(
        f"   {check['calls']} calls of {check['users']} users on {check['fingerprints']} keys "
        f"({len(mcp.keys)} users in the registry; {mcp.listings} tools/list requests): each user's calls "
        f"carried that user's key only: {verdict}"
    )
    for line in check["mismatches"][:10]:
        print(f"   {line}")
    if not check["ok"]:
        cfg.credential_mismatch = True
    return check


# ----------------------------------------------------------------------- the ramp


class PeerProcess(ServiceProcess):
    """A peer server under test on a free loopback port (--peer): bench/relay.py or
    LangGraph's own server. `url` as GraphProcess has it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, health: str, port: int):
        self.port = port
        super().__init__(name, env, log, f"http://127.0.0.1:{port}{health}", argv=argv)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> PeerProcess:
        super().start(timeout)
        return self


Served = GraphProcess | PeerProcess


@dataclass
class Variant:
    name: str
    service: Served
    code: str
    stopped: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: --mcp: the tool turns' marker, the conversations' grants, history before measuring
    marker: str = "[tool]"
    grants: list[str] | None = None
    split_history: bool = False
    #: StepJob.api: "graph" (vagent's API) or "langgraph"
    api: str = "graph"

    def job(
        self, n: int, tool_share: float, turns: int, turn_seconds: float, seed: int, history: int
    ) -> StepJob:
        return StepJob(
            self.service.url,
            n,
            tool_share,
            turns,
            turn_seconds,
            seed,
            self.marker,
            self.grants,
            self.split_history,
            self.api,
            history,
        )

    @property
    def pid(self) -> int:
        assert self.service.proc is not None
        return self.service.proc.pid


@dataclass
class Config:
    steps: list[int]
    ttft_ms: float
    chunk_ms: float
    chunks: int
    tool_share: float
    park: int
    turns: int
    baseline_ref: str | None
    quick: bool
    placement: str
    log_level: str
    json_path: Path
    mcp: bool = False
    graph_cpu: int = 0
    tracing: bool = False
    #: --mcp: set when a call on the MCP server carried another key than its user's
    credential_mismatch: bool = False
    export_schedule_s: float = EXPORT_SCHEDULE_S
    settle_s: float = SETTLE_S
    #: --peer: "relay" or "langgraph"; --profile: sample the graph under py-spy
    peer: str | None = None
    profile: bool = False
    #: quick turns before a conversation's measured ones (its history: 2 messages a turn)
    history: int = HISTORY_TURNS

    @property
    def text_model_s(self) -> float:
        """The model's own time to the first text of a plain turn."""
        return self.ttft_ms / 1000

    @property
    def tool_model_s(self) -> float:
        """...of a tool turn: the tool call (TTFT + its argument pieces), then TTFT again."""
        return (2 * self.ttft_ms + TOOL_ARG_PIECES * self.chunk_ms) / 1000

    @property
    def turn_s(self) -> float:
        """The model's own time for a whole plain turn."""
        return (self.ttft_ms + (self.chunks - 1) * self.chunk_ms) / 1000


def cpu_busy(cpu: int) -> float:
    """Seconds CPU `cpu` was busy (all processes), from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            v = [int(x) for x in line.split()[1:]]
            return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    return math.nan


def measure_step(
    cfg: Config,
    v: Variant,
    n: int,
    client: ClientProcess,
    llm_url: str,
    seed: int,
    mcp: McpBench | None = None,
) -> dict[str, Any]:
    """One step of one variant; the row printed and stored. With `v.split_history` the
    readings start once every history turn is done, so they cover the measured turns only."""
    job = v.job(n, cfg.tool_share, cfg.turns, cfg.turn_s, seed, cfg.history)
    timeout = (cfg.turns + cfg.history + 1) * (TURN_TIMEOUT_S + 5) + 60
    if mcp is not None:
        mcp.take_calls()  # anything before this step is not its
    if job.split_history:
        client.conn.send(job)
        client.recv(timeout)  # ("history", ...): every history turn is done
    standin_stats(llm_url, reset=True)
    gcpu = cfg.graph_cpu
    cpu0, ccpu0, busy0, t0 = (
        tree_cpu_seconds(v.pid),
        cpu_seconds(client.pid),
        cpu_busy(gcpu),
        time.perf_counter(),
    )
    mcp_cpu0 = mcp.server_cpu() if mcp is not None else 0.0
    client.conn.send("go" if job.split_history else job)
    out: StepOutcome = client.recv(timeout)
    cpu = tree_cpu_seconds(v.pid) - cpu0
    mcp_cpu = mcp.server_cpu() - mcp_cpu0 if mcp is not None else 0.0
    wall = time.perf_counter() - t0
    others = cpu_busy(gcpu) - busy0 - cpu  # other processes on the graph's CPU (split placement)
    sstats = standin_stats(llm_url, reset=True)
    ok = [t for t in out.windowed if not t.error]
    added = [(t.first - (cfg.tool_model_s if t.tool else cfg.text_model_s)) * 1000 for t in ok]
    added_tool = [(t.first - cfg.tool_model_s) * 1000 for t in ok if t.tool]
    errors = [t.error for t in out.turns if t.error] + out.history_errors
    completed = sum(1 for t in out.turns if not t.error)
    # the model's chunks the graph relayed while measured: every turn's text, plus the tool calls
    all_turns = len(out.turns) + (0 if job.split_history else out.history_turns)
    model_chunks = all_turns * cfg.chunks + sum(1 for t in out.turns if t.tool) * (1 + TOOL_ARG_PIECES)
    window = out.window_end - out.window_start
    extra: dict[str, Any] = {}
    if mcp is not None:
        tool_convs = sum(1 for i in range(n) if int((i + 1) * cfg.tool_share) > int(i * cfg.tool_share))
        made = tool_convs + sum(1 for t in out.turns if t.tool)  # one history tool turn each
        calls, listings = mcp.take_calls()
        check = credential_groups(calls, mcp.fingerprints)
        check["expected_calls"] = made if v.marker == "[mcp]" else 0
        check["listings"] = listings
        # the measured turns' calls only (the history's ran before the reading)
        measured = sum(1 for t in out.turns if t.tool) if v.marker == "[mcp]" else 0
        check["server_cpu_s"] = mcp_cpu
        check["server_cpu_ms_per_call"] = mcp_cpu / measured * 1000 if measured else math.nan
        extra["mcp_calls"] = check
    return {
        "variant": v.name,
        "conversations": n,
        "turns_expected": n * cfg.turns,
        "turns_completed": completed,
        "completion_rate": completed / (n * cfg.turns),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "windowed_turns": len(out.windowed),
        "added_first_ms": summary(added),
        "added_first_tool_ms": summary(added_tool),
        "turn_total_ms": summary([t.end * 1000 for t in ok]),
        "graph_cpu_s": cpu,
        "graph_cpu_share": cpu / wall if wall else math.nan,
        "others_on_graph_cpu_share": max(0.0, others / wall)
        if wall and cfg.placement == "split"
        else math.nan,
        "cpu_s_per_conversation": cpu / n,
        "cpu_ms_per_turn": cpu / all_turns * 1000 if all_turns else math.nan,
        "cpu_us_per_model_chunk": cpu / model_chunks * 1e6 if model_chunks else math.nan,
        "turns_all": all_turns,
        "rss_mb": rss_mb(v.pid),
        "wall_s": wall,
        "window_s": window,
        "turns_per_s_in_window": len(ok) / window if window > 0 else math.nan,
        "client_cpu_share": (cpu_seconds(client.pid) - ccpu0) / wall if wall else math.nan,
        "client_loop_lag_ms": out.loop_lag_ms,
        "standin": sstats,
        "loadavg": list(os.getloadavg()),
        **extra,
    }


def print_row(r: dict[str, Any]) -> None:
    a = r["added_first_ms"]
    done = f"{r['turns_completed']}/{r['turns_expected']}"
    print(
        f"   {r['variant']:<9}{r['conversations']:>5}{done:>11}"
        f"{100 * r['completion_rate']:>6.0f}%{r['errors']:>4}"
        f"{a['p50']:>8.1f}{a['p99']:>8.1f}{r['cpu_s_per_conversation']:>8.3f}{r['cpu_ms_per_turn']:>7.1f}"
        f"{r['cpu_us_per_model_chunk']:>6.0f}{100 * r['graph_cpu_share']:>5.0f}%"
        f"{100 * r['others_on_graph_cpu_share']:>5.0f}%"
        f"{r['rss_mb']:>6.0f}{r['standin']['first_chunk_late_ms']['p99']:>6.1f}{r['client_loop_lag_ms']['p99']:>6.1f}"
        f"{100 * r['client_cpu_share']:>5.0f}%{r['loadavg'][0]:>6.2f}",
        flush=True,
    )
    if r["error_samples"]:
        print(f"      errors: {r['error_samples']}")
    m = r.get("mcp_calls")
    if m is not None and (m["calls"] or m["expected_calls"] or m["mismatches"]):
        verdict = "OK" if m["ok"] else "MISMATCH"
        print(
            f"      mcp server: {m['calls']} calls (expected {m['expected_calls']}) of {m['users']} users "
            f"on {m['fingerprints']} keys, {m['listings']} tools/list, its CPU "
            f"{m['server_cpu_ms_per_call']:.1f} ms per call; each user's calls carried "
            f"that user's key only: {verdict}",
            flush=True,
        )
        for line in m["mismatches"][:5]:
            print(f"      {line}")


TABLE_HEAD = (
    f"   {'variant':<9}{'conv':>5}{'turns done':>11}{'rate':>7}{'err':>4}{'add p50':>8}{'add p99':>8}"
    f"{'cpu s/c':>8}{'ms/trn':>7}{'us/ch':>6}{'graph':>6}{'other':>6}"
    f"{'RSS':>6}{'llm':>6}{'cl':>6}{'cl':>6}{'load':>6}\n"
    f"   {'':<9}{'':>5}{'':>11}{'':>7}{'':>4}{'ms':>8}{'ms':>8}"
    f"{'':>8}{'':>7}{'':>6}{'cpu':>6}{'cpu':>6}{'MiB':>6}{'lag':>6}{'lag':>6}{'cpu':>6}{'1 min':>6}"
)


def print_error_logs(service: Served, limit: int = 3) -> None:
    """The service's distinct error log records (by event), so an error count explains itself."""
    seen: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError, ValueError):
        for rec in service.log_records():
            if rec.get("level") in ("error", "critical", "exception"):
                seen.setdefault(str(rec.get("event")), rec)
    for event, rec in list(seen.items())[:limit]:
        detail = {k: v for k, v in rec.items() if k not in ("event", "timestamp", "level")}
        print(f"      service log: {event} {str(detail)[:400]}")


def sustains(r: dict[str, Any]) -> bool:
    return bool(r["errors"] == 0 and r["turns_completed"] > 0 and r["added_first_ms"]["p99"] <= P99_TARGET_MS)


def ramp(
    cfg: Config, variants: list[Variant], client: ClientProcess, llm_url: str, mcp: McpBench | None = None
) -> None:
    print("\n1) Ramp: concurrent conversations, milliseconds added to the model's own first token")
    print(
        f"   model: first token {cfg.ttft_ms:.0f} ms, then {cfg.chunks} chunks {cfg.chunk_ms:.0f} ms apart "
        f"({cfg.turn_s:.2f} s a turn); {100 * cfg.tool_share:.0f}% of conversations call a tool each turn; "
        f"each conversation {cfg.history} quick history turns, then {cfg.turns} measured turns"
    )
    if mcp is not None:
        print(
            f"   --mcp: tool turns call database_query (builtin) or {MCP_SERVER}__echo over MCP with "
            "the user's own key (mcp); the history turns, the first running the tool at once, "
            "run before the readings: CPU and chunks are the measured turns'"
        )
    warm = min(10, cfg.steps[0])
    for v in variants:  # unmeasured: imports, caches, pooled connections of a fresh process
        job = v.job(warm, cfg.tool_share, 1, 0.2, seed=1, history=HISTORY_TURNS)
        client.conn.send(job)
        if job.split_history:
            client.recv(TURN_TIMEOUT_S * 4 + 60)
            client.conn.send("go")
        client.recv(TURN_TIMEOUT_S * 4 + 60)
    print(TABLE_HEAD, flush=True)
    order = list(variants)
    for i, n in enumerate(cfg.steps):
        for v in order:
            if v.stopped:
                continue
            row = measure_step(cfg, v, n, client, llm_url, seed=1000 + i, mcp=mcp)
            v.rows.append(row)
            print_row(row)
            if not row.get("mcp_calls", {"ok": True})["ok"]:
                cfg.credential_mismatch = True
            if row["errors"]:
                print_error_logs(v.service)
            p99 = row["added_first_ms"]["p99"]
            if row["errors"]:
                v.stopped = f"{row['errors']} errors at {n} conversations"
            elif not p99 <= STOP_FACTOR * P99_TARGET_MS and v.api != "langgraph":
                # (LangGraph's server adds its run queue's polling to every first token, ~1 s
                # at any load: its ramp stops on errors only, so its CPU is measured at every step)
                v.stopped = f"added p99 {p99:.0f} ms at {n} conversations (> {STOP_FACTOR:.0f}x the target)"
            if v.stopped:
                print(f"   ({v.name}: ramp stopped: {v.stopped})", flush=True)
        order.reverse()


def ceiling_of(cfg: Config, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Conversations one core carries, from the CPU a conversation costs: the median over
    the steps of graph CPU seconds per conversation (its history turns and its measured
    turns), over the model's own time for those turns. CPU time, unlike latency, does not
    stretch when other processes take the core, so this holds on a busy host too."""
    if not rows:
        return {"implied_ceiling": math.nan}
    cpu = sorted(r["cpu_s_per_conversation"] for r in rows)[len(rows) // 2]
    model_s = cfg.turns * (
        (1 - cfg.tool_share) * cfg.turn_s
        + cfg.tool_share * (cfg.turn_s + cfg.tool_model_s - cfg.text_model_s)
    )
    per_s = cpu / model_s
    return {
        "cpu_s_per_conversation_median": cpu,
        "model_seconds_per_conversation": model_s,
        "cpu_ms_per_conversation_second": per_s * 1000,
        "implied_ceiling": 1 / per_s if per_s > 0 else math.nan,
    }


def capacity_summary(cfg: Config, variants: list[Variant]) -> dict[str, Any]:
    """Max sustained step per variant, and the CPU-implied ceiling (what bounds it)."""
    out: dict[str, Any] = {}
    print(
        "\n   what bounds it (one Python process: at most 1 core; "
        f"target: added p99 <= {P99_TARGET_MS:.0f} ms, 0 errors)"
    )
    for v in variants:
        best = 0
        for r in sorted(v.rows, key=lambda x: x["conversations"]):
            if not sustains(r):
                break
            best = r["conversations"]
        c = ceiling_of(cfg, v.rows)
        out[v.name] = {"max_sustained": best, "stopped": v.stopped, "code": v.code, **c}
        if not v.rows:
            continue
        turn = sorted(r["cpu_ms_per_turn"] for r in v.rows)[len(v.rows) // 2]
        chunk = sorted(r["cpu_us_per_model_chunk"] for r in v.rows)[len(v.rows) // 2]
        print(
            f"   {v.name:<9} sustains {best:>4} conversations. A conversation costs "
            f"{c['cpu_s_per_conversation_median']:.3f} "
            f"CPU s for {c['model_seconds_per_conversation']:.1f} s of model time = "
            f"{c['cpu_ms_per_conversation_second']:.1f} ms per second "
            f"({turn:.1f} ms per turn, {chunk:.0f} us per "
            f"model chunk relayed) -> one core is full at about {c['implied_ceiling']:.0f} conversations"
            + (f"\n             ramp stopped: {v.stopped}" if v.stopped else "")
        )
    return out


def print_comparison(variants: list[Variant], caps: dict[str, Any]) -> dict[str, Any]:
    """Per step current vs baseline, and the verdict on the >=10% rule."""
    cur, base = variants[0], variants[1]
    print(f"\n2) current vs baseline ({base.code}), alternating step by step")
    print(
        f"   {'conv':>6} | {'completed':>9} {'add p50':>8} {'add p99':>8} {'cpu s/cv':>9} | "
        f"{'completed':>9} {'add p50':>8} {'add p99':>8} {'cpu s/cv':>9} | {'cpu cur/base':>12}"
    )
    by_b = {r["conversations"]: r for r in base.rows}
    steps = []
    for r in cur.rows:
        b = by_b.get(r["conversations"])
        if b is None:
            continue
        ratio = r["cpu_s_per_conversation"] / b["cpu_s_per_conversation"]
        steps.append({"conversations": r["conversations"], "cpu_ratio_current_over_baseline": ratio})
        print(
            f"   {r['conversations']:>6} | {r['turns_completed']:>9} {r['added_first_ms']['p50']:>8.1f} "
            f"{r['added_first_ms']['p99']:>8.1f} {r['cpu_s_per_conversation']:>9.3f} | "
            f"{b['turns_completed']:>9} "
            f"{b['added_first_ms']['p50']:>8.1f} {b['added_first_ms']['p99']:>8.1f} "
            f"{b['cpu_s_per_conversation']:>9.3f} | {ratio:>12.3f}"
        )
    c, b2 = caps[cur.name], caps[base.name]
    ratios = [x["cpu_ratio_current_over_baseline"] for x in steps]
    paired = statistics.median(ratios) - 1 if ratios else math.nan
    gain = b2["implied_ceiling"] / c["implied_ceiling"] - 1 if c["implied_ceiling"] else math.nan
    print(
        f"   max sustained (every step up to it within target): current {c['max_sustained']}, "
        f"baseline {b2['max_sustained']}; CPU-implied ceiling: current {c['implied_ceiling']:.0f}, "
        f"baseline {b2['implied_ceiling']:.0f}"
    )
    # Verdict on CPU, paired step by step: added latency is a function of how busy the one
    # core is, so CPU per conversation sets the conversations at a given p99; the latency
    # columns move with other jobs on a shared host far more than CPU seconds do.
    buys = bool(paired >= 0.10)
    print(
        f"   the baseline ({base.code}) carries {100 * paired:+.1f}% conversations per core "
        f"(median of the per-step CPU ratios): >= 10% more at the same p99: {'YES' if buys else 'NO'}"
    )
    return {
        "steps": steps,
        "baseline_gain_paired_cpu": paired,
        "baseline_gain_implied": gain,
        "baseline_buys_10_percent": buys,
    }


def print_tracing(cfg: Config, variants: list[Variant], receiver: OtlpReceiver) -> dict[str, Any]:
    """Per step traced vs off, and the verdict on the target (at most 5% more CPU)."""
    off, on = variants[0], next(v for v in variants if v.name == "traced")
    time.sleep(cfg.export_schedule_s + 1)  # one export schedule of the traced graph: the last spans
    print("\n3) tracing: OpenTelemetry exported over OTLP (traced) vs off (current), alternating")
    print(
        f"   {'conv':>6} | {'off p99':>8} {'cpu s/cv':>9} | {'traced p99':>10} {'cpu s/cv':>9} | "
        f"{'cpu traced/off':>14} {'p99 added':>9}"
    )
    steps = []
    # paired step by step, in order (a step may be repeated, `--steps 30,30,30`, for more pairs)
    for r, t in zip(off.rows, on.rows, strict=False):
        ratio = t["cpu_s_per_conversation"] / r["cpu_s_per_conversation"]
        p99_added = t["added_first_ms"]["p99"] - r["added_first_ms"]["p99"]
        steps.append({"conversations": r["conversations"], "cpu_ratio": ratio, "p99_added_ms": p99_added})
        print(
            f"   {r['conversations']:>6} | "
            f"{r['added_first_ms']['p99']:>8.1f} {r['cpu_s_per_conversation']:>9.3f} | "
            f"{t['added_first_ms']['p99']:>10.1f} {t['cpu_s_per_conversation']:>9.3f} | "
            f"{ratio:>14.3f} {p99_added:>+9.1f}"
        )
    ratios = [x["cpu_ratio"] for x in steps]
    cost = statistics.median(ratios) - 1 if ratios else math.nan
    turns = sum(r["turns_completed"] for r in on.rows)
    spans = receiver.span_count
    within = bool(cost <= TRACING_TARGET)
    print(
        f"   tracing costs {100 * cost:+.1f}% CPU per conversation (median of the per-step ratios; "
        f"target <= {100 * TRACING_TARGET:.0f}%): {'YES' if within else 'NO'}; "
        f"{spans:,} spans received in {receiver.requests:,} exports, "
        f"{spans / max(turns, 1):.1f} per measured turn (warm-up and history turns included in the spans)"
    )
    return {
        "steps": steps,
        "cpu_cost_median": cost,
        "within_target": within,
        "spans_received": spans,
        "exports": receiver.requests,
    }


# ----------------------------------------------------------------------- parking


async def redis_figures(url: str, session_ids: Sequence[str]) -> dict[str, Any]:
    """used_memory and key count, and MEMORY USAGE summed over each sample session's keys."""
    from redis.asyncio import Redis

    r = Redis.from_url(url)
    try:
        info = await r.info("memory")
        keys = int(await r.dbsize())
        per: list[int] = []
        if session_ids:
            wanted = {s.encode() for s in session_ids}
            found: dict[bytes, list[bytes]] = {s: [] for s in wanted}
            async for k in r.scan_iter(count=2000):
                for s in wanted:
                    if s in k:
                        found[s].append(k)
                        break
            for ks in found.values():
                pipe = r.pipeline(transaction=False)
                for k in ks:
                    pipe.memory_usage(k, samples=0)
                per.append(sum(int(x or 0) for x in await pipe.execute()))
        return {"used_memory": int(info["used_memory"]), "keys": keys, "sample_session_bytes": per}
    finally:
        await r.aclose()


def park(cfg: Config, service: GraphProcess, redis_url: str, client: ClientProcess) -> dict[str, Any]:
    """Park cfg.park sessions at a pending confirmation; RSS and Redis before/after."""
    warm = min(PARK_WARMUP, max(1, cfg.park // 10))
    pid = service.proc.pid if service.proc else 0
    print(
        f"\n3) Parking {cfg.park:,} sessions at a pending confirmation (delete_records), "
        f"{PARK_CONCURRENCY} at a time"
    )
    empty = asyncio.run(redis_figures(redis_url, []))
    client.conn.send(ParkJob(service.url, cfg.park, warm, RESUME_SAMPLE))
    _, warm_parked, warm_errors = client.recv(600)
    time.sleep(cfg.settle_s)
    rss_before = rss_mb(pid)
    before = asyncio.run(redis_figures(redis_url, []))
    client.conn.send("go")
    _, parked, _ = client.recv(3600)
    time.sleep(cfg.settle_s)
    rss_after = rss_mb(pid)
    after = asyncio.run(redis_figures(redis_url, []))
    client.conn.send("go")
    _, result = client.recv(600)
    sample = asyncio.run(redis_figures(redis_url, result["sample_session_ids"][:100]))
    extra = parked - warm_parked
    delta_per = (after["used_memory"] - before["used_memory"]) / extra if extra > 0 else math.nan
    keys_per = (after["keys"] - before["keys"]) / extra if extra > 0 else math.nan
    mem = summary([float(x) for x in sample["sample_session_bytes"]])
    rate = parked / result["park_seconds"] if result["park_seconds"] else math.nan
    print(
        f"   parked {parked:,} ({result['error_count']} failed) in {result['park_seconds']:.0f} s "
        f"({rate:.0f}/s)"
    )
    print(
        f"   redis bytes per parked session: {delta_per:,.0f} (used_memory delta / sessions), "
        f"{mem['p50']:,.0f} p50 / {mem['max']:,.0f} max (MEMORY USAGE over its keys, "
        f"{len(sample['sample_session_bytes'])} "
        f"sampled); {keys_per:.1f} keys each; used_memory {empty['used_memory'] / 2**20:.1f} MiB empty -> "
        f"{after['used_memory'] / 2**20:.1f} MiB"
    )
    print(
        f"   graph RSS: {rss_before:.1f} MiB after {warm_parked} parked -> {rss_after:.1f} MiB after "
        f"{parked:,} ({rss_after - rss_before:+.1f} MiB, "
        f"{(rss_after - rss_before) * 2**20 / max(1, extra):,.0f} bytes per extra session)"
    )
    print(
        f"   resumed {result['resumed']}/{result['resume_tried']} sampled sessions "
        "with 'yes' to a final answer"
    )
    if result["errors"]:
        print(f"   errors: {sorted(set(result['errors']))[:5]}")
        print_error_logs(service)
    result.pop("sample_session_ids")
    return {
        **result,
        "warmup": warm_parked,
        "warmup_errors": warm_errors,
        "redis_bytes_per_session_used_memory": delta_per,
        "redis_bytes_per_session_memory_usage": mem,
        "redis_keys_per_session": keys_per,
        "redis_used_memory": {
            "empty": empty["used_memory"],
            "warm": before["used_memory"],
            "after": after["used_memory"],
        },
        "rss_mb_before": rss_before,
        "rss_mb_after": rss_after,
        "rss_delta_mb": rss_after - rss_before,
    }


def rss_control(cfg: Config, service: GraphProcess, client: ClientProcess) -> dict[str, Any]:
    """The same number of ORDINARY one-turn sessions (answered at once, nothing pending) on a
    fresh graph process, measured the same way: how much RSS any traffic adds, to hold the
    parked sessions' RSS against."""
    warm = min(PARK_WARMUP, max(1, cfg.park // 10))
    pid = service.proc.pid if service.proc else 0
    client.conn.send(ParkJob(service.url, cfg.park, warm, 0, CONTROL_TEXT))
    _, warm_done, _ = client.recv(600)
    time.sleep(cfg.settle_s)
    before = rss_mb(pid)
    client.conn.send("go")
    _, done, _ = client.recv(3600)
    time.sleep(cfg.settle_s)
    after = rss_mb(pid)
    client.conn.send("go")
    _, result = client.recv(600)
    extra = max(1, done - warm_done)
    print(
        f"   control, {done:,} ordinary finished sessions on a fresh graph ({result['error_count']} errors): "
        f"RSS {before:.1f} -> {after:.1f} MiB ({after - before:+.1f} MiB, "
        f"{(after - before) * 2**20 / extra:,.0f} bytes per extra session)"
    )
    return {
        "sessions": done,
        "warmup": warm_done,
        "error_count": result["error_count"],
        "errors": result["errors"][:5],
        "rss_mb_before": before,
        "rss_mb_after": after,
        "rss_delta_mb": after - before,
    }


# ------------------------------------------------------------------- --peer, --profile


def start_peer(cfg: Config, tmp: Path, llm_url: str, stack: contextlib.ExitStack) -> Variant:
    """The peer server (--peer), started and healthy, stopped with the stack: bench/relay.py
    under the bench's venv, or LangGraph's server (`langgraph dev`: langgraph-api's
    in-memory runtime) from its own venv, serving bench/langgraph_peer/ with the same model."""
    port = free_port()
    model = {"OPENAI_BASE_URL": llm_url, "OPENAI_API_KEY": "test-key", "LLM_MODEL": "test-model"}
    if cfg.peer == "relay":
        argv = [sys.executable, str(ROOT / "bench" / "relay.py"), "--llm-url", llm_url, "--port", str(port)]
        peer = PeerProcess("relay", argv, {"LOG_LEVEL": "WARNING"}, tmp / "relay.log", "/health", port)
        code = "bench/relay.py: FastAPI + httpx, one JSON decode and one SSE event per model chunk"
        variant = Variant("relay", peer, code)
    else:
        exe = LANGGRAPH_VENV / "bin" / "langgraph"
        if not exe.exists():
            raise BenchError(f"--peer langgraph needs {exe}: run `make bench-langgraph-venv` first")
        work = tmp / "langgraph"  # its dev runtime writes .langgraph_api/ under the working directory
        work.mkdir()
        jobs = max(10, max(cfg.steps))  # a run per conversation at once, as vagent takes them
        argv = ["env", "-C", str(work), str(exe), "dev", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--no-browser", "--no-reload", "--allow-blocking", "--n-jobs-per-worker", str(jobs)]
        # its paths are relative to the working directory: the repository's config, made absolute
        config = json.loads((LANGGRAPH_DIR / "langgraph.json").read_text())
        config["dependencies"] = [str(LANGGRAPH_DIR)]
        config["graphs"] = {k: str(LANGGRAPH_DIR / p.removeprefix("./")) for k, p in config["graphs"].items()}
        (work / "langgraph.json").write_text(json.dumps(config))
        argv += ["--config", str(work / "langgraph.json")]
        env = {
            **model,
            "LANGGRAPH_DISABLE_FILE_PERSISTENCE": "true",  # the dev server's pickling to disk: off
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "VIRTUAL_ENV": str(LANGGRAPH_VENV),
        }
        peer = PeerProcess("langgraph", argv, env, tmp / "langgraph.log", "/ok", port)
        versions = subprocess.run(
            [str(LANGGRAPH_VENV / "bin" / "python"), "-c", LANGGRAPH_VERSIONS],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        code = f"langgraph dev (in-memory runtime, {jobs} jobs), bench/langgraph_peer/graph.py; {versions}"
        variant = Variant("langgraph", peer, code, api="langgraph")
    stack.callback(peer.stop)
    try:
        peer.start()
    except (RuntimeError, TimeoutError) as exc:
        raise BenchError(f"the {cfg.peer} peer did not start: {exc}") from None
    return variant


LANGGRAPH_VERSIONS = (
    "from importlib.metadata import version as v; print(', '.join(f'{d} {v(d)}' for d in ("
    "'langgraph-api', 'langgraph-runtime-inmem', 'langgraph', 'langchain-core', 'langchain-openai', "
    "'openai')))"
)


def _at_step(rows: list[dict[str, Any]], n: int) -> dict[str, Any] | None:
    return next((r for r in rows if r["conversations"] == n), None)


def print_peer(cfg: Config, variants: list[Variant]) -> dict[str, Any]:
    """Per step the graph beside the peer: CPU per turn and per model chunk, added p99, and
    the ratio against the issue's target: graph/relay <= 0.6 at 40 conversations (its
    held-out check), LangGraph's server/vagent >= 5."""
    graph, peer = variants[0], variants[-1]
    relay = peer.name == "relay"
    print(
        f"\n2) the graph beside {peer.name} ({peer.code}), alternating step by step, both on the graph's core"
    )
    ratio_name = "graph/relay" if relay else "langgraph/vagent"
    print(
        f"   {'conv':>6} | {'graph ms/trn':>12} {'us/ch':>6} {'add p99':>8} | {peer.name + ' ms/trn':>14} "
        f"{'us/ch':>6} {'add p99':>8} | {ratio_name:>16}"
    )
    steps: list[dict[str, Any]] = []
    for g in graph.rows:
        r = _at_step(peer.rows, g["conversations"])
        if r is None:
            continue
        gt, pt = g["cpu_ms_per_turn"], r["cpu_ms_per_turn"]
        ratio = gt / pt if relay else pt / gt
        steps.append(
            {
                "conversations": g["conversations"],
                "graph_cpu_ms_per_turn": gt,
                "graph_cpu_us_per_chunk": g["cpu_us_per_model_chunk"],
                "graph_added_p99_ms": g["added_first_ms"]["p99"],
                f"{peer.name}_cpu_ms_per_turn": pt,
                f"{peer.name}_cpu_us_per_chunk": r["cpu_us_per_model_chunk"],
                f"{peer.name}_added_p99_ms": r["added_first_ms"]["p99"],
                "ratio": ratio,
                "errors": g["errors"] + r["errors"],
            }
        )
        print(
            f"   {g['conversations']:>6} | {gt:>12.1f} {g['cpu_us_per_model_chunk']:>6.0f} "
            f"{g['added_first_ms']['p99']:>8.1f} | {pt:>14.1f} {r['cpu_us_per_model_chunk']:>6.0f} "
            f"{r['added_first_ms']['p99']:>8.1f} | {ratio:>15.2f}x"
        )
    result: dict[str, Any] = {"peer": peer.name, "code": peer.code, "steps": steps, "ratio_name": ratio_name}
    if not steps:
        print("   no step measured in both")
        return result
    at = _at_step(steps, RELAY_TARGET_STEP) if relay else None
    at = at or max(steps, key=lambda x: x["conversations"])
    pt = at[f"{peer.name}_cpu_ms_per_turn"]
    gt = at["graph_cpu_ms_per_turn"]
    errors = f"; {at['errors']} errors" if at["errors"] else ""
    n = at["conversations"]
    if relay:
        ok = bool(at["ratio"] <= RELAY_TARGET)
        line = (
            f"at {n} conversations: graph CPU per turn {gt:.1f} ms, relay {pt:.1f} ms, "
            f"ratio {at['ratio']:.2f} "
            f"(target <= {RELAY_TARGET}): {'PASS' if ok else 'MISS'}{errors}"
        )
        if n != RELAY_TARGET_STEP:
            line += f" (the held-out check is at {RELAY_TARGET_STEP}: --steps {RELAY_TARGET_STEP})"
    else:
        ok = bool(at["ratio"] >= LANGGRAPH_TARGET)
        line = (
            f"at {n} conversations: LangGraph's server CPU per turn {pt:.1f} ms, vagent {gt:.1f} ms, "
            f"ratio {at['ratio']:.2f} (target >= {LANGGRAPH_TARGET:.0f}): {'PASS' if ok else 'MISS'}{errors}"
        )
    if cfg.turns and cfg.quick:
        line += " [--quick: not a measurement]"
    print(f"   {line}")
    result.update(at=at, verdict_line=line, target_met=ok)
    return result


#: --profile: how a sampled frame's module is grouped (first matching prefix), and which of
#: issue 34's stages the group stands for. vagent_graph and vagent_shared are grouped by
#: their module or subpackage; anything else by its top-level package.
PROFILE_GROUPS: tuple[tuple[str, str], ...] = (
    ("langgraph.checkpoint", "checkpoint (saver: serialise, Redis)"),
    ("langgraph", "LangGraph run and stream"),
    ("langchain_openai", "LangChain chunk (OpenAI adapter)"),
    ("langchain_core", "LangChain chunk, callbacks"),
    ("openai", "model stream parsing (SDK)"),
    ("httpx", "model HTTP client"),
    ("httpcore", "model HTTP client"),
    ("h11", "model HTTP client"),
    ("httpx2", "model HTTP client"),
    ("httpcore2", "model HTTP client"),
    ("sse_starlette", "SSE encode"),
    ("starlette", "HTTP server"),
    ("fastapi", "HTTP server"),
    ("uvicorn", "HTTP server"),
    ("redis", "Redis round trips (client)"),
    ("redisvl", "Redis round trips (client)"),
    ("pydantic", "pydantic models"),
    ("pydantic_core", "pydantic models"),
    ("structlog", "logging"),
    ("logging", "logging"),
    ("opentelemetry", "tracing"),
    ("json", "JSON"),
    ("orjson", "JSON"),
    ("ormsgpack", "checkpoint serialisation"),
    ("asyncio", "event loop"),
    ("uvloop", "event loop"),
    ("anyio", "event loop"),
)
#: --profile: frames that only drive the event loop, stripped from a stack's root so that a
#: group's self+children time is what it does, not "the loop was running it".
DRIVER_MODULES = frozenset(
    {
        "vagent_graph.__main__",
        "uvicorn.main",
        "uvicorn.server",
        "asyncio.runners",
        "asyncio.base_events",
        "asyncio.events",
        "runpy",
    }
)
_SITE = re.compile(r"/(?:site|dist)-packages/(.+)$")
_STDLIB = re.compile(r"/lib/python3\.\d+/(.+)$")


def frame_module(frame: str) -> str:
    """'func (/path/to/pkg/mod.py:12)' -> 'pkg.mod' (best effort; '?' when no file)."""
    m = re.search(r"\(([^()]*?)(?::\d+)?\)$", frame)
    path = m.group(1) if m else ""
    if path.startswith("<frozen "):  # a frozen stdlib module: '<frozen abc>'
        return path.removeprefix("<frozen ").removesuffix(">")
    for pattern in (_SITE, _STDLIB):
        hit = pattern.search(path)
        if hit:
            rel = hit.group(1)
            break
    else:
        src = path.split("/src/", 1)
        rel = src[1] if len(src) == 2 else path.rsplit("/", 1)[-1]
    rel = rel.removesuffix(".py").removesuffix("/__init__")
    return rel.replace("/", ".") or "?"


def module_group(module: str) -> str:
    for prefix, _ in PROFILE_GROUPS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    parts = module.split(".")
    if parts[0] in ("vagent_graph", "vagent_shared", "vagent_bot") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def stage_table(raw: str) -> tuple[int, dict[str, int], dict[str, int]]:
    """py-spy's raw (collapsed) stacks -> (samples, self samples by group (the leaf frame's),
    inclusive samples by group (the group anywhere on the stack, once per sample))."""
    total = 0
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        modules = [frame_module(f) for f in stack.split(";") if "(" in f and "/bin/" not in f]
        if not modules:
            continue
        root = 0
        while root < len(modules) - 1 and modules[root] in DRIVER_MODULES:
            root += 1
        groups = [module_group(m) for m in modules[root:]]
        total += n
        own[groups[-1]] += n
        for g in set(groups):
            incl[g] += n
    return total, dict(own), dict(incl)


def run_profile(cfg: Config, v: Variant, client: ClientProcess, llm_url: str) -> dict[str, Any]:
    """One more step of the graph at the largest --steps, sampled by py-spy from the bench's
    core (--nonblocking: the graph is never paused): where its CPU goes, by module group,
    as self and self+children time, scaled to the step's measured CPU per turn and per
    model chunk. The raw profile goes to bench/results/."""
    n = max(cfg.steps)
    spy = Path(sys.executable).parent / "py-spy"
    out = cfg.json_path.with_name(cfg.json_path.stem + f"-profile-{n}.txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"\n3) profile: {v.name} at {n} conversations under py-spy ({PROFILE_RATE} Hz, nonblocking)")
    cmd = [str(spy), "record", "--pid", str(v.pid), "--rate", str(PROFILE_RATE), "--format", "raw"]
    cmd += ["--nonblocking", "--full-filenames", "--output", str(out)]
    log = cfg.json_path.with_name(cfg.json_path.stem + "-py-spy.log")
    with open(log, "wb") as spy_log:
        proc = subprocess.Popen(cmd, stdout=spy_log, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)  # attached before the step starts
        if proc.poll() is not None:
            raise BenchError(f"py-spy could not sample the graph: {log.read_text()[-1000:]}")
        row = measure_step(cfg, v, n, client, llm_url, seed=9000)
        row["variant"] = f"{v.name}*"
        print(TABLE_HEAD)
        print_row(row)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not out.exists():
        raise BenchError(f"py-spy wrote no profile: {log.read_text()[-1000:]}")
    total, own, incl = stage_table(out.read_text())
    turn_ms, chunk_us = row["cpu_ms_per_turn"], row["cpu_us_per_model_chunk"]
    label = dict(PROFILE_GROUPS)
    print(
        f"   {total:,} samples ({total / PROFILE_RATE:.1f} s on CPU sampled; the step measured "
        f"{row['graph_cpu_s']:.1f} s); by module group, top 20 by self+children:"
    )
    print(
        f"   {'group':<28}{'self %':>7}{'incl %':>7}{'self ms/trn':>12}{'incl ms/trn':>12}"
        f"{'self us/ch':>11}{'incl us/ch':>11}  stage"
    )
    groups = []
    for g, k in sorted(incl.items(), key=lambda x: -x[1]):
        share_own, share_incl = own.get(g, 0) / total if total else 0.0, k / total if total else 0.0
        groups.append(
            {
                "group": g,
                "stage": label.get(g, "vagent's own code" if g.startswith("vagent") else ""),
                "self_share": share_own,
                "incl_share": share_incl,
                "self_ms_per_turn": share_own * turn_ms,
                "incl_ms_per_turn": share_incl * turn_ms,
                "self_us_per_chunk": share_own * chunk_us,
                "incl_us_per_chunk": share_incl * chunk_us,
            }
        )
    for x in groups[:20]:
        print(
            f"   {x['group'][:27]:<28}{100 * x['self_share']:>6.1f}%{100 * x['incl_share']:>6.1f}%"
            f"{x['self_ms_per_turn']:>12.2f}{x['incl_ms_per_turn']:>12.2f}{x['self_us_per_chunk']:>11.0f}"
            f"{x['incl_us_per_chunk']:>11.0f}  {x['stage']}"
        )
    print(
        "   (self: the sample's innermost frame is in the group; incl: the group is anywhere on the "
        "stack, so nested groups overlap and the column does not add up to 100%)"
    )
    print(f"   raw profile (py-spy collapsed stacks, flamegraph input): {out}")
    return {
        "conversations": n,
        "row": row,
        "samples": total,
        "rate_hz": PROFILE_RATE,
        "raw": str(out),
        "groups": groups,
    }


# -------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--steps", help=f"concurrent conversations per step (default {d['steps']})")
    p.add_argument(
        "--ttft-ms", type=float, help=f"the model's time to first token (default {d['ttft_ms']:.0f})"
    )
    p.add_argument(
        "--chunk-ms", type=float, help=f"ms between the model's chunks (default {d['chunk_ms']:.0f})"
    )
    p.add_argument("--chunks", type=int, help=f"chunks of a text answer (default {d['chunks']})")
    p.add_argument(
        "--tool-share", type=float, help=f"share of conversations calling a tool (default {d['tool_share']})"
    )
    p.add_argument(
        "--park", type=int, help=f"sessions to park at a confirmation; 0 skips (default {d['park']})"
    )
    p.add_argument("--turns", type=int, help=f"measured turns per conversation (default {d['turns']})")
    p.add_argument(
        "--history",
        type=int,
        default=HISTORY_TURNS,
        help=f"quick turns each conversation makes first: 2 history messages each (default {HISTORY_TURNS})",
    )
    p.add_argument(
        "--baseline-ref", help="also run this git ref's graph service (a temporary worktree), alternating"
    )
    p.add_argument("--quick", action="store_true", help="tiny numbers for a smoke test: " + str(QUICK))
    p.add_argument(
        "--mcp",
        action="store_true",
        help="tool turns over MCP with each user's own key vs the built-in tool, on one graph, "
        f"alternating (instead of a baseline); changes the defaults: {MCP_DEFAULTS}, --quick: {MCP_QUICK}",
    )
    p.add_argument(
        "--tracing",
        action="store_true",
        help="also run a graph exporting OpenTelemetry traces to a local OTLP receiver, alternating "
        "with the untraced one: CPU per conversation and added p99, traced vs off",
    )
    p.add_argument(
        "--peer",
        choices=["relay", "langgraph"],
        help="also run a peer server beside the graph, alternating step by step, and report CPU per "
        "turn side by side: relay (bench/relay.py, a plain FastAPI + httpx per-chunk relay) or langgraph "
        "(LangGraph's own server, `make bench-langgraph-venv` first); changes the defaults: "
        f"{PEER_DEFAULTS}, --quick: {PEER_QUICK}",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the ramp, one more step of the graph at the largest --steps under py-spy: where its "
        f"CPU goes, by module; raw profile in bench/results/ (alone, the defaults become {PROFILE_DEFAULTS})",
    )
    p.add_argument(
        "--placement",
        choices=["split", "kernel"],
        default="split",
        help="split (default): the graph on one CPU, everything else on the others; kernel: no pinning",
    )
    p.add_argument("--log-level", default="INFO", help="the service's LOG_LEVEL (default INFO, as deployed)")
    p.add_argument("--json", type=Path, help="results file (default bench/results/capacity-<timestamp>.json)")
    a = p.parse_args(argv)
    base = QUICK if a.quick else DEFAULTS
    if a.mcp:
        base = {**base, **(MCP_QUICK if a.quick else MCP_DEFAULTS)}
        if a.baseline_ref:
            p.error("--mcp compares two kinds of tool turn on one graph; it takes no --baseline-ref")
        if a.tracing:
            p.error("--mcp takes no --tracing: run them apart")
    if a.peer:
        if a.mcp or a.baseline_ref or a.tracing:
            p.error("--peer takes no --mcp, --baseline-ref or --tracing: run them apart")
        if a.tool_share:
            p.error("--peer compares plain streamed turns: a peer runs no tools (--tool-share 0)")
        base = {**base, **(PEER_QUICK if a.quick else PEER_DEFAULTS)}
    elif a.profile and not a.quick and not a.mcp:
        base = {**base, **PROFILE_DEFAULTS}
    val = {k: getattr(a, k) if getattr(a, k) is not None else base[k] for k in DEFAULTS}
    try:
        steps = [int(s) for s in str(val["steps"]).split(",") if s.strip()]
    except ValueError:
        p.error("--steps takes comma-separated integers")
    if not steps or min(steps) < 1:
        p.error("--steps must be positive")
    if val["chunks"] < 1 or val["ttft_ms"] < 0 or val["chunk_ms"] < 0 or val["turns"] < 1 or val["park"] < 0:
        p.error("--chunks, --ttft-ms, --chunk-ms, --turns and --park must be positive")
    if a.history < 0:
        p.error("--history must be 0 or more")
    if not 0 <= val["tool_share"] <= 1:
        p.error("--tool-share is a share between 0 and 1")
    return Config(
        steps=steps,
        ttft_ms=val["ttft_ms"],
        chunk_ms=val["chunk_ms"],
        chunks=val["chunks"],
        tool_share=val["tool_share"],
        park=val["park"],
        turns=val["turns"],
        baseline_ref=a.baseline_ref,
        quick=a.quick,
        placement=a.placement,
        log_level=a.log_level,
        json_path=a.json or default_results_path("capacity"),
        mcp=a.mcp,
        tracing=a.tracing,
        export_schedule_s=QUICK_EXPORT_SCHEDULE_S if a.quick else EXPORT_SCHEDULE_S,
        settle_s=QUICK_SETTLE_S if a.quick else SETTLE_S,
        peer=a.peer,
        profile=a.profile,
        history=a.history,
    )


def run(cfg: Config) -> dict[str, Any]:
    info = machine_info(VERSIONS_OF)
    started = datetime.now(UTC)
    print_machine("vagent capacity benchmark", info, started)
    with contextlib.ExitStack() as stack:
        client = ClientProcess()  # forks: before anything starts a thread
        stack.callback(client.stop)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-capacity-")))
        redis = start_redis(stack, tmp / "redis")
        llm_url, _ = stack.enter_context(paced_standin(cfg.ttft_ms, cfg.chunk_ms, cfg.chunks))
        extra = {"LOG_LEVEL": cfg.log_level}
        mcp: McpBench | None = None
        mcp_env: dict[str, str] = {}
        if cfg.mcp:
            mcp, mcp_env = start_mcp(stack, tmp, cfg)
        current = GraphProcess(redis.url, tmp / "graph-current", llm_url, **extra, **mcp_env)
        code = "working tree " + git_state()
        if mcp is not None:
            variants = [
                Variant("builtin", current, code, grants=MCP_GRANTS, split_history=True),
                Variant("mcp", current, code, marker="[mcp]", grants=MCP_GRANTS, split_history=True),
            ]
        else:
            variants = [Variant("current", current, code)]
        conf: dict[str, Any] = {
            "steps": cfg.steps,
            "ttft_ms": cfg.ttft_ms,
            "chunk_ms": cfg.chunk_ms,
            "chunks": cfg.chunks,
            "tool_share": cfg.tool_share,
            "history_turns": cfg.history,
            "measured_turns": cfg.turns,
            "park": cfg.park,
            "quick": cfg.quick,
            "service_log_level": cfg.log_level,
            "p99_target_ms": P99_TARGET_MS,
            "stop_factor": STOP_FACTOR,
            "mcp": cfg.mcp,
        }
        conf["current_imports"] = imported_from(current.env)
        conf["current_commit"] = git_state()
        if cfg.baseline_ref:
            wt, sha = stack.enter_context(baseline_worktree(cfg.baseline_ref))
            path = f"{wt / 'graph' / 'src'}{os.pathsep}{wt / 'shared' / 'src'}"
            baseline = GraphProcess(redis.url, tmp / "graph-baseline", llm_url, PYTHONPATH=path, **extra)
            where = imported_from(baseline.env)
            if not where.startswith(str(wt)) or str(wt) not in where.splitlines()[1]:
                raise BenchError(f"the baseline would not import from its worktree: {where}")
            conf["baseline_ref"], conf["baseline_commit"], conf["baseline_imports"] = (
                cfg.baseline_ref,
                sha,
                where,
            )
            variants.append(Variant("baseline", baseline, sha[:10]))
        receiver: OtlpReceiver | None = None
        if cfg.tracing:
            receiver = OtlpReceiver(keep_spans=False).start()
            stack.callback(receiver.stop)
            otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
            if cfg.export_schedule_s != EXPORT_SCHEDULE_S:
                otel["OTEL_BSP_SCHEDULE_DELAY"] = str(round(cfg.export_schedule_s * 1000))
            traced = GraphProcess(redis.url, tmp / "graph-traced", llm_url, **otel, **extra)
            conf["tracing"] = {
                "exporter": "otlp http/protobuf",
                "receiver": receiver.endpoint,
                "export_schedule_s": cfg.export_schedule_s,
            }
            variants.append(Variant("traced", traced, code))
        if cfg.peer:
            peer = start_peer(cfg, tmp, llm_url, stack)
            variants.append(peer)
            conf["peer"] = {"name": cfg.peer, "code": peer.code, "argv": peer.service.argv}
        park_redis = park_service = control_service = None
        if cfg.park:
            park_redis = start_redis(stack, tmp / "redis-park")  # dedicated: only parked sessions
            park_service = GraphProcess(park_redis.url, tmp / "graph-park", llm_url, **extra)
            control_service = GraphProcess(redis.url, tmp / "graph-control", llm_url, **extra)
        services = [*{id(v.service): v.service for v in variants}.values()]
        services = [s for s in services if not isinstance(s, PeerProcess)]  # each started by start_peer
        services += [s for s in (park_service, control_service) if s is not None]
        stack.callback(stop_together, services)
        start_together(services)  # at once, as replicas may start (checkpointer.set_up_indexes)
        if mcp is not None:
            conf["mcp_server"] = {
                "name": MCP_SERVER,
                "tool": f"{MCP_SERVER}__echo",
                "transport": "streamable_http",
                "credential": "user",
                "users_with_keys": len(mcp.keys),
                "graph_health": check_mcp_listed(current),
            }
        graph_pids = [v.pid for v in variants] + [
            s.proc.pid for s in (park_service, control_service) if s is not None and s.proc is not None
        ]
        conf["placement"] = place(cfg.placement, graph_pids)
        cfg.graph_cpu = min(os.sched_getaffinity(graph_pids[0])) if hasattr(os, "sched_getaffinity") else 0
        print(f"   steps   : {cfg.steps}; parking {cfg.park:,}; placement: {conf['placement']}")
        for v in variants:
            if isinstance(v.service, PeerProcess):
                print(f"   {v.name:<8}: {v.code}")
                continue
            imp = conf.get(f"{v.name}_imports", conf["current_imports"]).splitlines()[0]
            print(f"   {v.name:<8}: {v.code}, vagent_graph from {imp}")
        if mcp is not None:
            print(
                f"   mcp     : {mcp.server.url} (tests/support/mcp_server.py, echo), keys of {len(mcp.keys)} "
                f"users from vagent-credentials {mcp.registry.base_url}"
            )
        try:
            ramp(cfg, variants, client, llm_url, mcp)
            caps = capacity_summary(cfg, variants)
            comparison = print_comparison(variants, caps) if cfg.baseline_ref else None
            tracing = print_tracing(cfg, variants, receiver) if receiver is not None else None
            peer_result = print_peer(cfg, variants) if cfg.peer else None
            profile = run_profile(cfg, variants[0], client, llm_url) if cfg.profile else None
            mcp_result = None
            if mcp is not None:
                mcp.take_calls()
                mcp_result = print_mcp_comparison(cfg, variants)
                mcp_result["credentials"] = print_credential_groups(cfg, mcp)
            parked = control = None
            if park_service and park_redis and control_service:
                parked = park(cfg, park_service, park_redis.url, client)
                control = rss_control(cfg, control_service, client)
        except Exception:
            if not INTERRUPTED.is_set():
                for v in variants:
                    print_log_tail(f"{v.name} service", v.service.logs(), 20)
            raise
    info["loadavg_at_end"] = list(os.getloadavg())
    print(f"   load average at the end: {', '.join(f'{x:.2f}' for x in info['loadavg_at_end'])}")
    return make_results(
        started,
        info,
        conf,
        steps=[r for v in variants for r in v.rows],
        capacity=caps,
        comparison=comparison,
        parking=parked,
        rss_control=control,
        **({"mcp": mcp_result} if cfg.mcp else {}),
        **({"tracing": tracing} if cfg.tracing else {}),
        **({"peer": peer_result} if cfg.peer else {}),
        **({"profile": profile} if cfg.profile else {}),
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    code = run_main(lambda: run(cfg), cfg.json_path)
    if code == 0 and cfg.credential_mismatch:
        print("\nMISMATCH: an MCP call carried another key than its user's own (see above)", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
