"""Scheduled tasks under random bot kills (issue 32, "Done when"): every due run exactly once,
none after its job was deleted.

A bot of its own (the session's is stopped) runs several recurring jobs (every 2-3 s: the store
takes any interval; the minimum is the command's and the tool's) and one-offs made as it goes,
some of them deleted before they are due, while the bot is SIGKILLed at random moments and
started again. Jobs are deleted mid-soak and at the end.

What counts as a run is what Redis says: each due run's marker `schedule_run(run_id)` (claimed,
started, ran, failed, skipped, missed, cancelled). The Matrix side must agree, matched by the
run's identity, not by text or time: the bot sends a run's messages under transaction ids
derived from its run id (`matrix.handling(run_id)`), and the homeserver shows a message's
transaction id to the device that sent it, so the ⏰ lines are read with the bot's own login.
Then: no run id posts twice; every "ran" run has exactly one ⏰ line and one answer replying to
it; a run "started" by a bot that was killed (never repeated: at most once) or "failed" has at
most one; nothing else has any; no ⏰ line is without a marker; no job has a run due after it
was deleted; a recurring job skips occurrences only when no bot could claim them (one late run
for them, never a burst); model calls per job lie between its "ran" runs and its ⏰ lines.

`make test` runs a short version (~36 due runs, a few kills); `make soak-schedules` (marker
`soak`) runs SOAK_SCHEDULE_RUNS (200) and prints the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from redis.asyncio import Redis

from tests.e2e.conftest import Login, Stack
from tests.e2e.test_bot_e2e import group
from tests.e2e.test_faults_e2e import main_bot_down, streamed_echo  # noqa: F401 (a fixture)
from tests.e2e.test_schedules_e2e import in_seconds, schedule
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from tests.support.procs import ServiceProcess
from vagent_bot.matrix.client import CREDENTIALS_FILE
from vagent_shared import redis_keys
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedules import SCHEDULED, Schedule, ScheduledJob

pytestmark = pytest.mark.e2e

#: One-offs later than this after their time are missed (their owner told), not run: short, so
#: one-offs due while the bot is down show the missed-run policy too.
GRACE_SECONDS = 3
#: The scheduler's lease (vagent_bot.schedules.scheduler.LEASE_SECONDS): a run claimed by a killed bot
#: and not started is taken over after it.
LEASE_SECONDS = 30.0
#: Seconds between two kills (a seeded uniform draw). A restart takes ~10 s on a slow machine.
KILL_EVERY = (5.0, 12.0)
#: After a restart is healthy, how long until its scheduler claims (the first sync comes first).
RESTART_MARGIN = 10.0
#: Outcomes of runs that were started: only these may have posted a ⏰ line.
POSTING = {"ran", "failed", "started"}


@dataclass
class Job:
    job: ScheduledJob
    every: int | None  # seconds; None for a one-off
    deleted_at: float | None = None  # epoch seconds


@dataclass
class Line:
    """A message of the bot as the homeserver has it, with its transaction id (the bot's own
    view)."""

    event_id: str
    room_id: str
    body: str
    ts: float  # epoch seconds
    txn_id: str | None
    thread_root: str | None = None


@dataclass
class Soak:
    jobs: list[Job] = field(default_factory=list)
    downtimes: list[tuple[float, float]] = field(default_factory=list)  # (killed, healthy again)
    began: float = 0.0

    @property
    def kills(self) -> int:
        return len(self.downtimes)


def txn_base(run_id: str) -> str:
    """The transaction id prefix `matrix.handling(run_id)` gives a run's messages."""
    return f"vagent.{hashlib.sha256(run_id.encode()).hexdigest()[:32]}"


def claimant_pid(marker: str) -> int | None:
    """The pid in a `claimed:`/`started:` marker's claimant (`host:pid:random`)."""
    parts = marker.split(":")
    return int(parts[-2]) if len(parts) >= 4 and parts[-2].isdigit() else None


def due_of(run_id: str) -> int:
    return int(run_id.rpartition("@")[2])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def markers(redis: Redis, jobs: list[Job]) -> dict[str, str]:
    """Every run marker of the soak's jobs: run id -> state."""
    ids = {j.job.id for j in jobs}
    prefix = redis_keys.schedule_run("")
    keys = [
        k
        async for k in redis.scan_iter(match=redis_keys.glob_escape(prefix) + "*", count=1000)
        if _text(k).removeprefix(prefix).rpartition("@")[0] in ids
    ]
    values: list[Any] = await redis.mget(keys) if keys else []
    return {
        _text(k).removeprefix(prefix): _text(v) for k, v in zip(keys, values, strict=True) if v is not None
    }


async def bot_messages(stack: Stack, store_dir: Path, rooms: list[str]) -> list[Line]:
    """The bot's messages in `rooms` (latest edits applied), read with the bot's own access
    token: its device sees the transaction ids it sent them under."""
    token = json.loads((store_dir / CREDENTIALS_FILE).read_text())["access_token"]
    events: list[dict[str, Any]] = []
    async with httpx.AsyncClient(
        base_url=stack.synapse.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as http:
        for room in rooms:
            since: str | None = None
            while True:
                params: dict[str, str | int] = {"dir": "f", "limit": 500}
                if since:
                    params["from"] = since
                r = await http.get(f"/_matrix/client/v3/rooms/{quote(room)}/messages", params=params)
                r.raise_for_status()
                page = r.json()
                events += [
                    {**ev, "room_id": room}
                    for ev in page.get("chunk", [])
                    if ev.get("sender") == stack.users.bot and ev.get("type") == "m.room.message"
                ]
                since = page.get("end")
                if not page.get("chunk") or not since:
                    break
    edits: dict[str, str] = {}
    for ev in events:  # timeline order: the last edit wins
        rel = ev["content"].get("m.relates_to", {})
        if rel.get("rel_type") == "m.replace":
            edits[rel["event_id"]] = str(ev["content"].get("m.new_content", {}).get("body", ""))
    lines: list[Line] = []
    for ev in events:
        rel = ev["content"].get("m.relates_to", {})
        if rel.get("rel_type") == "m.replace":
            continue
        body = edits.get(ev["event_id"], str(ev["content"].get("body", "")))
        root = rel.get("event_id") if rel.get("rel_type") == "m.thread" else None
        txn = ev.get("unsigned", {}).get("transaction_id")
        lines.append(Line(ev["event_id"], ev["room_id"], body, ev["origin_server_ts"] / 1000, txn, root))
    return lines


async def kill_at_random(bot: ServiceProcess, rng: random.Random, stop: asyncio.Event, soak: Soak) -> None:
    """SIGKILL the bot every few seconds (a seeded draw), start it again at once; records when
    it was down. Leaves it running."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(*KILL_EVERY))
        if stop.is_set():
            return
        killed = time.time()
        bot.kill()
        await asyncio.to_thread(bot.start)
        soak.downtimes.append((killed, time.time()))


def asked(llm: ScriptedLLMServer, task: str) -> int:
    """Model calls whose last user message is exactly the task."""
    count = 0
    for request in llm.requests:
        users = [m for m in request["messages"] if m["role"] == "user"]
        if users and str(users[-1].get("content")) == task:
            count += 1
    return count


async def schedule_soak(
    stack: Stack, humans: Login, llm: ScriptedLLMServer, runs: int, seed: int
) -> dict[str, Any]:
    """Runs jobs until `runs` due runs were decided, killing the bot at random; checks Redis
    and Matrix agree as the module says; returns the summary."""
    u = stack.users
    alice, bob = await humans(u.alice), await humans(u.bob)
    llm.set_default(streamed_echo)  # an answer in pieces: a kill can land mid-answer
    rng = random.Random(seed)
    soak = Soak()
    tag = uuid.uuid4().hex[:6]
    redis = Redis.from_url(stack.redis_url)
    store = ScheduleStore(redis)
    name = f"schedsoak{tag}"
    store_dir = stack.tmp / f"{name}-store"
    try:
        with stack.another_bot(name, SCHEDULE_GRACE_SECONDS=str(GRACE_SECONDS)) as bot:
            rooms = [await group(alice, stack, f"soak {tag} {i}") for i in range(2)]
            soak.began = time.time()
            made = 0

            async def make(owner: HumanClient, every: int | None, after: float) -> Job:
                nonlocal made
                made += 1
                room = rooms[made % 2]
                task = f"soak {tag} job {made} {'every ' + str(every) + 's' if every else 'once'}"
                first = in_seconds(after)
                if every:
                    first = first.replace(microsecond=0)
                    how = Schedule(kind="every", every_seconds=every, anchor=first, text=f"every {every}s")
                else:
                    how = Schedule(kind="at", at=first)
                job = Job(await schedule(store, owner.user_id, room, task, how, first), every)
                soak.jobs.append(job)
                return job

            async def delete(job: Job) -> None:
                job.deleted_at = time.time()
                assert await store.delete(job.job.owner, job.job.number) is not None

            recurring = [await make((alice, bob)[i % 2], 2 + i % 2, 1.5) for i in range(5)]
            stop = asyncio.Event()
            kills = asyncio.create_task(kill_at_random(bot, rng, stop, soak))
            deletions = {runs // 3: recurring[0], (2 * runs) // 3: recurring[1]}
            try:
                while (decided := len(await markers(redis, soak.jobs))) < runs:
                    for at in [k for k in deletions if decided >= k]:
                        await delete(deletions.pop(at))  # mid-soak: nothing of it runs after
                    if rng.random() < 0.5:
                        one_off = await make((alice, bob)[made % 2], None, rng.uniform(1.0, 5.0))
                        if rng.random() < 0.2:  # deleted before it is due: it never runs
                            await asyncio.sleep(rng.uniform(0.0, 0.5))
                            await delete(one_off)
                    await asyncio.sleep(rng.uniform(0.5, 1.5))
            finally:
                stop.set()
                await kills
            for job in soak.jobs:  # the end: every recurring job deleted, one-offs run out
                if job.every and job.deleted_at is None:
                    await delete(job)
            soak_seconds = time.time() - soak.began
            # settle: runs claimed by a killed bot are taken over (or cancelled) once their lease
            # ran out; runs started by the live bot finish; one-offs still ahead come due
            live = bot.proc.pid if bot.proc else None
            waiting = [j.job.id for j in soak.jobs if j.every is None and j.deleted_at is None]
            deadline = time.monotonic() + LEASE_SECONDS + 60
            while True:
                state = await markers(redis, soak.jobs)
                pending = [
                    r
                    for r, m in state.items()
                    if m.startswith("claimed:") or (m.startswith("started:") and claimant_pid(m) == live)
                ]
                have = {r.rpartition("@")[0] for r in state}
                pending += [f"{j}@?" for j in waiting if j not in have]
                if not pending:
                    break
                assert time.monotonic() < deadline, f"runs never settled: {pending}"
                await asyncio.sleep(0.5)
            await asyncio.sleep(3)  # a late second ⏰ line or answer would show by now
            messages = await bot_messages(stack, store_dir, rooms)
            state = await markers(redis, soak.jobs)
            return check(soak, state, messages, llm, live, soak_seconds)
    finally:
        await redis.aclose()


def check(
    soak: Soak,
    state: dict[str, str],
    messages: list[Line],
    llm: ScriptedLLMServer,
    live_pid: int | None,
    soak_seconds: float,
) -> dict[str, Any]:
    """Redis and Matrix agree, run by run (see the module); returns the summary."""
    by_id = {j.job.id: j for j in soak.jobs}
    by_txn = {txn_base(r): r for r in state}
    problems: list[str] = []
    lines_of: dict[str, list[Line]] = {}
    for line in messages:
        if not line.body.startswith(SCHEDULED):
            continue
        base = (line.txn_id or "").rpartition(".")[0]
        run = by_txn.get(base)
        if run is None:
            problems.append(f"a ⏰ line without a marker: {line.event_id} txn={line.txn_id} {line.body!r}")
            continue
        lines_of.setdefault(run, []).append(line)
        if line.body != SCHEDULED + by_id[run.rpartition("@")[0]].job.task:
            problems.append(f"run {run}: ⏰ line of another job's task: {line.body!r}")
    in_thread: dict[str, list[str]] = {}
    for m in messages:
        if m.thread_root is not None:
            in_thread.setdefault(m.thread_root, []).append(m.body)
    outcomes: Counter[str] = Counter()
    abandoned = 0
    lags: list[float] = []
    for run, marker in state.items():
        job = by_id[run.rpartition("@")[0]]
        kind = marker.split(":")[0]
        outcomes[kind] += 1
        mine = lines_of.get(run, [])
        if kind == "started" and claimant_pid(marker) != live_pid:
            abandoned += 1
        if len(mine) > 1:
            problems.append(f"run {run} ({marker}) posted {len(mine)} ⏰ lines: {[m.event_id for m in mine]}")
        if kind == "ran" and len(mine) != 1:
            problems.append(f"run {run} ran but has {len(mine)} ⏰ lines")
        if kind not in POSTING and mine:
            problems.append(f"run {run} is {marker} but posted a ⏰ line")
        for line in mine:
            lags.append(line.ts - due_of(run))
            said = in_thread.get(line.event_id, [])
            if len(said) > 1 or (kind == "ran" and said != [f"You said: {job.job.task}"]):
                problems.append(f"run {run} ({marker}): answers to its ⏰ line {line.event_id}: {said}")
        if job.deleted_at is not None and due_of(run) > job.deleted_at:
            problems.append(f"run {run} ({marker}) is due after its job was deleted at {job.deleted_at:.3f}")
    for job in soak.jobs:
        runs = sorted(due_of(r) for r in state if r.startswith(job.job.id + "@"))
        if job.every is None:
            due_before_deleted = job.deleted_at is None or job.job.next_due.timestamp() <= job.deleted_at  # type: ignore[union-attr]
            if due_before_deleted and len(runs) != 1:
                problems.append(f"one-off {job.job.id} has {len(runs)} runs")
            continue
        for a, b in itertools.pairwise(runs):
            if b - a == job.every:
                continue
            # occurrences skipped: only when the run before was claimed late (no bot alive, or
            # the catch-up after a restart): one late run for them, never a burst
            late = any(k <= b and up + RESTART_MARGIN >= a for k, up in soak.downtimes)
            if not late:
                before = lines_of.get(f"{job.job.id}@{a}", [])
                late = bool(before) and before[0].ts - a >= (b - a) - job.every - 1
            if not late:
                problems.append(f"job {job.job.id}: occurrences between {a} and {b} skipped with a bot alive")
    calls = 0
    for job in soak.jobs:
        ran = sum(1 for r, m in state.items() if r.startswith(job.job.id + "@") and m == "ran")
        posted = sum(len(v) for r, v in lines_of.items() if r.startswith(job.job.id + "@"))
        n = asked(llm, job.job.task)
        calls += n
        if not ran <= n <= posted:
            problems.append(f"job {job.job.id}: {n} model calls, {ran} runs ran, {posted} ⏰ lines")
    downs = [up - k for k, up in soak.downtimes]
    summary = {
        "due_runs": len(state),
        "outcomes": dict(sorted(outcomes.items())),
        "clock_lines": sum(len(v) for v in lines_of.values()),
        "model_calls": calls,
        "jobs": len(soak.jobs),
        "recurring": sum(1 for j in soak.jobs if j.every),
        "deleted": sum(1 for j in soak.jobs if j.deleted_at is not None),
        "kills": soak.kills,
        "started_by_a_killed_bot_never_finished": abandoned,
        "lag_due_to_clock_line_p50_s": pct(lags, 0.5),
        "lag_due_to_clock_line_p99_s": pct(lags, 0.99),
        "lag_max_s": pct(lags, 1.0),
        "restart_p50_s": pct(downs, 0.5),
        "soak_s": round(soak_seconds, 1),
    }
    assert not problems, "\n".join(problems[:40]) + f"\n{summary}"
    return summary


@pytest.mark.timeout(300)
async def test_scheduled_runs_exactly_once_across_random_bot_kills(
    stack: Stack,
    humans: Login,
    llm: ScriptedLLMServer,
    main_bot_down: None,  # noqa: F811
) -> None:
    summary = await schedule_soak(stack, humans, llm, runs=36, seed=32)
    print("schedule soak:", json.dumps(summary))
    assert summary["kills"] >= 2, summary
    assert summary["outcomes"].get("ran", 0) >= 5, summary


@pytest.mark.soak
@pytest.mark.timeout(3600)
async def test_soak_scheduled_runs_across_random_bot_kills(
    stack: Stack,
    humans: Login,
    llm: ScriptedLLMServer,
    main_bot_down: None,  # noqa: F811
) -> None:
    """`make soak-schedules`: SOAK_SCHEDULE_RUNS (200) due runs."""
    runs = int(os.environ.get("SOAK_SCHEDULE_RUNS", "200"))
    summary = await schedule_soak(stack, humans, llm, runs=runs, seed=runs)
    print("schedule soak:", json.dumps(summary))
    assert summary["kills"] >= runs // 40, summary
