"""`vagent admin forget`: a GDPR erasure against real state in the real Redis.

The state is made by the real parts: conversations run through the graph's own runtime and
checkpointer (a confirmation left pending, a run still holding its lock), the bot's question
store and flood control, the audit writer. Then every key and every value in Redis is read
back to check what still mentions the forgotten user, and that nobody else lost anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import uvicorn
from aiohttp import web
from langgraph.types import Command
from nio import AsyncClient
from redis.asyncio import Redis

from redis_local import free_port
from tests.support.factories import ac
from tests.support.files import pdf_with_text
from tests.support.graph_process import TOKEN as GRAPH_TOKEN
from tests.support.graph_runtime import scripted_runtime
from tests.support.llm_server import ScriptedLLMServer, TextResponse
from tests.support.redis_dump import dump_all
from tests.support.vagent_cli import Ran, run_vagent
from vagent_bot.access.flood import BotFloodControl as FloodControl
from vagent_bot.clients.graph_client import GraphClient
from vagent_bot.clients.transcribe import Transcriber
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_bot.conversation.routing import parse_message, session_for
from vagent_bot.conversation.turn_files import TurnFiles
from vagent_bot.matrix.downloads import MediaDownloader, MediaRefused
from vagent_graph import cli
from vagent_graph.http.app import create_app
from vagent_graph.knowledge.embeddings import LocalEmbedder
from vagent_graph.memory.store import MemoryStore
from vagent_graph.resources import Resources
from vagent_graph.state import erasure
from vagent_graph.state.end_of_run import end_of_run
from vagent_graph.state.session_lock import SessionLock
from vagent_graph.turn.events import stream_run
from vagent_graph.workflow.graph import new_turn_input
from vagent_shared import SessionId, redis_keys
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal
from vagent_shared.hitl import PendingQuestion
from vagent_shared.memory import Memory, MemoryPolicy
from vagent_shared.settings import GraphSettings
from vagent_shared.wire import ProcessMessageRequest

BIN = Path(sys.executable).parent


def mentions(text: str, user_id: str) -> bool:
    """The user id as a whole in `text`, not as the start of a longer id (`...localhost.evil`,
    `...localhost:8448`). Written here, not imported: the test's own reading."""
    return any(
        re.search(re.escape(form) + r"(?![A-Za-z0-9.\-\]])(?!:\d)", text) is not None
        for form in (user_id, json.dumps(user_id)[1:-1])  # as is, and as a JSON string holds it
    )


@dataclass
class World:
    """Users and sessions of one test, all named with a unique tag."""

    rt: Resources
    redis: Redis
    llm: ScriptedLLMServer
    tag: str
    stream: str
    env: dict[str, str]
    alice: str
    bob: str
    carol: str
    #: Ids an erasure of alice must not confuse with hers, and the reverse.
    lookalikes: dict[str, str]
    sessions: dict[str, list[str]] = field(default_factory=dict)
    trail: AuditTrail | None = None

    def session(self, user: str, room: str, thread: str | None = None) -> str:
        sid = SessionId(room_id=f"!{self.tag}{room}:localhost", thread_id=thread, user_id=user).format()
        self.sessions.setdefault(user, []).append(sid)
        return sid

    async def run(self, sid: str, graph_input: Any, release: bool = True) -> list[SSEEvent]:
        """One run as the service does it: lock (with the checkpoint), run, end of run."""
        lock = await SessionLock.acquire(self.rt.redis, sid, 60)
        events = [
            e async for e in stream_run(self.rt.graph, graph_input, {"configurable": {"thread_id": sid}}, 30)
        ]
        asked = any(isinstance(e, HitlRequest) for e in events)
        if release:
            await end_of_run(self.rt.redis, self.rt.checkpointer, lock, asked, 3600)
        return events

    async def say(self, sid: str, text: str, answer: str, release: bool = True) -> list[SSEEvent]:
        self.llm.push_text(answer)
        user = SessionId.parse(sid).user_id
        return await self.run(sid, new_turn_input(text, ac(user, superuser=True)), release)

    async def ask_to_confirm(self, sid: str, question_event: str) -> HitlRequest:
        """A run that stops at a confirmation, and the bot's record of the pending question."""
        user = SessionId.parse(sid).user_id
        self.llm.push_tool_calls([("delete_records", {"older_than": "2018-01-01"})])
        events = await self.run(sid, new_turn_input("delete the old records", ac(user)))
        q = next(e for e in events if isinstance(e, HitlRequest))
        parsed = SessionId.parse(sid)
        pending = PendingQuestion(
            session_id=sid,
            room_id=parsed.room_id,
            user_id=user,
            question=q.question,
            options=q.options,
            interrupt_id=q.interrupt_id,
            question_event_id=question_event,
            thread_root=parsed.thread_id,
        )
        await HitlStore(self.redis).save(pending, 3600)
        return q

    def forget(self, *args: str, process: bool = False, **env: str) -> Ran | subprocess.CompletedProcess[str]:
        """`vagent admin forget ARGS` in this process (tests/support/vagent_cli.py); with
        `process`, the installed console script in a new one."""
        if not process:
            return run_vagent(["admin", "forget", *args], {**self.env, **env})
        return subprocess.run(
            [str(BIN / "vagent"), "admin", "forget", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )


async def build(w: World) -> None:
    """Alice: three sessions in two rooms (one waiting for a confirmation, one still running),
    her bot keys, a cached credential, audit entries. Bob: a session in her room that names her,
    with a pending confirmation of his own. The lookalikes: a conversation each, bot keys,
    credentials, audit entries, in the same room as alice."""
    t, alice, bob = w.tag, w.alice, w.bob
    flood = FloodControl(w.redis, 100, 60)
    assert w.trail is not None

    a_main = w.session(alice, "A")
    await w.say(a_main, "hello", "Hello Alice, how can I help?")
    await w.say(a_main, "what is my id?", f"You are {alice}.")
    a_thread = w.session(alice, "B", f"${t}root1")
    await w.ask_to_confirm(a_thread, f"${t}question-alice")
    a_running = w.session(alice, "B", f"${t}root2")
    await w.say(a_running, "a long job", "Working on it.", release=False)  # its lock is still held
    await w.redis.hset(redis_keys.session(a_main), mapping={"user": alice, "turns": "2"})
    await w.redis.set(redis_keys.bot_thread(f"!{t}B:localhost", f"${t}root1"), "1", ex=600)
    await w.redis.set(redis_keys.event_seen(f"${t}msg-alice"), "1", ex=600)
    for _ in range(3):
        assert await flood.allow(alice)
    await w.redis.set(
        redis_keys.credential_cache(alice, "acme", "tickets"), "gAAAAB-alice-ciphertext", ex=600
    )
    w.trail.record("agent_access", user_id=alice, resource="agent:vagent", decision="allowed", domain="acme")
    w.trail.record(
        "tool_access", user_id=alice, session_id=a_thread, resource="tool:delete_records", decision="allowed"
    )
    w.trail.record(
        "hitl_decision",
        user_id=w.carol,
        session_id=a_thread,
        resource="tool:delete_records",
        decision="declined",
    )

    b_main = w.session(bob, "A")
    await w.say(b_main, f"is {alice} in this room?", f"Yes, {alice} is here.")  # bob's words about her
    await w.ask_to_confirm(b_main, f"${t}question-bob")
    await w.redis.hset(redis_keys.session(b_main), mapping={"user": bob})
    assert await flood.allow(bob)
    await w.redis.set(redis_keys.credential_cache(bob, "acme", "tickets"), "gAAAAB-bob-ciphertext", ex=600)
    w.trail.record("agent_access", user_id=bob, resource="agent:vagent", decision="allowed")
    w.trail.record(
        "tool_access", user_id=bob, session_id=b_main, resource="tool:delete_records", decision="denied"
    )

    for name, other in w.lookalikes.items():
        sid = w.session(other, "A")
        await w.say(sid, "hi", f"Hello {name}.")
        await w.redis.hset(redis_keys.session(sid), mapping={"user": other})
        await w.redis.set(redis_keys.hitl_pending(sid), json.dumps({"session_id": sid}), ex=600)
        await w.redis.set(redis_keys.hitl_question(f"${t}q-{name}"), sid, ex=600)
        await w.redis.set(redis_keys.graph_question_pending(sid), "1", ex=600)
        await w.redis.set(redis_keys.session_lock(sid), "token", ex=600)
        assert await flood.allow(other)
        await w.redis.set(redis_keys.credential_cache(other, "acme", "tickets"), "gAAAAB", ex=600)
        w.trail.record(
            "agent_access", user_id=other, session_id=sid, resource="agent:vagent", decision="allowed"
        )
    await w.trail.flush()
    graph_trail = w.rt.services.find(AuditTrail)
    assert graph_trail is not None and graph_trail.stream == w.stream
    await graph_trail.flush()


@pytest.fixture
async def world(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[World]:
    t = uuid.uuid4().hex[:8]
    redis = Redis.from_url(redis_url)
    stream = f"test:audit:{t}"
    lookalikes = {
        "al": f"@{t}al:localhost",  # a prefix of alice's local part
        "alic": f"@{t}alic:localhost",
        "evil": f"@{t}alice:localhost.evil",  # alice's id is a prefix of theirs
        "port": f"@{t}alice:localhost:8448",
        "star": f"@{t}a*:localhost",  # glob characters
        "qmark": f"@{t}al?ce:localhost",
        "class": f"@{t}[a]lice:localhost",
        "backslash": f"@{t}alice\\:localhost",
    }
    env = {**os.environ, "REDIS_URL": redis_url, "AUDIT_STREAM": stream}
    monkeypatch.setenv("AUDIT_STREAM", stream)  # the graph's own audit trail writes there too
    async with scripted_runtime(redis_url, llm_server.base_url, tmp_path) as rt:
        w = World(
            rt,
            redis,
            llm_server,
            t,
            stream,
            env,
            f"@{t}alice:localhost",
            f"@{t}bob:localhost",
            f"@{t}carol:localhost",
            lookalikes,
        )
        w.trail = AuditTrail("graph", redis, stream)
        w.trail.start()
        try:
            await build(w)
            yield w
        finally:
            await w.trail.aclose()
            async for key in redis.scan_iter(match=f"*{t}*", count=1000):
                await redis.delete(key)
            await redis.aclose()


# ---- reading everything back -------------------------------------------------------------------


def hers(w: World, snapshot: dict[str, str]) -> set[str]:
    """The audit entries --audit erases: hers, or about one of her sessions."""
    return {
        k
        for k, e in audit_events(snapshot, w.stream).items()
        if e.event_type != "user_forgotten" and (e.user_id == w.alice or e.session_id in w.sessions[w.alice])
    }


def mentioning(snapshot: dict[str, str], user: str) -> dict[str, str]:
    return {k: v for k, v in snapshot.items() if mentions(k, user) or mentions(v, user)}


def of_test(snapshot: dict[str, str], tag: str) -> dict[str, str]:
    """This test's keys: everything it made has the tag in its name."""
    return {k: v for k, v in snapshot.items() if tag in k}


def audit_events(snapshot: dict[str, str], stream: str) -> dict[str, AuditEvent]:
    return {
        k: AuditEvent.model_validate_json(v.removeprefix("event="))
        for k, v in snapshot.items()
        if k.startswith(stream + " #")
    }


# ---- the erasure -------------------------------------------------------------------------------


async def test_forget_erases_every_key_of_hers_and_nothing_of_anyone_else(world: World) -> None:
    w = world
    before = await dump_all(w.redis)
    hers_before = mentioning(before, w.alice)
    # the state is real: checkpoints, writes, write-key sets, the bot's and the graph's keys
    for kind in (
        "checkpoint:",
        "checkpoint_write:",
        "write_keys_zset:",
        "session:",
        "hitl_pending:",
        "hitl_question:",
        "lock:session:",
        "graph:question_pending:",
        "credential_cache:",
        "bot:flood:",
        "usage:",  # her token usage counters (fields of the day's hash)
    ):
        assert any(k.startswith(kind) for k in hers_before), kind
    assert any(
        v.endswith(w.sessions[w.alice][1]) for k, v in before.items() if k.startswith("hitl_question:")
    )

    proc = w.forget(w.alice, process=True)  # as an operator runs it
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith(f"Forgot {w.alice}: deleted ")
    assert re.search(r"checkpoint\s+3\b", out) and re.search(r"hitl_question\s+1\b", out)
    assert re.search(r"session_lock\s+1\b", out) and "were running" in out  # the run still holding its lock
    assert "audit entries were kept" in out and "whose name mentions" not in out

    after = await dump_all(w.redis)
    left = mentioning(after, w.alice)
    events = audit_events(after, w.stream)
    forgotten = [k for k, e in events.items() if e.event_type == "user_forgotten"]
    assert len(forgotten) == 1
    record = events[forgotten[0]]
    assert (record.service, record.user_id, record.resource, record.decision) == (
        "admin",
        w.alice,
        f"user:{w.alice}",
        "done",
    )
    assert record.metadata["checkpoint"] == 3 and record.metadata["flood"] == 1
    assert record.metadata["credential_cache"] == 1 and "audit_entries" not in record.metadata
    b_main = w.sessions[w.bob][0]
    for key in left:
        if key.startswith(w.stream + " #"):
            e = events[key]
            assert (
                e.event_type == "user_forgotten"
                or e.user_id == w.alice
                or e.session_id in w.sessions[w.alice]
            )
        else:  # bob's conversation names her: his data, kept
            assert b_main in key and key.startswith(("checkpoint:", "checkpoint_write:")), key
    assert any(b_main in k for k in left)
    assert {k for k in left if k.startswith(w.stream)} == hers(w, before) | set(forgotten)

    # nobody else lost (or gained) anything: every other key of this test is as it was
    erased = {k for k in hers_before if not k.startswith(w.stream) and b_main not in k}
    expected = {k: v for k, v in of_test(before, w.tag).items() if k not in erased and k != w.stream}
    assert {
        k: v for k, v in of_test(after, w.tag).items() if k not in forgotten and k != w.stream
    } == expected

    # bob's pending confirmation still resumes, the lookalikes' checkpoints still load
    w.llm.push_text("Deleted, Bob.")
    events_after = await w.run(b_main, Command(resume="yes"))
    assert [e.content for e in events_after if isinstance(e, TextFinal)] == ["Deleted, Bob."]
    for other in w.lookalikes.values():
        sid = w.sessions[other][0]
        saved = await w.rt.checkpointer.aget_tuple({"configurable": {"thread_id": sid, "checkpoint_ns": ""}})
        assert saved is not None and saved.checkpoint["channel_values"]["messages"]
    # and alice starts from nothing
    a_main = w.sessions[w.alice][0]
    assert (
        await w.rt.checkpointer.aget_tuple({"configurable": {"thread_id": a_main, "checkpoint_ns": ""}})
        is None
    )


async def test_forget_with_audit_leaves_only_the_user_forgotten_record(world: World) -> None:
    w = world
    before = await dump_all(w.redis)
    proc = w.forget(w.alice, "--audit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = len(hers(w, before))
    assert n >= 3 and f"and {n} audit entries" in proc.stdout
    assert re.search(rf"audit_entries\s+{n}\b", proc.stdout)

    after = await dump_all(w.redis)
    b_main = w.sessions[w.bob][0]
    left = {k: v for k, v in mentioning(after, w.alice).items() if b_main not in k}
    assert len(left) == 1
    ((key, value),) = left.items()
    record = AuditEvent.model_validate_json(value.removeprefix("event="))
    assert key.startswith(w.stream + " #") and record.event_type == "user_forgotten"
    assert record.metadata["audit_entries"] == n
    # everyone else's audit entries are still there
    kept = {k for k, e in audit_events(after, w.stream).items() if e.event_type != "user_forgotten"}
    assert kept == set(audit_events(before, w.stream)) - hers(w, before)
    assert any(e.user_id == w.bob for e in audit_events(after, w.stream).values())

    # again: nothing more to erase, and the first record is not erased by the second
    again = w.forget(w.alice, "--audit")
    assert again.returncode == 0 and f"Forgot {w.alice}: deleted 0 keys and 0 audit entries." in again.stdout
    records = [e for e in audit_events(await dump_all(w.redis), w.stream).values() if e.user_id == w.alice]
    assert [e.event_type for e in records] == ["user_forgotten", "user_forgotten"]


async def test_dry_run_lists_and_deletes_nothing(world: World) -> None:
    w = world
    sync_token = redis_keys.sync_token(w.alice)  # the bot's own kind of key: named, not erased
    await w.redis.set(sync_token, "s_1", ex=600)
    before = await dump_all(w.redis)
    proc = w.forget(w.alice, "--dry-run", "--audit")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"Dry run, nothing was deleted. Forgetting {w.alice} would delete ")
    assert f"and {len(hers(w, before))} audit entries:" in out
    for sid in w.sessions[w.alice]:
        assert f"\n    checkpoint:{sid}:\n" in out
    assert f"\n    {redis_keys.credential_cache(w.alice, 'acme', 'tickets')}\n" in out
    assert f"Left 1 key whose name mentions {w.alice} but of no kind forget erases" in out
    assert out.endswith(f"\n  {sync_token}\n")
    for other in (w.bob, *w.lookalikes.values()):
        assert not mentions(out, other)
    assert of_test(await dump_all(w.redis), w.tag) == of_test(before, w.tag)

    # what it listed is exactly what forget then deletes
    listed = {line.strip() for line in out.split("\nLeft ")[0].splitlines() if line.startswith("    ")}
    assert w.forget(w.alice).returncode == 0
    after = await dump_all(w.redis)
    gone = set(of_test(before, w.tag)) - set(after)  # (other tests' keys may expire meanwhile)
    gone = {k.replace(" #", " ", 1) for k in gone}  # a usage counter is listed as `{key} {field}`
    assert gone == listed and sync_token in after


async def test_a_lookalike_id_never_erases_alices_keys(world: World) -> None:
    """Prefixes of her id and glob characters: forgetting them takes only their own keys."""
    w = world
    for name in ("al", "alic", "star", "qmark", "class", "backslash"):
        other = w.lookalikes[name]
        before = await dump_all(w.redis)
        proc = w.forget(other, "--audit")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        after = await dump_all(w.redis)
        assert mentioning(after, w.alice) == mentioning(before, w.alice), name
        gone = set(of_test(before, w.tag)) - set(after)
        assert gone and all(mentions(k, other) or mentions(before[k], other) for k in gone), gone
        assert not mentioning(
            {k: v for k, v in after.items() if w.tag in k and "user_forgotten" not in v}, other
        )
        for rest in w.lookalikes.values():
            if rest != other:
                assert mentioning(after, rest) == mentioning(before, rest), (name, rest)


# ---- her files, wherever a message could take them -----------------------------------------------

MEDIA_PATH = "/_matrix/client/v1/media/download/localhost/{media_id}"
BOT = "@vagent:localhost"


@dataclass
class Files:
    """The bot's file handling (turn_files, with its real downloader and graph client) against
    a real graph process, and a stand-in homeserver that serves one file and counts downloads."""

    files: TurnFiles
    graph: GraphClient
    downloads: list[str]
    told: list[str] = field(default_factory=list)

    async def turn(
        self, event: dict[str, Any], text: str, replied: dict[str, Any] | None = None
    ) -> list[SSEEvent]:
        """One message addressed to the bot (`text`: what it asks) as the bot's conversation
        takes it: its files (refused: one short answer, no graph call), then the answer."""
        msg = parse_message(event, event["room_id"])
        assert msg is not None
        try:
            turn = await self.files.prepare(msg, text, replied)
        except MediaRefused as exc:
            self.told.append(exc.user_message)
            return []
        sid = session_for(msg)
        req = ProcessMessageRequest(
            session_id=sid.format(),
            room_id=msg.room_id,
            user_id=msg.sender,
            message=turn.message,
            context={"event_id": msg.event_id},
            ac_context=ac(msg.sender),
            attachments=turn.attachments,
        )
        return [ev async for ev in self.graph.process_message(req)]


@asynccontextmanager
async def graph_service(settings: GraphSettings) -> AsyncIterator[str]:
    """The graph service (create_app: its routes, lifespan and resources) on real HTTP, served
    in this event loop: the same app as `vagent-graph` without a process start (seconds)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(settings), log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not serving.done(), serving.exception()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        sock.close()


@pytest.fixture
async def files(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Files, dict[str, bytes]]]:
    media: dict[str, bytes] = {}
    downloads: list[str] = []

    async def download(request: web.Request) -> web.Response:
        downloads.append(request.match_info["media_id"])
        return web.Response(body=media[request.match_info["media_id"]])

    app = web.Application()
    app.router.add_get(MEDIA_PATH, download)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    homeserver = f"http://127.0.0.1:{runner.addresses[0][1]}"
    stream = f"test:audit:{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AUDIT_STREAM", stream)
    settings = GraphSettings(
        REDIS_URL=redis_url,
        RECORDS_DB_PATH=tmp_path / "records.db",
        OPENAI_BASE_URL=llm_server.base_url,
        OPENAI_API_KEY="k",
        LLM_MODEL="m",
        GRAPH_API_TOKEN=GRAPH_TOKEN,
    )
    client = AsyncClient(homeserver, BOT)
    client.user_id, client.access_token = BOT, "bot-token"
    downloader = MediaDownloader(homeserver, lambda: "bot-token", max_bytes=1 << 20, stall_seconds=5)
    turn_files = TurnFiles(client, downloader, Transcriber(None, "whisper-1"), max_per_turn=3)
    try:
        async with graph_service(settings) as url:
            graph = GraphClient(url, GRAPH_TOKEN)
            try:
                yield Files(turn_files, graph, downloads), media
            finally:
                await graph.aclose()
    finally:
        await turn_files.aclose()
        await client.close()
        await runner.cleanup()
        redis = Redis.from_url(redis_url)
        await redis.delete(stream)
        await redis.aclose()


async def test_forget_removes_every_file_she_sent_wherever_a_message_could_take_it(
    files: tuple[Files, dict[str, bytes]], redis_url: str, llm_server: ScriptedLLMServer
) -> None:
    """Alice's file in her DM (sent alone, kept, then asked about) and in a group room, where
    Bob, who has a conversation of his own there, replies `!ai summarise` to it. Forgetting
    Alice leaves her file's text and name nowhere in Redis, and Bob's conversation in place."""
    bot, media = files
    t = uuid.uuid4().hex[:8]
    alice, bob = f"@{t}alice:localhost", f"@{t}bob:localhost"
    dm, group = f"!{t}dm:localhost", f"!{t}group:localhost"
    name, secret = f"salaries-{t}.pdf", f"The CEO earns {t} a year."
    media["salaries"] = pdf_with_text(["Salaries 2027", secret])
    llm_server.set_default(lambda _: TextResponse("Noted."))
    redis = Redis.from_url(redis_url)

    def event(event_id: str, sender: str, room: str, content: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "m.room.message",
            "event_id": event_id,
            "sender": sender,
            "room_id": room,
            "content": content,
        }

    the_file = {"msgtype": "m.file", "body": name, "url": "mxc://localhost/salaries"}
    try:
        await bot.turn(event(f"${t}a1", alice, dm, the_file), "")  # alone: kept for her next question
        await bot.turn(
            event(f"${t}a2", alice, dm, {"msgtype": "m.text", "body": "what is in it?"}), "what is in it?"
        )
        assert secret in seen(llm_server.requests[-1])
        posted = event(f"${t}a3", alice, group, the_file)  # in the group: not for the bot
        await bot.turn(event(f"${t}b1", bob, group, {"msgtype": "m.text", "body": "!ai hello"}), "hello")
        reply = {
            "msgtype": "m.text",
            "body": "!ai summarise",
            "m.relates_to": {"m.in_reply_to": {"event_id": posted["event_id"]}},
        }
        asked = len(llm_server.requests)
        await bot.turn(event(f"${t}b2", bob, group, reply), "summarise", replied=posted)

        def holding(snapshot: dict[str, str]) -> list[str]:
            """The keys whose name or value holds her file's text or name."""
            return sorted(k for k, v in snapshot.items() if secret in k + v or name in k + v)

        before = await dump_all(redis)
        assert holding(before)  # the state is real: her conversation keeps her file
        ran = run_vagent(["admin", "forget", alice], {**os.environ, "REDIS_URL": redis_url})
        assert ran.returncode == 0, ran.stdout + ran.stderr
        after = await dump_all(redis)
        assert holding(after) == []
        b_main = SessionId(room_id=group, thread_id=None, user_id=bob).format()
        assert {k: v for k, v in before.items() if b_main in k} == {
            k: v for k, v in after.items() if b_main in k
        }
        assert any(k.startswith("checkpoint:") and b_main in k for k in after)  # his conversation is kept
        # because Bob never got it: one short answer, no download, no model call
        assert bot.told == ["I can only read files you sent yourself."]
        assert len(llm_server.requests) == asked and bot.downloads == ["salaries"]  # hers, once, for her
    finally:
        async for key in redis.scan_iter(match=f"*{t}*", count=1000):
            await redis.delete(key)
        await redis.aclose()


def seen(request: dict[str, Any]) -> str:
    """Every message of an LLM request, as text."""
    return json.dumps(request["messages"], ensure_ascii=False)


@pytest.mark.parametrize(
    "bad",
    [
        "alice",
        "@alice",
        "alice:localhost",
        "@:localhost",
        "@alice:",
        "@al ice:localhost",
        "@a|b:localhost",
        "@alice:local host",
        "@alice:exa@mple.org",
        "@alice:localhost:port",
        "*",
        "",
    ],
)
def test_forget_refuses_what_is_not_a_matrix_user_id(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["admin", "forget", bad])
    assert exc.value.code == 2
    assert (
        f"Invalid value for 'USER_ID': {bad!r} is not a Matrix user id (@name:server)"
        in capsys.readouterr().err
    )


def test_the_command_refuses_a_bad_id_before_touching_redis() -> None:
    """In this process: the program name and exit codes of the real process are proven by
    test_vagent_cli.py and the next test."""
    proc = run_vagent(
        ["admin", "forget", "alice", "--dry-run"],
        {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Usage: vagent admin forget" in proc.stderr
    assert "Error: Invalid value for 'USER_ID': 'alice' is not a Matrix user id" in proc.stderr


def test_forget_with_redis_down_is_a_one_line_error_and_exit_2() -> None:
    proc = subprocess.run(
        [str(BIN / "vagent"), "admin", "forget", "@alice:localhost"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "REDIS_URL": f"redis://:pw@127.0.0.1:{free_port()}/0"},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vagent admin: cannot reach Redis at 127.0.0.1:")


# ---- who owns a key, by name alone (the parts the tests above reach through Redis) -------------

ALICE = "@alice:localhost"


@pytest.mark.parametrize(
    ("name", "owner_sid"),
    [
        (
            "write_keys_zset:!r:localhost:main:@alice:localhost:__empty__:shallow",
            "!r:localhost:main:@alice:localhost",
        ),
        ("checkpoint:!r:localhost:$ev:@alice:localhost:", "!r:localhost:$ev:@alice:localhost"),
        (
            "checkpoint_latest:!r:localhost:main:@alice:localhost:__empty__",
            "!r:localhost:main:@alice:localhost",
        ),
        ("write_keys_zset:!r:localhost:main:@alice:localhost:8448:__empty__:shallow", None),
        ("write_keys_zset:!r:localhost:main:@alice:localhost.evil:__empty__:shallow", None),
        ("write_keys_zset:!r:localhost:main:@al:localhost:__empty__:shallow", None),
        # a room id made to look like her session, in bob's session: the LAST ':@' is bob
        ("write_keys_zset:!a:main:@alice:localhost:x:main:@bob:localhost:__empty__:shallow", None),
        ("write_keys_zset:@alice:localhost:__empty__:shallow", None),  # no session id at all
    ],
)
def test_checkpoint_key_names_are_read_from_the_last_user_id(name: str, owner_sid: str | None) -> None:
    prefix = name[: name.index(":") + 1]
    assert erasure.checkpoint_key_session(name, prefix, ALICE) == owner_sid


def test_a_user_with_a_port_owns_keys_followed_by_digits() -> None:
    user = "@alice:localhost:8448"
    name = "write_keys_zset:!r:localhost:main:@alice:localhost:8448:__empty__:shallow"
    assert erasure.checkpoint_key_session(name, "write_keys_zset:", user) == "!r:localhost:main:" + user


def test_session_keys_credentials_and_audit_entries_belong_exactly() -> None:
    sid = "!r:localhost:main:@alice:localhost"
    assert erasure.owns_session_key(f"hitl_pending:{sid}", "hitl_pending:", ALICE)
    assert not erasure.owns_session_key(f"hitl_pending:{sid}:8448", "hitl_pending:", ALICE)
    assert not erasure.owns_session_key(
        "hitl_pending:!r:localhost:main:@x@alice:localhost", "hitl_pending:", ALICE
    )
    assert erasure.owns_credential_key(redis_keys.credential_cache(ALICE, "acme", "t"), ALICE)
    assert not erasure.owns_credential_key(redis_keys.credential_cache(ALICE + ".evil", "acme", "t"), ALICE)
    base = {"service": "bot", "resource": "agent:vagent", "decision": "allowed", "event_type": "agent_access"}
    assert erasure.event_is_theirs(AuditEvent.model_validate({**base, "user_id": ALICE}), ALICE)
    assert erasure.event_is_theirs(
        AuditEvent.model_validate({**base, "user_id": "@c:x", "session_id": sid}), ALICE
    )
    assert not erasure.event_is_theirs(
        AuditEvent.model_validate({**base, "user_id": "@alice:localhost.evil"}), ALICE
    )
    forgotten = {**base, "event_type": "user_forgotten", "decision": "done", "user_id": ALICE}
    assert not erasure.event_is_theirs(AuditEvent.model_validate(forgotten), ALICE)


def test_glob_characters_are_escaped_in_every_pattern() -> None:
    user = "@a*[b]?\\:localhost"
    esc = "@a\\*\\[b\\]\\?\\\\:localhost"
    assert redis_keys.user_session_keys_pattern("hitl_pending:", user) == f"hitl_pending:*:{esc}"
    assert redis_keys.user_checkpoint_keys_pattern("checkpoint:", user) == f"checkpoint:*:{esc}:*"
    assert redis_keys.mentioning_pattern(user) == f"*{esc}*"
    assert redis_keys.hitl_question_pattern() == "hitl_question:*"


def test_valid_user_ids() -> None:
    for ok in [
        "@alice:localhost",
        "@a.b_c=d-e/f+g:example.org",
        "@alice:localhost:8448",
        "@bob:[::1]:8448",
        "@bob:10.0.0.1",
        "@a*[b]?:localhost",
    ]:
        assert erasure.valid_user_id(ok), ok
    assert not erasure.valid_user_id("@" + "a" * 250 + ":localhost")


# ---- memories (docs/memory.md) -----------------------------------------------------------------


async def test_forget_erases_her_memories_in_every_tenant_and_nobody_elses(redis_url: str) -> None:
    """Memories written through the graph's own store: hers in two tenants (a DM one, a group
    one bob heard, an `--everywhere` one), bob's (heard by her too), a lookalike's. After
    forget, no key of Redis holds the text of any of hers; theirs are as they were; the
    count is in the output and in the `user_forgotten` record."""
    t = uuid.uuid4().hex[:8]
    alice, bob, evil = f"@{t}alice:localhost", f"@{t}bob:localhost", f"@{t}alice:localhost.evil"
    stream = f"test:audit:{t}"

    def memory(owner: str, domain: str, text: str, **more: Any) -> Memory:
        return Memory.model_validate(
            {"id": uuid.uuid4().hex[:12], "owner": owner, "domain": domain, "text": text, **more}
        )

    hers = [
        memory(alice, "acme", f"{t} my daughter is ill this week", heard_by=(alice,)),
        memory(alice, "acme", f"{t} the release is on Friday", heard_by=(alice, bob)),
        memory(alice, "globex", f"{t} answer in German", everywhere=True, origin="command"),
    ]
    theirs = [
        memory(bob, "acme", f"{t} bob likes tea, alice knows", heard_by=(alice, bob)),
        memory(evil, "acme", f"{t} the lookalike's note", heard_by=(evil,)),
    ]
    redis = Redis.from_url(redis_url)
    store = MemoryStore(redis, LocalEmbedder())
    try:
        for m in [*hers, *theirs]:
            await store.add(m, MemoryPolicy(enabled=True))
        before = await dump_all(redis)
        assert all(any(m.text in v for v in before.values()) for m in hers)  # the store holds them

        ran = run_vagent(
            ["admin", "forget", alice], {**os.environ, "REDIS_URL": redis_url, "AUDIT_STREAM": stream}
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert re.search(r"^  memories\s+3$", ran.stdout, re.M), ran.stdout
        assert re.search(r"^  memory_vectors\s+3$", ran.stdout, re.M), ran.stdout
        assert ran.stdout.startswith(f"Forgot {alice}: deleted 6 keys.")

        after = await dump_all(redis)
        for m in hers:  # in no key's name or value, of any type
            assert not [k for k, v in after.items() if m.text in k or m.text in v], m.text
        assert await store.all_of(alice) == []
        assert await store.all_of(bob) == [theirs[0]] and await store.all_of(evil) == [theirs[1]]
        assert {k: v for k, v in after.items() if t in v and not k.startswith(stream)} == {
            k: v for k, v in before.items() if t in v and not any(m.text in v for m in hers)
        }
        records = audit_events(after, stream)
        (record,) = records.values()
        assert record.event_type == "user_forgotten" and record.user_id == alice
        assert record.metadata["memories"] == 3 and record.metadata["memory_vectors"] == 3
    finally:
        await store.delete_all(bob)
        await store.delete_all(evil)
        await store.delete_all(alice)
        await store.aclose()
        await redis.delete(stream)
        await redis.aclose()


def test_memory_documents_belong_by_their_namespace() -> None:
    """The store's `$.prefix` as JSON.GET answers it: the namespace as escaped text."""
    label = redis_keys.memory_label

    def reply(*labels: str) -> bytes:
        return json.dumps([".".join(labels).replace(".", "\\.")]).encode()

    keys = [
        b"vagent_memory:1",
        b"vagent_memory:2",
        b"vagent_memory:3",
        b"vagent_memory:4",
        b"vagent_memory:5",
    ]
    replies: list[object] = [
        reply("memory", label(ALICE), label("acme")),
        reply("memory", label(ALICE), label("globex")),
        reply("memory", label(ALICE + ".evil"), label("acme")),
        b"not json",
        None,  # expired meanwhile
    ]
    assert erasure.their_memory_keys(keys, replies, ALICE) == keys[:2]
    assert erasure.namespace_of(replies[0]) == redis_keys.memory_namespace(ALICE, "acme")
    assert erasure.their_memory_keys(keys, replies, "@bob:localhost") == []


# ---- scheduled tasks (docs/schedules.md) ---------------------------------------------------------
async def test_forget_deletes_their_scheduled_tasks_and_counts_them(redis_url: str) -> None:
    from vagent_shared.schedule_store import ScheduleStore
    from vagent_shared.schedule_times import ParsedSchedule, parse_schedule_command
    from vagent_shared.schedules import ScheduledJob

    tag = uuid.uuid4().hex[:8]
    alice, bob, stream = f"@alice-{tag}:localhost", f"@bob-{tag}:localhost", f"audit-forget-sched-{tag}"
    redis = Redis.from_url(redis_url)
    store = ScheduleStore(redis)
    now = datetime.now(UTC)
    made: dict[str, list[ScheduledJob]] = {}
    for owner, command in ((alice, "every 2h: digest"), (alice, "in 20m: call Bob"), (bob, "every 2h: his")):
        parsed = parse_schedule_command(command, now, "UTC", min_interval_seconds=900)
        assert isinstance(parsed, ParsedSchedule)
        job = await store.create(
            owner=owner, room_id="!r:localhost", task=parsed.task, schedule=parsed.schedule,
            next_due=parsed.first_run, max_per_user=10, now=now,
        )  # fmt: skip
        assert isinstance(job, ScheduledJob)
        made.setdefault(owner, []).append(job)
    await store.set_timezone(alice, "Europe/Oslo")
    try:
        ran = await asyncio.to_thread(
            run_vagent,
            ["admin", "forget", alice],
            {**os.environ, "REDIS_URL": redis_url, "AUDIT_STREAM": stream},
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "schedules" in ran.stdout and "whose name mentions" not in ran.stdout, ran.stdout
        assert await store.of_user(alice) == [] and await store.timezone_of(alice, "UTC") == "UTC"
        due = {m.decode() for m in cast(list[bytes], await redis.zrange(redis_keys.SCHEDULE_DUE, 0, -1))}
        assert not {j.id for j in made[alice]} & due  # no scheduler will ever claim them
        assert not [k async for k in redis.scan_iter(match=f"schedule:*{alice}*")]
        for job in made[alice]:
            assert await redis.exists(redis_keys.schedule_job(job.id)) == 0
        assert [j.id for j in await store.of_user(bob)] == [made[bob][0].id]  # bob's is his
        assert made[bob][0].id in due
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(stream))
        (forgotten,) = [AuditEvent.from_stream(f) for _, f in entries]
        assert forgotten.event_type == "user_forgotten" and forgotten.metadata["schedules"] == 2
    finally:
        await redis.aclose()
