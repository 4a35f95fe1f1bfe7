"""`vagent audit` as an operator runs it, reading a stream the services' own writer
(AuditTrail) filled in the real Redis: the command in this process (tests/support/vagent_cli.py:
same app, environment, output and exit codes), and as a real process where that is what an
operator meets (--follow and Ctrl-C, Redis down)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from redis_local import free_port
from tests.support.vagent_cli import Ran, run_vagent
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail

BIN = Path(sys.executable).parent
ALICE, BOB = "@alice:localhost", "@bob:localhost"


@dataclass
class Audit:
    """The CLI bound to one fresh stream of the test Redis, and the writer the services use."""

    redis: Redis
    stream: str
    env: dict[str, str]
    trail: AuditTrail

    def run(self, *args: str, **env: str) -> Ran:
        return run_vagent(["audit", *args], {**self.env, **env})

    def ok(self, *args: str) -> str:
        proc = self.run(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr == "", proc.stderr
        return proc.stdout

    def events(self, *args: str) -> list[AuditEvent]:
        return [AuditEvent.model_validate_json(line) for line in self.ok(*args).splitlines()]

    async def record(self, user: str, decision: Any = "allowed", **kw: Any) -> AuditEvent:
        kw.setdefault("resource", "tool:database_query")
        event = self.trail.record(kw.pop("event_type", "tool_access"), user_id=user, decision=decision, **kw)
        await self.trail.flush()
        return event

    async def add_at(self, when: datetime, event: AuditEvent) -> None:
        """An event that arrived at `when` (the stream id says so), as if written back then."""
        fields: dict[Any, Any] = event.to_stream()
        await self.redis.xadd(self.stream, fields, id=f"{int(when.timestamp() * 1000)}-0")


@pytest.fixture
async def audit(redis_url: str) -> AsyncIterator[Audit]:
    redis = Redis.from_url(redis_url)
    stream = f"test:audit:{uuid.uuid4().hex[:8]}"
    trail = AuditTrail("graph", redis, stream)
    trail.start()
    env = {**os.environ, "REDIS_URL": redis_url, "AUDIT_STREAM": stream}
    try:
        yield Audit(redis, stream, env, trail)
    finally:
        await trail.aclose()
        await redis.delete(stream)
        await redis.aclose()


def old_event(user: str, hours_ago: float, now: datetime, **kw: Any) -> AuditEvent:
    return AuditEvent(
        timestamp=now - timedelta(hours=hours_ago),
        service=kw.pop("service", "bot"),
        user_id=user,
        event_type=kw.pop("event_type", "agent_access"),
        resource=kw.pop("resource", "agent:vagent"),
        decision=kw.pop("decision", "allowed"),
        **kw,
    )


async def test_tail_prints_the_last_events_as_a_table(audit: Audit) -> None:
    await audit.record(ALICE, "denied", reason="tool not granted to role agent_user")
    await audit.record(BOB, resource="tool:" + "x" * 100)
    out = audit.ok("tail").splitlines()
    assert len(out) == 3
    header, first, second = out
    assert header.split() == ["TIME", "(UTC)", "SERVICE", "EVENT", "DECISION", "USER", "RESOURCE", "REASON"]
    assert first.split()[1:6] == ["graph", "tool_access", "denied", ALICE, "tool:database_query"]
    assert first.endswith("tool not granted to role agent_user")
    assert datetime.strptime(first[:8], "%H:%M:%S")  # UTC clock time, no date for today's events
    assert BOB in second and "x" * 100 not in second and "…" in second
    assert second.index(BOB) == first.index(ALICE) == header.index("USER")


async def test_tail_json_lines_are_the_events_themselves(audit: Audit) -> None:
    written = [await audit.record(ALICE, "denied", metadata={"args": {"n": i}}) for i in range(3)]
    lines = audit.ok("tail", "--json").splitlines()
    assert lines == [e.model_dump_json() for e in written]


async def test_tail_takes_the_last_n_matching_oldest_first(audit: Audit) -> None:
    for i in range(12):
        await audit.record(ALICE if i % 3 else BOB, "denied" if i % 2 else "allowed", reason=f"#{i}")
    # bob: 0, 3, 6, 9; alice denied: 1, 5, 7, 11
    assert [e.reason for e in audit.events("tail", "--json", "--user", BOB)] == ["#0", "#3", "#6", "#9"]
    got = audit.events("tail", "--json", "--user", ALICE, "--decision", "denied", "--count", "3")
    assert [e.reason for e in got] == ["#5", "#7", "#11"]
    assert audit.events("tail", "--json", "--user", "@al:localhost") == []
    assert [e.reason for e in audit.events("tail", "--json", "-n", "2")] == ["#10", "#11"]


async def test_type_filter(audit: Audit) -> None:
    await audit.record(ALICE, event_type="rag_query", resource="documents:acme")
    await audit.record(ALICE)
    got = audit.events("tail", "--json", "--type", "rag_query")
    assert [e.event_type for e in got] == ["rag_query"]


async def test_since_reads_only_that_part_of_the_stream(audit: Audit) -> None:
    now = datetime.now(UTC)
    for hours in (72, 30, 3, 0.5):
        await audit.add_at(now - timedelta(hours=hours), old_event(ALICE, hours, now, reason=f"{hours}h"))
    assert [e.reason for e in audit.events("tail", "--json", "--since", "1h")] == ["0.5h"]
    assert [e.reason for e in audit.events("tail", "--json", "--since", "2d")] == ["30h", "3h", "0.5h"]
    iso = (now - timedelta(hours=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [e.reason for e in audit.events("tail", "--json", "--since", iso)] == ["3h", "0.5h"]
    table = audit.ok("tail", "--since", "2d").splitlines()
    assert table[0].startswith("TIME (UTC)") and len(table) == 4
    assert table[1].startswith((now - timedelta(hours=30)).strftime("%Y-%m-%dT"))  # spans days: full time


async def test_a_bad_since_is_a_usage_error(audit: Audit) -> None:
    proc = audit.run("tail", "--since", "last tuesday")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Invalid value for '--since': 'last tuesday' is neither a duration" in proc.stderr


async def test_export_pages_through_everything_oldest_first(audit: Audit) -> None:
    now = datetime.now(UTC)
    base = now - timedelta(hours=5)
    written = []
    for i in range(1203):  # more than two pages of 500
        e = old_event(BOB if i % 2 else ALICE, 0, base, reason=str(i))
        written.append(e)
    pipe = audit.redis.pipeline(transaction=False)
    base_ms = int(base.timestamp() * 1000)
    for i, e in enumerate(written):
        fields: dict[Any, Any] = e.to_stream()
        pipe.xadd(audit.stream, fields, id=f"{base_ms + i // 3}-{i % 3}")
    await pipe.execute()
    recent = await audit.record(ALICE, reason="recent")

    everything = audit.ok("export").splitlines()
    assert everything == [e.model_dump_json() for e in [*written, recent]]
    alice = audit.events("export", "--user", ALICE)
    assert [e.reason for e in alice] == [*(str(i) for i in range(0, 1203, 2)), "recent"]
    # --since/--until select by arrival time, inclusive, in milliseconds
    since = datetime.fromtimestamp((base_ms + 100) / 1000, UTC).isoformat()
    until = datetime.fromtimestamp((base_ms + 101) / 1000, UTC).isoformat()
    window = audit.events("export", "--since", since, "--until", until)
    assert [e.reason for e in window] == [str(i) for i in range(300, 306)]
    assert audit.events("export", "--since", "1h", "--user", ALICE) == [recent]


async def test_entries_that_are_not_audit_events_are_skipped_and_counted(audit: Audit) -> None:
    await audit.record(ALICE, reason="before")
    await audit.redis.xadd(audit.stream, {"junk": "1"})
    await audit.redis.xadd(audit.stream, {"event": "{not json"})
    await audit.redis.xadd(audit.stream, {"event": json.dumps({"user_id": ALICE})})
    await audit.record(ALICE, reason="after")
    for args in (("tail", "--json"), ("export",)):
        proc = audit.run(*args)
        assert proc.returncode == 0, proc.stderr
        assert [json.loads(x)["reason"] for x in proc.stdout.splitlines()] == ["before", "after"]
        assert "vagent audit: skipped 3 stream entries (not an audit event)" in proc.stderr


async def test_an_empty_or_missing_stream_is_just_empty(audit: Audit) -> None:
    assert audit.ok("tail", "--json") == ""
    assert audit.ok("export") == ""
    assert audit.ok("tail").startswith("TIME (UTC)")


def _terminal_sigint() -> None:
    """Ctrl-C as in a terminal: a test run started in the background (`cmd &` without job
    control) ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def follow(audit: Audit, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        str(BIN / "vagent"),
        "audit",
        "tail",
        "--follow",
        *args,
        env=audit.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_terminal_sigint,
    )


async def next_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), 15)).decode()


async def test_follow_prints_what_arrives_after_it_started(audit: Audit) -> None:
    await audit.record(ALICE, reason="old")
    proc = await follow(audit, "--json", "--user", ALICE)
    try:
        assert json.loads(await next_line(proc))["reason"] == "old"
        await audit.record(BOB, reason="not alice")
        new = await audit.record(ALICE, reason="new")
        assert (await next_line(proc)).rstrip("\n") == new.model_dump_json()  # bob's was filtered out
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a quiet exit 0
        _, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0 and err == b""
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_follow_on_an_empty_range_misses_nothing(audit: Audit) -> None:
    proc = await follow(audit, "--since", "10m")
    try:
        assert (await next_line(proc)).startswith("TIME (UTC)")  # the table's header at once
        await audit.record(ALICE, "denied", reason="first one")
        line = await next_line(proc)
        assert ALICE in line and line.rstrip().endswith("first one")
    finally:
        proc.terminate()
        await proc.wait()


def test_redis_down_is_a_one_line_error_and_exit_2() -> None:
    env = {**os.environ, "REDIS_URL": f"redis://user:hunter2@127.0.0.1:{free_port()}/0"}
    for args in (["tail"], ["export"], ["tail", "--follow"]):
        start = time.monotonic()
        proc: Ran | subprocess.CompletedProcess[str]
        if args == ["tail"]:  # as a process once; the others in this one (the same code paths)
            proc = subprocess.run(
                [str(BIN / "vagent"), "audit", *args], env=env, capture_output=True, text=True, timeout=30
            )
        else:
            proc = run_vagent(["audit", *args], env)
        assert proc.returncode == 2 and proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vagent audit: cannot reach Redis at 127.0.0.1:")
        assert "hunter2" not in proc.stderr and "(REDIS_URL)" in lines[0]
        assert time.monotonic() - start < 10
