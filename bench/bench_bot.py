#!/usr/bin/env python3
"""Benchmark the vagent bot as a person in a Matrix DM sees it, against an echo bot floor.

One human (a matrix-nio client, tests/support/matrix_human.py) talks to two bots on the
same local Synapse in the same run:

* ECHO: ``bench/echo_bot.py``, the least a matrix-nio bot can do (sync, reply with the
  same text). It is the floor: Synapse, the sync long-poll and one send.
* VAGENT: the real ``vagent-bot`` with everything behind it: Redis, the development
  AccessControlProvider, the ``vagent-graph`` service and a zero-delay OpenAI-compatible
  stand-in that always answers the same 20-word text in 20 chunks.

The human sends one message at a time and waits for the answer before the next. For each
message it measures, with ``time.perf_counter`` on its own side, the time from just
before the send to the bot's FIRST VISIBLE reply in its sync, and to the FINAL content
(for vagent the final edit; for echo the reply itself). Both bots are measured by the
same client code, interleaved message by message, so drift and the human's own sync
latency hit both alike. The target is a vagent/echo ratio of at most 1.5 for the FINAL
p50. A MISS never makes the exit code non-zero.

Everything runs locally on 127.0.0.1 free ports and is torn down at the end, on an
error, on Ctrl-C and on SIGTERM.

    .venv/bin/python bench/bench_bot.py            # or: make bench-bot
    .venv/bin/python bench/bench_bot.py --quick    # about a minute, for smoke tests
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import importlib
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from procutil import free_port, read_log, stop_process, wait_until  # noqa: E402

from bench.common import (  # noqa: E402
    ANSWER,
    CHUNKS,
    INTERRUPTED,
    QUESTION,
    BenchError,
    cancel_on_sigint,
    default_results_path,
    llm_standin,
    machine_info,
    make_results,
    percentile,
    print_log_tail,
    print_machine,
    resolve_counts,
    run_main,
    start_together,
    summary,
    verdict,
)
from synapse_local import SynapseServer  # noqa: E402
from tests.support.graph_process import TOKEN, GraphProcess  # noqa: E402
from tests.support.matrix_human import HumanClient  # noqa: E402
from tests.support.procs import ServiceProcess  # noqa: E402

DOMAIN = "localhost"
RATIO_TARGET = 1.5
DEFAULTS: dict[str, int] = {"messages": 100, "warmup": 5}
QUICK: dict[str, int] = {"messages": 5, "warmup": 1}
#: The human's sync long-poll. Synapse answers a waiting sync as soon as an event arrives,
#: so this bounds only how long an idle sync hangs, not how late an event is seen.
HUMAN_SYNC_TIMEOUT_MS = 1000
ECHO_SYNC_TIMEOUT_MS = 1000
#: Libraries whose versions the report names: what the numbers depend on.
VERSIONS_OF = ("matrix-nio", "matrix-synapse", "aiohttp", "httpx", "langgraph", "fastapi", "redis")


# ---------------------------------------------------------------------------- statistics


@dataclass
class Sample:
    """One message as the human saw it; seconds on perf_counter, *_ts on Synapse's clock (ms)."""

    first: float  # send started -> first reply seen in the human's sync
    final: float  # send started -> final content seen
    send: float  # the human's send request (PUT) round trip
    edits: int  # m.replace events of the reply seen up to the final content
    wall0: float  # time.time() when the send started, to place it on the servers' clock
    question_ts: int  # origin_server_ts of the human's message
    first_ts: int  # ... of the bot's reply
    final_ts: int  # ... of the event carrying the final content (the reply itself for echo)

    def to_json(self) -> dict[str, Any]:
        """Milliseconds, as stored in the results file."""
        return {
            "first_ms": self.first * 1000,
            "final_ms": self.final * 1000,
            "send_ms": self.send * 1000,
            "edits": self.edits,
            "stored_ms": self.question_ts - self.wall0 * 1000,
            "turnaround_first_ms": self.first_ts - self.question_ts,
            "turnaround_final_ms": self.final_ts - self.question_ts,
            "sent_at": self.wall0,
            "question_ts": self.question_ts,
            "first_ts": self.first_ts,
            "final_ts": self.final_ts,
        }


@dataclass
class BotRun:
    """All measured messages of one bot."""

    name: str
    samples: list[Sample]

    def ms(self, attr: str) -> list[float]:
        """One *_ms field of every sample."""
        return [float(s.to_json()[attr]) for s in self.samples]

    def stats(self, attr: str) -> dict[str, float]:
        return summary(self.ms(attr))

    def to_json(self) -> dict[str, Any]:
        """The bot's figures as stored in the results file."""
        edits = [s.edits for s in self.samples]
        return {
            "messages": len(self.samples),
            "first_visible_ms": self.stats("first_ms"),
            "final_ms": self.stats("final_ms"),
            "send_ms": self.stats("send_ms"),
            "turnaround_first_ms": self.stats("turnaround_first_ms"),
            "turnaround_final_ms": self.stats("turnaround_final_ms"),
            "edits": {"median": statistics.median(edits), "min": min(edits), "max": max(edits)},
            "samples": [s.to_json() for s in self.samples],
        }


# ----------------------------------------------------------------------------- the human


@dataclass(frozen=True)
class Reply:
    """What the human saw of one answer: event ids and when each was first readable."""

    reply_id: str
    final_id: str
    first_seen: float
    final_seen: float
    edits: int


class BenchHuman(HumanClient):
    """A HumanClient that notes when each message event first became readable in its sync.

    Why: timing at the moment of recording (not when a waiting task wakes up and rescans
    every event) keeps the human's bookkeeping out of the numbers, and the lookups here
    are O(1) however many messages the run has sent. The sync long-poll is shortened to
    HUMAN_SYNC_TIMEOUT_MS (HumanClient uses 10 s) so an idle sync never lingers.
    """

    sync_timeout_ms = HUMAN_SYNC_TIMEOUT_MS

    def __init__(self, client: Any, store_dir: Path, encryption: bool) -> None:
        super().__init__(client, store_dir, encryption)
        self.seen_at: dict[str, float] = {}  # message event id -> perf_counter when readable
        self.replies: dict[str, str] = {}  # question event id -> the first reply to it
        self.edits: dict[str, list[tuple[str, str]]] = {}  # original id -> [(edit id, new body)]

    def _record(self, room_id: str, ev: Any) -> None:
        super()._record(room_id, ev)
        src = getattr(ev, "source", None)
        event_id = src.get("event_id") if isinstance(src, dict) else None
        index = self._ids.get(event_id) if isinstance(event_id, str) else None
        if index is None:
            return
        event = self.events[index]
        if event.type != "m.room.message" or event.event_id in self.seen_at:
            return  # undecryptable events are stamped once they decrypt
        self.seen_at[event.event_id] = time.perf_counter()
        if event.sender == self.user_id:
            return
        rel = event.relates_to
        if rel.get("rel_type") == "m.replace" and isinstance(rel.get("event_id"), str):
            new = event.content.get("m.new_content")
            body = new.get("body") if isinstance(new, dict) else None
            self.edits.setdefault(rel["event_id"], []).append((event.event_id, str(body)))
            return
        reply = rel.get("m.in_reply_to")
        if isinstance(reply, dict) and isinstance(reply.get("event_id"), str):
            self.replies.setdefault(reply["event_id"], event.event_id)

    def ts(self, event_id: str) -> int:
        """origin_server_ts of a recorded event (-1 if this client never saw it)."""
        index = self._ids.get(event_id)
        return self.events[index].ts if index is not None else -1

    async def answer(self, question_id: str, expected: str, timeout: float) -> Reply:  # noqa: ASYNC109
        """Until the reply to question_id (or one of its edits) reads exactly `expected`."""

        def check() -> Reply | None:
            reply_id = self.replies.get(question_id)
            if reply_id is None:
                return None
            edits = self.edits.get(reply_id, [])
            final_id: str | None = None
            if self.events[self._ids[reply_id]].body == expected:
                final_id = reply_id
            else:
                final_id = next((eid for eid, body in edits if body == expected), None)
            if final_id is None:
                return None
            ids = [eid for eid, _ in edits]
            n = ids.index(final_id) + 1 if final_id in ids else 0  # edits up to the final one
            return Reply(reply_id, final_id, self.seen_at[reply_id], self.seen_at[final_id], n)

        def what() -> str:
            reply_id = self.replies.get(question_id)
            if reply_id is None:
                return f"reply to {question_id}"
            shown = [self.events[self._ids[reply_id]].body] + [b for _, b in self.edits.get(reply_id, [])]
            return f"reply to {question_id} reading {expected!r}; saw {shown!r}"

        result: Reply = await self._wait(check, timeout, what)
        return result


@dataclass(frozen=True)
class Target:
    """One bot in its DM with the human, and what its final content must read."""

    name: str
    user_id: str
    room_id: str
    echoes: bool  # the final content is the question itself (echo) or ANSWER (vagent)


async def ask(human: BenchHuman, target: Target, text: str, timeout: float) -> Sample:  # noqa: ASYNC109
    """One message, timed from just before the send to the final content in the human's sync."""
    wall0 = time.time()
    t0 = time.perf_counter()
    question_id = await human.send(target.room_id, text)
    sent = time.perf_counter()
    try:
        r = await human.answer(question_id, text if target.echoes else ANSWER, timeout)
    except TimeoutError as exc:
        raise BenchError(f"{target.name}: {exc}") from None
    return Sample(
        first=r.first_seen - t0,
        final=r.final_seen - t0,
        send=sent - t0,
        edits=r.edits,
        wall0=wall0,
        question_ts=human.ts(question_id),
        first_ts=human.ts(r.reply_id),
        final_ts=human.ts(r.final_id),
    )


# ------------------------------------------------------------------------- the services


@dataclass
class Config:
    """Resolved options: explicit flag > --quick > default."""

    messages: int
    warmup: int
    quick: bool
    encrypted: bool
    json_path: Path
    log_level: str
    gap: float
    timeout: float
    workdir: Path | None


@dataclass
class Accounts:
    """Matrix users of the run (random passwords; the Synapse is thrown away)."""

    vagent: str
    echo: str
    human: str
    passwords: dict[str, str]


class EchoProcess:
    """bench/echo_bot.py as a subprocess; ready once it has written its ready file."""

    def __init__(self, homeserver: str, user_id: str, password: str, work: Path) -> None:
        self.homeserver, self.user_id, self.password = homeserver, user_id, password
        self.ready_file = work / "echo.ready"
        self.log_path = work / "echo.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> EchoProcess:
        """Start and wait for the first sync (then invites are joined within a sync)."""
        self.ready_file.unlink(missing_ok=True)
        argv = [
            sys.executable,
            str(ROOT / "bench" / "echo_bot.py"),
            "--homeserver",
            self.homeserver,
            "--user",
            self.user_id,
            "--ready-file",
            str(self.ready_file),
            "--sync-timeout-ms",
            str(ECHO_SYNC_TIMEOUT_MS),
            "--parent-pid",
            str(os.getpid()),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = proc = subprocess.Popen(
                argv,
                env={**os.environ, "ECHO_BOT_PASSWORD": self.password},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            if self.ready_file.exists():
                return True
            if proc.poll() is not None:
                raise BenchError(f"echo bot exited {proc.returncode}:\n{self.logs()[-2000:]}")
            return False

        if not wait_until(ready, timeout, interval=0.05):
            raise BenchError(f"echo bot not ready after {timeout} s:\n{self.logs()[-2000:]}")
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        stop_process(self.proc, 10)
        self.proc = None

    def logs(self) -> str:
        return read_log(self.log_path)


@dataclass
class Services:
    """Everything the measurement talks to or reads logs of afterwards."""

    synapse: SynapseServer
    accounts: Accounts
    bot: ServiceProcess
    graph: GraphProcess
    echo: EchoProcess


def start_redis(stack: contextlib.ExitStack, data_dir: Path) -> str:
    """A local Redis 8 (search + JSON, as the graph needs) on a free port; its URL.

    scripts/redis_local.py is imported by name on purpose: `mypy --strict` would otherwise
    type-check it too and report its `type: ignore`s, which the repository's own mypy
    configuration needs, as unused.
    """
    server = importlib.import_module("redis_local").RedisServer(free_port(), data_dir)
    stack.callback(server.stop)
    server.start()
    return str(server.url)


def register_accounts(synapse: SynapseServer) -> Accounts:
    """The two bots and the human, each with a fresh random password."""
    pw = {name: secrets.token_urlsafe(12) for name in ("vagent", "echo", "human")}
    ids = {name: synapse.register_user(name, p) for name, p in pw.items()}
    return Accounts(ids["vagent"], ids["echo"], ids["human"], {ids[n]: p for n, p in pw.items()})


def write_policy(path: Path, human: str) -> None:
    """The provider's policy: the human may use the agent in DOMAIN, and nothing more."""
    policy = {
        "superusers": [],
        "domains": {DOMAIN: {"users": {human: ["bench"]}, "roles": {"bench": ["agent:vagent"]}}},
    }
    path.write_text(yaml.safe_dump(policy))


def start_services(
    stack: contextlib.ExitStack, cfg: Config, work: Path, llm_url: str, redis_url: str
) -> Services:
    """Synapse, the provider, the graph, vagent-bot and the echo bot; each stopped by `stack`."""
    print("   starting Synapse...", flush=True)
    synapse = SynapseServer(free_port(), work / "synapse", for_tests=True)
    stack.callback(synapse.stop)
    synapse.start()
    accounts = register_accounts(synapse)

    policy = work / "policy.yaml"
    write_policy(policy, accounts.human)
    acp_port = free_port()
    acp = ServiceProcess(
        "vagent-acp",
        {
            "ACP_PORT": str(acp_port),
            "ACP_HOST": "127.0.0.1",
            "ACP_POLICY_FILE": str(policy),
            "LOG_LEVEL": cfg.log_level,
        },
        work / "acp.log",
        f"http://127.0.0.1:{acp_port}/health",
    )
    stack.callback(acp.stop)
    graph = GraphProcess(redis_url, work / "graph", llm_url, LOG_LEVEL=cfg.log_level)
    stack.callback(graph.stop)

    health_port = free_port()
    bot = ServiceProcess(
        "vagent-bot",
        {
            "MATRIX_HOMESERVER": synapse.url,
            "MATRIX_USER": accounts.vagent,
            "MATRIX_PASSWORD": accounts.passwords[accounts.vagent],
            "MATRIX_STORE_PATH": str(work / "bot-store"),
            "REDIS_URL": redis_url,
            "GRAPH_API_ENDPOINT": graph.url,
            "GRAPH_API_TOKEN": TOKEN,
            "ACCESS_CONTROL_PROVIDER_URL": f"http://127.0.0.1:{acp_port}",
            "DEFAULT_DOMAIN": DOMAIN,
            "BOT_HEALTH_HOST": "127.0.0.1",
            "BOT_HEALTH_PORT": str(health_port),
            "LOG_LEVEL": cfg.log_level,
            "FLOOD_MAX_MESSAGES": "1000000",  # the human sends far faster than a person
        },
        work / "vagent-bot.log",
        f"http://127.0.0.1:{health_port}/health",
    )
    stack.callback(bot.stop)
    echo = EchoProcess(synapse.url, accounts.echo, accounts.passwords[accounts.echo], work)
    stack.callback(echo.stop)
    # at once: the start-ups overlap; vagent-bot is healthy only once the graph answers it
    print("   starting the provider, the graph, vagent-bot and the echo bot...", flush=True)
    start_together([acp, graph, bot, echo])
    return Services(synapse, accounts, bot, graph, echo)


# --------------------------------------------------------------------------- measuring


async def measure(cfg: Config, svc: Services, work: Path) -> dict[str, BotRun]:
    """Open both DMs, warm up, then alternate the bots message by message."""
    cancel_on_sigint()
    acc = svc.accounts
    human = await BenchHuman.login(
        svc.synapse.url, acc.human, acc.passwords[acc.human], work / "human", cfg.encrypted
    )
    assert isinstance(human, BenchHuman)
    try:
        await human.start_sync()
        targets = [
            Target("echo", acc.echo, await human.create_dm(acc.echo), echoes=True),
            Target("vagent", acc.vagent, await human.create_dm(acc.vagent, encrypted=cfg.encrypted), False),
        ]
        runs = {t.name: BotRun(t.name, []) for t in targets}
        print(f"   warm-up: {cfg.warmup} messages per bot...", flush=True)
        for i in range(cfg.warmup):
            for t in targets:
                await ask(human, t, f"warm-up {i}: {QUESTION}", cfg.timeout)
                await asyncio.sleep(cfg.gap)
        print(f"   measuring: {cfg.messages} messages per bot, alternating...", flush=True)
        for i in range(cfg.messages):
            for t in targets if i % 2 == 0 else reversed(targets):  # neither bot always goes first
                runs[t.name].samples.append(await ask(human, t, f"{i}: {QUESTION}", cfg.timeout))
                await asyncio.sleep(cfg.gap)
        return runs
    finally:
        await human.close()


# ---------------------------------------------------------------- where the time goes


def log_records(path: Path, event: str) -> list[dict[str, Any]]:
    """Every JSON log line (structlog) with this `event`, plus `at`: its time in epoch seconds."""
    out: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if f'"{event}"' not in line:
                continue
            try:
                rec = json.loads(line)
                if rec.get("event") == event:
                    rec["at"] = datetime.fromisoformat(str(rec["timestamp"])).timestamp()
                    out.append(rec)
            except (ValueError, KeyError, TypeError):
                continue
    return out


def graph_run_starts(graph_log: Path) -> list[float]:
    """When the graph began each run, sorted: its `process_message` line where that is logged
    at the configured level, else its `stream_closed` line minus the `seconds` it reports."""
    starts = [r["at"] for r in log_records(graph_log, "process_message")]
    if not starts:
        for r in log_records(graph_log, "stream_closed"):
            if r.get("endpoint") == "process_message" and isinstance(r.get("seconds"), int | float):
                starts.append(r["at"] - r["seconds"])
    return sorted(starts)


def first_in(times: list[float], lo: float, hi: float) -> float:
    """The first time in [lo, hi], or NaN."""
    i = bisect.bisect_left(times, lo)
    return times[i] if i < len(times) and times[i] <= hi else math.nan


STEPS = [
    ("send_stored", "human's send -> question stored by Synapse"),
    ("bot_first", "question stored -> bot's reply stored"),
    ("to_access", "  of which: -> bot logged access_granted"),
    ("to_graph", "  of which: -> graph began the run"),
    ("to_first", "  of which: -> first reply stored"),
    ("first_to_final", "reply stored -> final edit stored"),
    ("final_seen", "final content stored -> seen by the human"),
]


def breakdown(runs: dict[str, BotRun], bot_log: Path, graph_log: Path) -> dict[str, dict[str, float]]:
    """p50 (ms) of each step of a message, on the servers' clocks (one machine, one clock).

    Synapse stamps each event (origin_server_ts, ms) when it receives it; the bot logs
    `access_granted` after sync, de-duplication, the pending-question check and the
    provider call; the graph's start of the run comes from its log (graph_run_starts).
    Messages are sequential, so each message's log lines are the first in its window.
    """
    granted = sorted(r["at"] for r in log_records(bot_log, "access_granted"))
    requested = graph_run_starts(graph_log)
    out: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        steps: dict[str, list[float]] = {k: [] for k, _ in STEPS}
        for s in run.samples:
            q, first, final = s.question_ts / 1000, s.first_ts / 1000, s.final_ts / 1000
            steps["send_stored"].append((q - s.wall0) * 1000)
            steps["bot_first"].append((first - q) * 1000)
            steps["first_to_final"].append((final - first) * 1000)
            steps["final_seen"].append((s.wall0 + s.final - final) * 1000)
            if name == "vagent":
                acc = first_in(granted, q - 0.002, first + 0.002)
                gr = first_in(requested, acc, first + 0.002) if not math.isnan(acc) else math.nan
                steps["to_access"].append((acc - q) * 1000)
                steps["to_graph"].append((gr - acc) * 1000)
                steps["to_first"].append((first - gr) * 1000)
        out[name] = {k: percentile(v, 0.5) for k, v in steps.items()}
    return out


# ------------------------------------------------------------------------------ report


def print_header(info: dict[str, Any], conf: dict[str, Any], started: datetime) -> None:
    """Machine and configuration first, so a pasted result explains itself."""
    print_machine("vagent bot benchmark", info, started)
    print(
        f"   config  : {conf['messages']} measured messages per bot after {conf['warmup']} warm-up, "
        f"sequential, the bots alternating; {conf['gap_s']:.2f} s pause after each answer"
    )
    print(
        f"             answer {conf['answer_words']} words in {conf['answer_chunks']} chunks, zero delay "
        f"(TCP_NODELAY {'set' if conf['llm_tcp_nodelay'] else 'NOT set'}); "
        f"vagent DM {'ENCRYPTED' if conf['encrypted'] else 'unencrypted'}, echo DM unencrypted"
    )
    print(
        f"             human and echo sync long-poll {conf['human_sync_timeout_ms']} ms; "
        f"services LOG_LEVEL={conf['log_level']}"
    )


def print_results(runs: dict[str, BotRun], steps: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The latency table, the ratios with the verdict, and the per-step breakdown."""
    print("\n1) Latency seen by the human: send -> reply in its sync, milliseconds")
    print(f"   {'bot':<8}{'n':>5}{'first p50':>11}{'first p99':>11}{'final p50':>11}{'final p99':>11}")
    for run in runs.values():
        f, t = run.stats("first_ms"), run.stats("final_ms")
        print(
            f"   {run.name:<8}{len(run.samples):>5}{f['p50']:>11.2f}{f['p99']:>11.2f}"
            f"{t['p50']:>11.2f}{t['p99']:>11.2f}"
        )
    edits = [s.edits for s in runs["vagent"].samples]
    print(
        f"   vagent edits per answer: median {statistics.median(edits):g} "
        f"(min {min(edits)}, max {max(edits)}); echo answers never edit (first = final)"
    )

    echo, vagent = runs["echo"], runs["vagent"]
    ratios: dict[str, Any] = {"target_final_p50": RATIO_TARGET}
    for q in ("p50", "p99"):
        for attr, name in (("final_ms", "final"), ("first_ms", "first_visible")):
            ratios[f"{name}_{q}"] = vagent.stats(attr)[q] / echo.stats(attr)[q]
    ratios["pass"] = ratios["final_p50"] <= RATIO_TARGET
    print(
        f"\n2) vagent/echo ratios (target: FINAL-edit p50 at most {RATIO_TARGET:.2f}; the rest: information)"
    )
    print(
        f"   vagent/echo p50 final-edit     {ratios['final_p50']:6.2f}x  "
        f"{verdict(ratios['final_p50'], RATIO_TARGET)}   <- the target"
    )
    print(f"   vagent/echo p50 first-visible  {ratios['first_visible_p50']:6.2f}x  (information)")
    print(
        f"   vagent/echo p99 final-edit     {ratios['final_p99']:6.2f}x   "
        f"first-visible {ratios['first_visible_p99']:.2f}x  (information)"
    )

    print("\n3) Where the time goes: p50 of each step, ms, on the servers' clock (one machine)")
    print(f"   {'step':<46}{'echo':>9}{'vagent':>9}")
    for key, label in STEPS:
        cells = [steps[b].get(key, math.nan) for b in ("echo", "vagent")]
        print(f"   {label:<46}" + "".join(f"{'-' if math.isnan(c) else f'{c:.1f}':>9}" for c in cells))
    print("   (p50s of steps do not add up to the p50 of the total; Synapse's clock has 1 ms steps)")
    return ratios


# -------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> Config:
    """Command line -> Config; counts must be positive."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--messages", type=int, help=f"measured messages per bot (default {d['messages']})")
    p.add_argument("--warmup", type=int, help=f"unmeasured messages per bot first (default {d['warmup']})")
    p.add_argument("--quick", action="store_true", help="tiny numbers for a smoke test: " + str(QUICK))
    p.add_argument("--encrypted", action="store_true", help="E2EE DM with the vagent bot (echo stays clear)")
    p.add_argument("--json", type=Path, help="results file (default bench/results/bot-<timestamp>.json)")
    p.add_argument("--log-level", default="INFO", help="LOG_LEVEL of bot, graph, provider (default INFO)")
    p.add_argument("--gap", type=float, default=0.1, help="pause after each answer, s (default 0.1)")
    p.add_argument("--timeout", type=float, default=30.0, help="max wait for one answer, s (default 30)")
    p.add_argument("--workdir", type=Path, help="keep data and service logs here instead of a temp dir")
    a = p.parse_args(argv)
    vals = resolve_counts(a, DEFAULTS, QUICK)
    if vals["messages"] < 1 or vals["warmup"] < 0:
        p.error("--messages must be positive and --warmup not negative")
    if a.gap < 0 or a.timeout <= 0:
        p.error("--gap must not be negative and --timeout must be positive")
    return Config(
        **vals,
        quick=a.quick,
        encrypted=a.encrypted,
        json_path=a.json or default_results_path("bot"),
        log_level=a.log_level,
        gap=a.gap,
        timeout=a.timeout,
        workdir=a.workdir,
    )


def run(cfg: Config) -> dict[str, Any]:
    """Start everything, measure, tear everything down (ExitStack: also on Ctrl-C)."""
    info = machine_info(VERSIONS_OF)
    started = datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        llm_url, nodelay = stack.enter_context(llm_standin())  # first: it forks
        if cfg.workdir is not None:
            work = cfg.workdir.resolve()
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-bot-")))
        conf = {
            "messages": cfg.messages,
            "warmup": cfg.warmup,
            "quick": cfg.quick,
            "encrypted": cfg.encrypted,
            "gap_s": cfg.gap,
            "answer_words": len(ANSWER.split()),
            "answer_chunks": CHUNKS,
            "llm_tcp_nodelay": nodelay,
            "log_level": cfg.log_level,
            "human_sync_timeout_ms": HUMAN_SYNC_TIMEOUT_MS,
            "echo_sync_timeout_ms": ECHO_SYNC_TIMEOUT_MS,
            "flood_max_messages": 1_000_000,
            "workdir": str(work) if cfg.workdir else None,
        }
        print_header(info, conf, started)
        svc = start_services(stack, cfg, work, llm_url, start_redis(stack, work / "redis"))
        try:
            runs = asyncio.run(measure(cfg, svc, work))
        except Exception:
            if not INTERRUPTED.is_set():
                for name, text in (("vagent-bot", svc.bot.logs()), ("echo bot", svc.echo.logs())):
                    print_log_tail(name, text, 20)
            raise
        steps = breakdown(runs, svc.bot.log_path, svc.graph.log_path)
        ratios = print_results(runs, steps)
    return make_results(
        started,
        info,
        conf,
        bots={name: r.to_json() for name, r in runs.items()},
        ratios=ratios,
        breakdown_p50_ms=steps,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 after a complete run, MISS or not; 130 on Ctrl-C, 1 when a run fails."""
    cfg = parse_args(argv)
    return run_main(lambda: run(cfg), cfg.json_path)


if __name__ == "__main__":
    sys.exit(main())
