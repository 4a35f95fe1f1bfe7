"""`vagent memory list` / `delete`: an operator sees and deletes one user's memories, in every
tenant, against the real memory store in a real Redis (docs/memory.md).

The memories are written through the graph's own MemoryStore (LangGraph's AsyncRedisStore
with the offline embedder), as the `remember` tool and `!remember` write them; the commands
run in this process (tests/support/vagent_cli.py) and once as the installed console script.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from redis import Redis

from redis_local import free_port
from tests.support.vagent_cli import run_vagent
from vagent_graph.knowledge.embeddings import LocalEmbedder
from vagent_graph.memory.store import MemoryStore
from vagent_shared import redis_connect
from vagent_shared.audit import AuditEvent
from vagent_shared.memory import Memory, MemoryPolicy

BIN = Path(sys.executable).parent
POLICY = MemoryPolicy(enabled=True)
#: One embedder for the module: the model loads once (~2 s), not once per store.
EMBEDDER = LocalEmbedder()


def store_run(redis_url: str, work: str, *args: object) -> object:
    """Call one MemoryStore method on a store of its own (the commands run their own loop)."""
    return store_calls(redis_url, [(work, args)])[0]


def store_calls(redis_url: str, calls: list[tuple[str, tuple[object, ...]]]) -> list[object]:
    """Call MemoryStore methods in turn, in one event loop of their own."""

    async def run() -> list[object]:
        redis = redis_connect.connect(redis_url)
        store = MemoryStore(redis, EMBEDDER)
        try:
            await store.setup()
            return [await getattr(store, work)(*args) for work, args in calls]
        finally:
            await store.aclose()
            await redis.aclose()

    return asyncio.run(run())


@dataclass
class World:
    redis_url: str
    redis: Redis
    tag: str
    env: dict[str, str]
    stream: str
    alice: str
    bob: str
    mine: list[Memory]
    bobs: list[Memory]

    def memories(self, user: str) -> list[Memory]:
        found = store_run(self.redis_url, "all_of", user, None)
        assert isinstance(found, list)
        return found

    def audit(self) -> list[AuditEvent]:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], self.redis.xrange(self.stream))
        return [AuditEvent.from_stream(fields) for _, fields in entries]


def memory(owner: str, domain: str, text: str, minutes: int, **more: object) -> Memory:
    return Memory.model_validate(
        {
            "id": uuid.uuid4().hex[:12],
            "owner": owner,
            "domain": domain,
            "text": text,
            "created_at": datetime(2026, 11, 20, 9, 0, tzinfo=UTC) + timedelta(minutes=minutes),
            "heard_by": (owner,),
            **more,
        }
    )


@pytest.fixture
def world(redis_url: str) -> Iterator[World]:
    t = uuid.uuid4().hex[:8]
    alice, bob = f"@{t}alice:localhost", f"@{t}bob:localhost"
    mine = [
        memory(alice, "acme", f"{t} my team is Payments", 0, room_id=f"!{t}dm:localhost", origin="command"),
        memory(
            alice,
            "acme",
            f"{t} the release is on Friday",
            1,
            room_id=f"!{t}payments:localhost",
            heard_by=(alice, bob, f"@{t}carol:localhost"),
        ),
        memory(alice, "globex", f"{t} answer in German", 2, everywhere=True, origin="command"),
    ]
    bobs = [memory(bob, "acme", f"{t} bob likes tea", 0)]
    store_calls(redis_url, [("add", (m, POLICY)) for m in [*mine, *bobs]])
    stream = f"test:audit:{t}"
    redis = Redis.from_url(redis_url)
    env = {**os.environ, "REDIS_URL": redis_url, "AUDIT_STREAM": stream}
    w = World(redis_url, redis, t, env, stream, alice, bob, mine, bobs)
    try:
        yield w
    finally:
        store_calls(redis_url, [("delete_all", (user, None)) for user in (alice, bob)])
        redis.delete(stream)
        redis.close()


def test_list_shows_every_memory_of_hers_in_every_tenant_with_its_text(world: World) -> None:
    w = world
    ran = run_vagent(["memory", "list", w.alice], w.env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].split() == ["ID", "TENANT", "DATE", "(UTC)", "ROOM", "HEARD", "BY", "ORIGIN", "TEXT"]
    rows = lines[1:-1]
    assert len(rows) == 3 and lines[-1] == f"3 memories of {w.alice}."
    first, second, third = rows  # oldest first
    assert first.startswith(w.mine[0].id) and "acme" in first and "2026-11-20 09:00" in first
    assert f"!{w.tag}dm:localhost" in first and "1 person" in first and "command" in first
    assert first.endswith(w.mine[0].text)
    assert "3 people" in second and "tool" in second and second.endswith(w.mine[1].text)
    assert "globex" in third and "everywhere" in third and third.endswith(w.mine[2].text)
    assert "bob likes tea" not in ran.stdout  # another user's memory never shows

    as_json = run_vagent(["memory", "list", w.alice, "--json"], w.env)
    assert as_json.returncode == 0, as_json.stderr
    listed = [Memory.model_validate_json(line) for line in as_json.stdout.splitlines()]
    assert listed == w.mine


def test_list_of_someone_without_memories_says_so(world: World) -> None:
    ran = run_vagent(["memory", "list", f"@{world.tag}nobody:localhost"], world.env)
    assert ran.returncode == 0 and ran.stdout == f"No memories of @{world.tag}nobody:localhost.\n"
    assert run_vagent(["memory", "list", "--json", f"@{world.tag}nobody:localhost"], world.env).stdout == ""


def test_delete_one_asks_then_deletes_it_and_records_it_without_the_text(world: World) -> None:
    """As an operator runs it: the installed command, answering its question with y."""
    w = world
    target = w.mine[1]
    proc = subprocess.run(
        [str(BIN / "vagent"), "memory", "delete", w.alice, target.id],
        env=w.env,
        input="y\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert target.text in proc.stdout  # the question shows what goes
    assert proc.stdout.rstrip().endswith(f"Deleted 1 memory of {w.alice}.")
    assert [m.id for m in w.memories(w.alice)] == [w.mine[0].id, w.mine[2].id]
    assert w.memories(w.bob) == w.bobs

    (event,) = w.audit()
    assert (event.event_type, event.user_id, event.decision, event.reason) == (
        "memory_deleted",
        w.alice,
        "done",
        "operator",
    )
    assert event.metadata == {"ids": [target.id], "count": 1}
    recorded = event.model_dump_json()
    assert not any(m.text in recorded for m in w.mine)  # never the text


def test_delete_all_deletes_nothing_unless_confirmed(world: World) -> None:
    w = world
    declined = run_vagent(["memory", "delete", w.alice], w.env)  # no answer: not confirmed
    assert declined.returncode == 1
    assert "not confirmed; nothing was deleted" in declined.stderr
    assert "Delete all 3 memories of" in declined.stdout
    assert w.memories(w.alice) == w.mine and w.audit() == []

    done = run_vagent(["memory", "delete", w.alice, "--yes"], w.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == f"Deleted 3 memories of {w.alice}.\n"
    assert w.memories(w.alice) == []  # every tenant
    assert w.memories(w.bob) == w.bobs
    (event,) = w.audit()
    assert event.event_type == "memory_deleted" and event.metadata["count"] == 3
    assert set(event.metadata["ids"]) == {m.id for m in w.mine}

    again = run_vagent(["memory", "delete", w.alice, "--yes"], w.env)
    assert again.returncode == 0 and again.stdout == f"Deleted 0 memories of {w.alice}.\n"
    assert len(w.audit()) == 1  # nothing deleted, nothing recorded


def test_an_unknown_id_is_an_error_and_deletes_nothing(world: World) -> None:
    w = world
    ran = run_vagent(["memory", "delete", w.alice, w.bobs[0].id, "--yes"], w.env)  # bob's, not hers
    assert ran.returncode == 1
    assert f"has no memory '{w.bobs[0].id}'" in ran.stderr and "Traceback" not in ran.stderr
    assert w.memories(w.alice) == w.mine and w.memories(w.bob) == w.bobs and w.audit() == []


def test_bad_user_id_and_unreachable_redis_are_one_line_errors_exit_2() -> None:
    bad = run_vagent(["memory", "list", "alice"], dict(os.environ))
    assert bad.returncode == 2 and "not a Matrix user id" in bad.stderr
    down = run_vagent(
        ["memory", "delete", "@alice:localhost", "--yes"],
        {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
    )
    assert down.returncode == 2
    assert down.stderr.startswith("vagent memory: cannot reach Redis at 127.0.0.1:")
    assert len(down.stderr.splitlines()) == 1
