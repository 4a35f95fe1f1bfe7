"""`vagent admin forget` erases a person's gateway threads (docs/gateway.md), in the real Redis.

The gateway keeps, per thread, a record `gateway:thread:{id}` (JSON, with its `owner`) and, per
person, an index `gateway:user:{user}` of their thread ids; its token cache maps a token's hash
to the person's id. A thread's conversation is an ordinary session of its owner, run here
through the graph's own runtime and checkpointer (one left at a pending confirmation). After
forget, every key and value in Redis is read back: nothing holds her id or one of her thread
ids, and nobody else's threads, index, tokens or conversations changed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from langgraph.types import Command
from redis.asyncio import Redis

from tests.support.factories import ac
from tests.support.graph_runtime import scripted_runtime
from tests.support.llm_server import ScriptedLLMServer
from tests.support.redis_dump import dump_all
from tests.support.vagent_cli import Ran, run_vagent
from vagent_graph.resources import Resources
from vagent_graph.state import erasure
from vagent_graph.turn.events import stream_run
from vagent_graph.workflow.graph import new_turn_input
from vagent_shared import SessionId, redis_keys
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal


def mentions(text: str, needle: str) -> bool:
    """`needle` as a whole in `text` (not the start of a longer user id), as is or as a JSON
    string holds it. The test's own reading, not erasure.mentions."""
    return any(
        re.search(re.escape(form) + r"(?![A-Za-z0-9.\-\]])(?!:\d)", text) is not None
        for form in (needle, json.dumps(needle)[1:-1])
    )


@dataclass
class Gateway:
    """People of one test (named with a unique tag), their gateway threads and sessions."""

    rt: Resources
    redis: Redis
    llm: ScriptedLLMServer
    tag: str
    stream: str
    alice: str
    bob: str
    #: Shares her id as a prefix: forgetting her must not touch his threads.
    lookalike: str
    threads: dict[str, list[str]] = field(default_factory=dict)

    def session(self, thread_id: str, user: str) -> str:
        """A gateway thread's conversation: a session of its own, of its owner."""
        return SessionId(room_id=f"!gw-{thread_id}:gateway.localhost", user_id=user).format()

    async def thread(self, owner: str, *, as_json_document: bool = False, indexed: bool = True) -> str:
        """A thread as the gateway keeps it: its record and its id in the owner's index."""
        thread_id = str(uuid.uuid4())
        record = {
            "owner": owner,
            "tenant": "acme",
            "created_at": datetime.now(UTC).isoformat(),
            "metadata": {"title": f"{self.tag} notes of {owner}", "graph_id": "vagent"},
            "status": "idle",
        }
        key = redis_keys.gateway_thread(thread_id)
        if as_json_document:
            await self.redis.execute_command("JSON.SET", key, "$", json.dumps(record))  # type: ignore[no-untyped-call]
        else:
            await self.redis.set(key, json.dumps(record))
        if indexed:
            await self.redis.zadd(
                redis_keys.gateway_threads_of(owner), {thread_id: datetime.now(UTC).timestamp()}
            )
        self.threads.setdefault(owner, []).append(thread_id)
        return thread_id

    async def run(self, sid: str, graph_input: Any) -> list[SSEEvent]:
        config: Any = {"configurable": {"thread_id": sid}}
        return [e async for e in stream_run(self.rt.graph, graph_input, config, 30)]

    async def say(self, thread_id: str, user: str, text: str, answer: str) -> list[SSEEvent]:
        self.llm.push_text(answer)
        return await self.run(self.session(thread_id, user), new_turn_input(text, ac(user)))

    async def ask_to_confirm(self, thread_id: str, user: str) -> HitlRequest:
        self.llm.push_tool_calls([("delete_records", {"older_than": "2018-01-01"})])
        events = await self.run(self.session(thread_id, user), new_turn_input("delete old records", ac(user)))
        return next(e for e in events if isinstance(e, HitlRequest))

    def forget(self, *args: str) -> Ran:
        env = {**os.environ, "REDIS_URL": self.rt.settings.REDIS_URL, "AUDIT_STREAM": self.stream}
        return run_vagent(["admin", "forget", *args], env)


@pytest.fixture
async def gw(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    t = uuid.uuid4().hex[:8]
    stream = f"test:audit:gw:{t}"
    monkeypatch.setenv("AUDIT_STREAM", stream)  # the graph's own audit trail writes there too
    redis = Redis.from_url(redis_url)
    async with scripted_runtime(redis_url, llm_server.base_url, tmp_path) as rt:
        g = Gateway(
            rt,
            redis,
            llm_server,
            t,
            stream,
            f"@{t}alice:localhost",
            f"@{t}bob:localhost",
            f"@{t}alice:localhost.evil",
        )
        try:
            yield g
        finally:
            trail = rt.services.find(AuditTrail)
            if trail is not None:
                await trail.flush()
            threads = [i for ids in g.threads.values() for i in ids]
            async for key in redis.scan_iter(count=1000):
                name = key.decode("utf-8", "replace")
                if t in name or any(i in name for i in threads):
                    await redis.delete(key)
            await redis.aclose()


async def test_forget_erases_her_gateway_threads_and_their_conversations_and_nobody_elses(
    gw: Gateway,
) -> None:
    alice, bob, evil = gw.alice, gw.bob, gw.lookalike
    a_plain = await gw.thread(alice)
    a_json = await gw.thread(alice, as_json_document=True)  # however the gateway stores a record
    a_lost = await gw.thread(alice, indexed=False)  # a record her index lost (a crash between writes)
    b_thread = await gw.thread(bob)
    e_thread = await gw.thread(evil)
    # bob's thread id slipped into her index: listed there, but his (its record says so)
    await gw.redis.zadd(redis_keys.gateway_threads_of(alice), {b_thread: 1.0})
    await gw.redis.set(redis_keys.gateway_token(f"{gw.tag}-a"), alice, ex=600)
    await gw.redis.set(redis_keys.gateway_token(f"{gw.tag}-b"), bob, ex=600)
    await gw.redis.set(redis_keys.gateway_token(f"{gw.tag}-e"), evil, ex=600)

    await gw.say(a_plain, alice, "hello", f"Hello, {alice}.")
    await gw.ask_to_confirm(a_json, alice)  # her conversation waits at a confirmation
    await gw.say(b_thread, bob, f"is {alice} around?", "I cannot say.")  # his words about her: his
    await gw.ask_to_confirm(b_thread, bob)
    await gw.say(e_thread, evil, "hi", "Hello.")
    trail = gw.rt.services.find(AuditTrail)
    assert trail is not None
    await trail.flush()

    before = await dump_all(gw.redis)
    her_ids = [alice, a_plain, a_json, a_lost]
    hers_before = {k for k, v in before.items() if any(mentions(k, x) or mentions(v, x) for x in her_ids)}
    # the state is real: her thread records and index, her sessions' checkpoints
    for key in (
        redis_keys.gateway_thread(a_plain),
        redis_keys.gateway_thread(a_json),
        redis_keys.gateway_threads_of(alice),
    ):
        assert key in before
    for thread in (a_plain, a_json):
        assert any(k.startswith("checkpoint:") and thread in k for k in before), thread

    ran = await asyncio.to_thread(gw.forget, alice, "--audit")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"gateway_threads\s+3\b", ran.stdout), ran.stdout
    assert "whose name mentions" not in ran.stdout, ran.stdout  # no gateway key left unknown

    after = await dump_all(gw.redis)
    entries = {
        k: AuditEvent.model_validate_json(v.removeprefix("event="))
        for k, v in after.items()
        if k.startswith(gw.stream + " #")
    }
    (record,) = [e for e in entries.values() if e.event_type == "user_forgotten"]
    assert record.metadata["gateway_threads"] == 3
    assert record.metadata["gateway_index"] == 1 and record.metadata["gateway_tokens"] == 1
    assert record.metadata["checkpoint"] >= 2  # the threads' conversations went with her sessions

    # nothing holds her id or one of her threads' ids, but the record of the erasure itself and
    # bob's own conversation, where he named her
    b_session = gw.session(b_thread, bob)
    for key, value in after.items():
        for x in her_ids:
            if not (mentions(key, x) or mentions(value, x)):
                continue
            if key.startswith(gw.stream + " #"):
                assert entries[key].event_type == "user_forgotten", key
            else:
                assert (
                    x == alice and b_session in key and key.startswith(("checkpoint", "checkpoint_write"))
                ), key
    for thread in (a_plain, a_json, a_lost):
        assert not [k for k in after if thread in k]

    # nobody else lost (or gained) anything
    ours = [gw.tag, *(i for ids in gw.threads.values() for i in ids)]

    def of_test(snapshot: dict[str, str]) -> dict[str, str]:
        """This test's keys (the Redis is shared): named with the tag or one of its thread ids."""
        return {
            k: v for k, v in snapshot.items() if any(x in k for x in ours) and not k.startswith(gw.stream)
        }

    erased = {k for k in hers_before if b_session not in k}  # his conversation naming her: kept
    assert of_test(after) == {k: v for k, v in of_test(before).items() if k not in erased}
    assert json.loads(after[redis_keys.gateway_thread(b_thread)])["owner"] == bob
    index = cast(list[bytes], await gw.redis.zrange(redis_keys.gateway_threads_of(bob), 0, -1))
    assert [i.decode() for i in index] == [b_thread]
    assert await gw.redis.get(redis_keys.gateway_token(f"{gw.tag}-e")) == evil.encode()

    # bob's pending confirmation still resumes; her conversations start from nothing
    gw.llm.push_text("Deleted, Bob.")
    resumed = await gw.run(b_session, Command(resume="yes"))
    assert [e.content for e in resumed if isinstance(e, TextFinal)] == ["Deleted, Bob."]
    for thread in (a_plain, a_json):
        config: Any = {"configurable": {"thread_id": gw.session(thread, alice), "checkpoint_ns": ""}}
        assert await gw.rt.checkpointer.aget_tuple(config) is None


async def test_a_dry_run_lists_her_gateway_keys_and_deletes_nothing(gw: Gateway) -> None:
    thread = await gw.thread(gw.alice)
    before = await dump_all(gw.redis)
    ran = await asyncio.to_thread(gw.forget, gw.alice, "--dry-run")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "gateway_threads (1)" in ran.stdout and redis_keys.gateway_thread(thread) in ran.stdout
    assert "gateway_index (1)" in ran.stdout
    assert await dump_all(gw.redis) == before


def test_a_thread_record_is_hers_only_if_its_owner_says_so() -> None:
    alice = "@alice:localhost"
    keys = [f"gateway:thread:{i}".encode() for i in range(7)]
    replies: list[object] = [
        json.dumps({"owner": alice, "metadata": {}}).encode(),  # a string value
        json.dumps([{"owner": alice}]).encode(),  # JSON.GET key $
        json.dumps({"owner": "@alice:localhost.evil"}).encode(),
        json.dumps({"owner": "@bob:localhost", "metadata": {"about": alice}}).encode(),
        b"not json",
        None,  # gone meanwhile
        json.dumps({"metadata": {"owner": alice}}).encode(),  # no owner of its own
    ]
    assert erasure.their_gateway_threads(keys, replies, alice) == keys[:2]
    tokens: list[tuple[bytes, object]] = [
        (b"gateway:token:a", alice.encode()),
        (b"gateway:token:b", json.dumps({"user_id": alice}).encode()),
    ]
    tokens += [(b"gateway:token:c", b"@alice:localhost:8448"), (b"gateway:token:d", None)]
    assert erasure.their_gateway_tokens(tokens, alice) == [b"gateway:token:a", b"gateway:token:b"]
