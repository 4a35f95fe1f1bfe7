"""bench_memory's headline phase: what memory recall adds to REAL turns through the graph.

Why real turns: recall runs inside a turn (the question's embedding may start when the
message arrives, overlap the session lock and the checkpoint load, and be batched with
other conversations' questions); only the graph service itself shows what that costs a
user, at a model's real pace (bench_capacity's paced stand-in).

Two ``vagent-graph`` processes on the filled Redis and the same paced stand-in, identical
but for the descriptor's ``memory:`` block: ON (enabled, recall_k 5, max_per_user 200,
ttl_days 365) and OFF (``enabled: false``: no tool, no recall, no Redis read). Conversations
of filled users, each with its own session on each graph (the same history length in both
modes), half DMs, half group rooms whose one other reader heard ~30% of the owner's
memories. The modes alternate by block (which one goes first alternates too), so host
noise hits both; only one graph gets traffic at a time. Each turn is measured from the
client: time to the first text chunk (recall runs before the model call) and to ``done``.

Also here: who the bench users are (the fill writes their memories, the turns ask as them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from redis.asyncio import Redis

from bench.bench_capacity import Turn, cpu_seconds, graph_client, one_turn, paced_standin, rss_mb
from bench.common import (
    INTERRUPTED,
    BenchError,
    cancel_on_sigint,
    print_log_tail,
    start_together,
    stop_together,
    summary,
    verdict,
)
from tests.support.factories import ALL_TOOLS, ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from vagent_bot.clients.graph_client import GraphClient
from vagent_shared.access import AcContext
from vagent_shared.audit import AuditEvent
from vagent_shared.knowledge import Audience, AudienceMember
from vagent_shared.session import SessionId
from vagent_shared.wire import ProcessMessageRequest

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "bench"
#: What each bench user may use: the packaged agent's usual tools and `remember`.
GRANTS = [*ALL_TOOLS, "tool:remember"]
AGENT_YAML = ROOT / "graph" / "src" / "vagent_graph" / "agents" / "vagent.yaml"
MEMORY_ON: dict[str, Any] = {"enabled": True, "recall_k": 5, "max_per_user": 200, "ttl_days": 365}
MEMORY_OFF: dict[str, Any] = {"enabled": False}
MODES = ("on", "off")
#: Measured turns per conversation before the modes swap.
BLOCK = 5
TARGET_P50_MS, TARGET_P99_MS = 10.0, 30.0
#: The graph's recall histogram (vagent_graph/observability/metrics.py MEMORY_RECALL_SECONDS): one
#: observation per recall, with or without memories found.
RECALL_HISTOGRAM = "vagent_graph_memory_recall_seconds"
#: Each graph's own audit stream, so its memory_* records are told apart.
AUDIT_STREAM = "bench:audit:{mode}"
START_TIMEOUT_S = 150.0

OPENERS = [
    "",
    "",
    "Quick question: ",
    "Before my next meeting: ",
    "Hi! ",
    "One more thing. ",
    "Sorry, again: ",
]
QUESTION_TEMPLATES = [
    "What do I usually drink in the {part}?",
    "Which language should you answer me in when I write about {topic}?",
    "Where would I like to travel once {topic} is done?",
    "What is my team working on besides {topic}?",
    "Is there anything I cannot eat at the {topic} lunch?",
    "When is the {topic} review again?",
    "What does my manager care about regarding {topic}?",
    "Can you book something for my trip to {city} {when}?",
    "Remind me what I said about {topic} {when}.",
    "Which city did I say I like more than {city}?",
    "Should I bring coffee or tea to the {topic} workshop {when}?",
]
CLOSERS = ["", "", " Thanks.", " Keep it short, please.", " I forgot."]
TOPICS = ["the budget", "security", "the databases", "hiring", "the migration", "onboarding", "pricing"]
CITIES = ["Lisbon", "York", "Berlin", "Oslo", "Porto", "Vienna"]
WHENS = ["next week", "on Friday", "tomorrow", "this month", "after the holidays", "in spring"]
PARTS = ["morning", "afternoon", "evening"]


def user_id(n: int) -> str:
    return f"@mem{n:05d}:bench"


def other_of(n: int) -> str:
    """The one other reader of user n's group room."""
    return f"@peer{n:05d}:bench"


def owner_of(memory_id: str) -> str:
    """The filled memory's owner, from its id (`m<owner n>-<i>`); '' for any other id."""
    head = memory_id.split("-", 1)[0]
    return user_id(int(head[1:])) if head[:1] == "m" and head[1:].isdigit() else ""


def bench_ac(user: str) -> AcContext:
    return ac(user, GRANTS, domain=DOMAIN)


def audience_of(n: int, group: bool) -> Audience | None:
    """Who else reads user n's conversation: nobody in a DM; in the group room the one
    other member who heard the group memories (the bot counts itself and the sender too)."""
    if not group:
        return None
    peer = other_of(n)
    return Audience(members=[AudienceMember(user_id=peer, ac_context=bench_ac(peer))], member_count=3)


def questions(rng: random.Random, count: int) -> list[str]:
    """`count` different natural questions (an embedding cache must not hide the cost)."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        q = rng.choice(QUESTION_TEMPLATES).format(
            part=rng.choice(PARTS), topic=rng.choice(TOPICS), city=rng.choice(CITIES), when=rng.choice(WHENS)
        )
        text = f"{rng.choice(OPENERS)}{q}{rng.choice(CLOSERS)}"
        if text in seen:  # the combinations ran out: number it
            text = f"{text} ({len(out)})"
        seen.add(text)
        out.append(text)
    return out


@dataclass
class Conversation:
    """One filled user's conversation: a session on each graph, the same questions on both."""

    n: int
    group: bool
    sessions: dict[str, SessionId]
    questions: list[str]

    def request(self, mode: str, turn: int) -> ProcessMessageRequest:
        session = self.sessions[mode]
        body = message_body(session, self.questions[turn], bench_ac(user_id(self.n)))
        req = ProcessMessageRequest.model_validate(body)
        return req.model_copy(update={"audience": audience_of(self.n, self.group)})


def conversations(count: int, users: int, turns: int, seed: int = 31) -> list[Conversation]:
    """`count` conversations of different filled users, odd ones in a group room; every
    question asked once per graph and never twice in a conversation or across them."""
    if count > users:
        raise BenchError(f"--conversations {count} needs at least as many --users ({users})")
    rng = random.Random(seed)
    owners = rng.sample(range(users), count)
    asked = questions(rng, count * turns)
    return [
        Conversation(
            n,
            group=i % 2 == 1,
            sessions={mode: new_session(user=user_id(n)) for mode in MODES},
            questions=asked[i * turns : (i + 1) * turns],
        )
        for i, n in enumerate(owners)
    ]


# ------------------------------------------------------------------------- the services


def write_descriptor(tmp: Path, mode: str) -> Path:
    """The packaged agent with memory ON or OFF: nothing else differs."""
    descriptor = yaml.safe_load(AGENT_YAML.read_text(encoding="utf-8"))
    descriptor["memory"] = MEMORY_ON if mode == "on" else MEMORY_OFF
    path = tmp / f"agent-memory-{mode}.yaml"
    path.write_text(yaml.safe_dump(descriptor, sort_keys=False), encoding="utf-8")
    return path


def recall_totals(service: GraphProcess) -> tuple[float, float]:
    """How many recalls the graph has made, and their seconds in all (its /metrics)."""
    r = httpx.get(f"{service.url}/metrics", headers=service.headers, timeout=10)
    r.raise_for_status()
    found = {"count": 0.0, "sum": 0.0}
    for line in r.text.splitlines():
        name, _, value = line.partition(" ")
        if name.removeprefix(RECALL_HISTOGRAM + "_") in found and name.startswith(RECALL_HISTOGRAM):
            found[name.removeprefix(RECALL_HISTOGRAM + "_")] = float(value)
    return found["count"], found["sum"]


async def audit_memory_records(redis_url: str, stream: str) -> dict[str, Any]:
    """The memory_* audit records of one graph: recalls, memories recalled, and how many of
    them belonged to someone other than the asker (must be 0), withheld by reason."""
    redis = Redis.from_url(redis_url)
    try:
        entries = await redis.xrange(stream) or []
    finally:
        await redis.aclose()
    found: dict[str, Any] = {"records": 0, "recalled": 0, "memories": 0, "foreign": 0, "withheld": {}}
    for _id, fields in entries:
        event = AuditEvent.from_stream(fields or {})
        if not event.event_type.startswith("memory_"):
            continue
        found["records"] += 1
        if event.event_type == "memory_recalled":
            ids = [str(i) for i in event.metadata.get("ids", [])]
            found["recalled"] += 1
            found["memories"] += len(ids)
            found["foreign"] += sum(owner_of(i) != event.user_id for i in ids)
        elif event.event_type == "memory_withheld":
            reason = str(event.metadata.get("reason", "?"))
            found["withheld"][reason] = found["withheld"].get(reason, 0) + int(event.metadata.get("count", 0))
    return found


# ------------------------------------------------------------------------------ the turns


async def run_block(
    client: GraphClient, convs: list[Conversation], mode: str, turns: range, turn_s: float, seed: int
) -> list[Turn]:
    """Every conversation's `turns` on one graph: each starts at a moment within one turn's
    time (the same moments for both modes: a smooth arrival, not a burst), then asks them
    back to back."""
    rng = random.Random(seed)
    delays = [rng.uniform(0, turn_s) for _ in convs]
    out: list[Turn] = []
    loop_start = time.perf_counter()

    async def conversation(i: int, conv: Conversation) -> None:
        await asyncio.sleep(delays[i])
        for t in turns:
            turn = Turn(i, False, 0.0)
            await one_turn(client, conv.request(mode, t), turn, loop_start)
            out.append(turn)

    await asyncio.gather(*(conversation(i, c) for i, c in enumerate(convs)))
    return out


async def drive(
    services: dict[str, GraphProcess], convs: list[Conversation], conf: dict[str, Any], redis_pid: int
) -> dict[str, Any]:
    """Warm-up turns on each graph, then the measured blocks, alternating; per mode the turns,
    the CPU seconds of the graph, of Redis and of these clients while it had traffic, and the
    recalls each graph made."""
    cancel_on_sigint()
    turn_s = (conf["ttft_ms"] + conf["chunks"] * conf["chunk_ms"]) / 1000
    warm, total = conf["warmup"], conf["warmup"] + conf["turns"]
    pids = {mode: s.proc.pid for mode, s in services.items() if s.proc is not None}
    turns: dict[str, list[Turn]] = {mode: [] for mode in MODES}
    cpu = {mode: {"graph": 0.0, "loop": 0.0, "redis": 0.0, "client": 0.0, "wall": 0.0} for mode in MODES}
    async with contextlib.AsyncExitStack() as stack:
        clients = {mode: await stack.enter_async_context(graph_client(services[mode].url)) for mode in MODES}
        for mode in MODES:
            warmed = await run_block(clients[mode], convs, mode, range(warm), turn_s, seed=0)
            if bad := [t.error for t in warmed if t.error]:
                raise BenchError(
                    f"warm-up turns on the memory-{mode.upper()} graph failed: {sorted(set(bad))[:3]}"
                )
        recalls0 = {mode: await asyncio.to_thread(recall_totals, services[mode]) for mode in MODES}
        rss0 = {mode: rss_mb(pids[mode]) for mode in MODES}
        for b, start in enumerate(range(warm, total, BLOCK)):
            block = range(start, min(start + BLOCK, total))
            for mode in MODES if b % 2 == 0 else MODES[::-1]:
                before = readings(pids[mode], redis_pid)
                turns[mode] += await run_block(clients[mode], convs, mode, block, turn_s, seed=b + 1)
                for what, value in readings(pids[mode], redis_pid).items():
                    cpu[mode][what] += value - before[what]
        recalls = {}
        for mode in MODES:
            count, seconds = await asyncio.to_thread(recall_totals, services[mode])
            recalls[mode] = (count - recalls0[mode][0], seconds - recalls0[mode][1])
    return {
        "turns": turns,
        "cpu": cpu,
        "recalls": recalls,
        "rss0": rss0,
        "rss": {m: rss_mb(pids[m]) for m in MODES},
    }


def readings(graph_pid: int, redis_pid: int) -> dict[str, float]:
    """CPU seconds so far of the graph (all its threads, and its main thread alone: the
    event loop), of Redis and of this process (the clients); and the wall clock."""
    return {
        "graph": cpu_seconds(graph_pid),
        "loop": thread_cpu_seconds(graph_pid, graph_pid),
        "redis": cpu_seconds(redis_pid),
        "client": sum(os.times()[:2]),
        "wall": time.perf_counter(),
    }


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """utime + stime of one thread of `pid` (its main thread: tid == pid)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def figures_of(
    turns: list[Turn], cpu: dict[str, float], rss0: float, rss: float, recalls: tuple[float, float]
) -> dict[str, Any]:
    ok = [t for t in turns if not t.error]
    errors = [t.error for t in turns if t.error]
    n = max(1, len(turns))
    return {
        "turns": len(turns),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "ttft_ms": summary([t.first * 1000 for t in ok]),
        "turn_ms": summary([t.end * 1000 for t in ok]),
        "cpu_s_per_turn": cpu["graph"] / n,
        #: the event loop's thread; the rest is other threads (the embedding's, onnxruntime's)
        "loop_cpu_s_per_turn": cpu["loop"] / n,
        #: the event loop's share of one core while the mode had traffic (near 1: saturated)
        "loop_busy": cpu["loop"] / cpu["wall"] if cpu["wall"] else 0.0,
        "redis_cpu_s_per_turn": cpu["redis"] / n,
        "client_cpu_s_per_turn": cpu["client"] / n,
        "rss_mb_after_warmup": rss0,
        "rss_mb_at_end": rss,
        "recalls": recalls[0],
        "recall_mean_ms": recalls[1] / recalls[0] * 1000 if recalls[0] else 0.0,
    }


def graph_turns(redis_url: str, redis_pid: int, tmp: Path, conf: dict[str, Any]) -> dict[str, Any]:
    """The phase: the paced stand-in and both graphs started, the turns driven, everything
    stopped (also on an error or Ctrl-C); the figures, checked for a real recall on ON."""
    convs = conversations(conf["conversations"], conf["users"], conf["warmup"] + conf["turns"])
    with contextlib.ExitStack() as stack:
        llm_url, _ = stack.enter_context(paced_standin(conf["ttft_ms"], conf["chunk_ms"], conf["chunks"]))
        services = {
            mode: GraphProcess(
                redis_url,
                tmp / f"graph-{mode}",
                llm_url,
                LOG_LEVEL="INFO",
                AGENT_DESCRIPTOR=str(write_descriptor(tmp, mode)),
                AUDIT_STREAM=AUDIT_STREAM.format(mode=mode),
            )
            for mode in MODES
        }
        for s in services.values():
            s.data_dir.mkdir(parents=True, exist_ok=True)
        stack.callback(stop_together, list(services.values()))
        start_together(list(services.values()), START_TIMEOUT_S)
        try:
            run = asyncio.run(drive(services, convs, conf, redis_pid))
        except Exception:
            if not INTERRUPTED.is_set():
                for mode, s in services.items():
                    print_log_tail(f"memory-{mode.upper()} graph", s.logs(), 20)
            raise
        logs = {mode: s.logs() for mode, s in services.items()}
        stop_together(list(services.values()))  # their audit trails flushed
    audits = {
        mode: asyncio.run(audit_memory_records(redis_url, AUDIT_STREAM.format(mode=mode))) for mode in MODES
    }
    modes = {
        mode: figures_of(
            run["turns"][mode], run["cpu"][mode], run["rss0"][mode], run["rss"][mode], run["recalls"][mode]
        )
        | {"audit": audits[mode]}
        for mode in MODES
    }
    measured = modes["on"]["turns"] - modes["on"]["errors"]
    if modes["on"]["recalls"] < 0.9 * measured or not modes["on"]["audit"]["recalled"]:
        for mode in MODES:
            print_log_tail(f"memory-{mode.upper()} graph", logs[mode], 20)
        raise BenchError(
            f"the memory-ON graph recalled {modes['on']['recalls']:.0f} times in {measured} turns "
            f"({modes['on']['audit']['recalled']} memory_recalled records): the bench measured no recall"
        )
    if modes["off"]["recalls"] or modes["off"]["audit"]["records"]:
        raise BenchError(f"the memory-OFF graph touched memory: {modes['off']}")
    on, off = modes["on"], modes["off"]
    return {
        "conversations": len(convs),
        "dm_conversations": sum(not c.group for c in convs),
        "modes": modes,
        "added_ms": {q: on["turn_ms"][q] - off["turn_ms"][q] for q in ("p50", "p99")},
        "added_ttft_ms": {q: on["ttft_ms"][q] - off["ttft_ms"][q] for q in ("p50", "p99")},
        "added_cpu_ms_per_turn": (on["cpu_s_per_turn"] - off["cpu_s_per_turn"]) * 1000,
        "added_redis_cpu_ms_per_turn": (on["redis_cpu_s_per_turn"] - off["redis_cpu_s_per_turn"]) * 1000,
        "errors": on["errors"] + off["errors"],
        "foreign_memories": on["audit"]["foreign"],
    }


def passed(g: dict[str, Any]) -> dict[str, bool]:
    """The verdict: the whole turn's added p50/p99 within the targets, and no error."""
    clean = g["errors"] == 0 and g["foreign_memories"] == 0
    return {
        "p50": clean and g["added_ms"]["p50"] <= TARGET_P50_MS,
        "p99": clean and g["added_ms"]["p99"] <= TARGET_P99_MS,
    }


def print_graph_turns(g: dict[str, Any], conf: dict[str, Any]) -> None:
    on, off = g["modes"]["on"], g["modes"]["off"]
    turn_s = (conf["ttft_ms"] + conf["chunks"] * conf["chunk_ms"]) / 1000
    print(
        f"\nturns through the graph (headline): {g['conversations']} concurrent conversations "
        f"({g['dm_conversations']} DMs, the others group rooms with one other reader), "
        f"{conf['turns']} measured turns each per mode after {conf['warmup']} warm-up; paced model: "
        f"TTFT {conf['ttft_ms']} ms + {conf['chunks']} x {conf['chunk_ms']} ms = {turn_s:.1f} s; "
        f"memory ON vs OFF alternating by blocks of {BLOCK}"
    )
    for q, target in (("p50", TARGET_P50_MS), ("p99", TARGET_P99_MS)):
        added = g["added_ms"][q]
        print(
            f"   turn {q}: OFF {off['turn_ms'][q]:8.1f} ms, ON {on['turn_ms'][q]:8.1f} ms: "
            f"added {added:6.1f} ms  {verdict(added, target) if g['errors'] == 0 else 'MISS (errors)'} "
            f"(target <= {target:.0f} ms)"
        )
    for q in ("p50", "p99"):
        print(
            f"   first text {q}: OFF {off['ttft_ms'][q]:7.1f} ms, ON {on['ttft_ms'][q]:7.1f} ms: "
            f"added {g['added_ttft_ms'][q]:6.1f} ms"
        )
    print(
        f"   recalls on ON: {on['recalls']:.0f} (expected {on['turns']} turns), "
        f"on OFF: {off['recalls']:.0f}; recall inside the ON graph: mean {on['recall_mean_ms']:.1f} ms; "
        f"audit (warm-up included): {on['audit']['recalled']} memory_recalled, "
        f"{on['audit']['memories'] / max(1, on['audit']['recalled']):.1f} memories each, "
        f"withheld {on['audit']['withheld'] or 0}; another user's: {g['foreign_memories']}"
    )
    print(
        f"   graph CPU per turn: OFF {off['cpu_s_per_turn'] * 1000:.1f} ms, "
        f"ON {on['cpu_s_per_turn'] * 1000:.1f} ms (memory adds {g['added_cpu_ms_per_turn']:.1f} ms); "
        f"RSS OFF {off['rss_mb_after_warmup']:.0f} -> {off['rss_mb_at_end']:.0f} MiB, "
        f"ON {on['rss_mb_after_warmup']:.0f} -> {on['rss_mb_at_end']:.0f} MiB"
    )
    print(
        f"   of which the event loop: OFF {off['loop_cpu_s_per_turn'] * 1000:.1f} ms "
        f"({off['loop_busy']:.0%} of a core busy), ON {on['loop_cpu_s_per_turn'] * 1000:.1f} ms "
        f"({on['loop_busy']:.0%}); other threads (embedding): "
        f"OFF {(off['cpu_s_per_turn'] - off['loop_cpu_s_per_turn']) * 1000:.1f} ms, "
        f"ON {(on['cpu_s_per_turn'] - on['loop_cpu_s_per_turn']) * 1000:.1f} ms"
    )
    print(
        f"   Redis CPU per turn: OFF {off['redis_cpu_s_per_turn'] * 1000:.1f} ms, "
        f"ON {on['redis_cpu_s_per_turn'] * 1000:.1f} ms "
        f"(memory adds {g['added_redis_cpu_ms_per_turn']:.1f} ms); "
        f"the clients (this process): OFF {off['client_cpu_s_per_turn'] * 1000:.1f} ms, "
        f"ON {on['client_cpu_s_per_turn'] * 1000:.1f} ms"
    )
    print(f"   errors: ON {on['errors']}/{on['turns']}, OFF {off['errors']}/{off['turns']} turns")
    for mode, m in (("ON", on), ("OFF", off)):
        for e in m["error_samples"]:
            print(f"      {mode}: {e}")
