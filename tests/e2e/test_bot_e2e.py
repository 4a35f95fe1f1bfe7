"""End to end: people in Matrix rooms, the real bot, graph, provider, Redis and Synapse."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import DOMAIN, Stack, down
from tests.support.graph_process import TOKEN
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient, Msg, syncing_human
from vagent_shared import SessionId, redis_keys

pytestmark = pytest.mark.e2e
TENANT = [{"type": "io.vagent.tenant", "state_key": "", "content": {"domain": DOMAIN}}]


def older_than(stack: Stack, cutoff: str) -> int:
    with sqlite3.connect(Path(stack.graph.env["RECORDS_DB_PATH"])) as c:
        return int(c.execute("SELECT COUNT(*) FROM records WHERE created_at < ?", (cutoff,)).fetchone()[0])


def add_old_record(stack: Stack, created_at: str) -> None:
    """One more record, so a delete older than a later date has something to ask about
    (earlier tests may have deleted the seeded ones, in any order)."""
    with sqlite3.connect(Path(stack.graph.env["RECORDS_DB_PATH"])) as c:
        c.execute("INSERT INTO records (customer, amount, created_at) VALUES ('Old', 1, ?)", (created_at,))


def reads(text: str) -> Callable[[Msg], bool]:
    """A message whose (latest) body is exactly `text`."""
    return lambda m: m.body == text


def said(text: str) -> Callable[[Msg], bool]:
    """The echo LLM's answer to `text`."""
    return reads(f"You said: {text}")


async def echoed(human: HumanClient, stack: Stack, room: str, text: str, bot: str | None = None) -> Msg:
    """The human says `text`; the bot's answer to it (the echo LLM's)."""
    await human.send(room, text)
    return await human.wait_for_reply(bot or stack.users.bot, room, said(text))


async def wait_for_echoes(
    human: HumanClient,
    stack: Stack,
    room: str,
    texts: list[str],
    timeout: float = 20,  # noqa: ASYNC109
) -> None:
    """Until the bot has answered each of `texts` (already sent) with the echo LLM's answer."""
    for text in texts:
        await human.wait_for_reply(stack.users.bot, room, said(text), timeout=timeout)


async def bodies(human: HumanClient, stack: Stack, room: str, bot: str | None = None) -> list[str]:
    """The bodies of all the bot's messages in the room so far, latest edits applied."""
    return [m.body for m in await human.messages_from(bot or stack.users.bot, room)]


async def ask_delete(
    alice: HumanClient,
    stack: Stack,
    llm: ScriptedLLMServer,
    room: str,
    cutoff: str,
    text: str,
    thread_root: str | None = None,
) -> Msg:
    """Alice asks for a delete (the scripted LLM calls delete_records); the bot's question,
    once the bot has stored it (a reaction or a Redis check may follow at once)."""
    llm.push_tool_calls([("delete_records", {"older_than": cutoff})])
    await alice.send(room, text, thread_root=thread_root)
    question = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("❓ Delete"))
    await stack.question_saved(question.event_id)
    return question


async def dm_with_bot(human: HumanClient, stack: Stack, encrypted: bool = False) -> str:
    return await human.create_dm(stack.users.bot, encrypted=encrypted)


async def test_dm_question_gets_a_streamed_answer(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    text = "Streaming works: " + " ".join(f"word{i}" for i in range(30)) + ". **Done**."
    llm.push_text(text, chunks=30, delay=0.06)
    asked = await alice.send(room, "tell me something long")
    reply = await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.body == text and m.formatted_body is not None, 20
    )
    assert reply.in_reply_to == asked
    assert reply.edits >= 2, "the answer should grow by edits while it streams"
    assert "<strong>Done</strong>" in (reply.formatted_body or "")
    assert len(await alice.messages_from(stack.users.bot, room)) == 1  # one message, edited


async def tenant_room(alice: HumanClient, name: str, members: list[str]) -> str:
    """A room with the tenant state event; returns once every invited member has joined."""
    room = await alice.create_room(members, name, state=TENANT)
    for member in members:
        await alice.wait_joined(room, member)
    return room


async def group(alice: HumanClient, stack: Stack, name: str) -> str:
    """A group room (alice, bob, the bot): the bot answers only when addressed."""
    return await tenant_room(alice, name, [stack.users.bot, stack.users.bob])


async def test_delete_confirmed_in_a_thread_after_an_invalid_answer(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await group(alice, stack, "ops")
    root = await alice.send(room, "let's clean up")
    before = older_than(stack, "2016-01-01")
    assert before > 0
    question = await ask_delete(
        alice, stack, llm, room, "2016-01-01", "!ai delete records older than 2016", root
    )
    assert question.body == f"❓ Delete {before} records older than 2016-01-01? (yes/no)"
    assert question.thread_root == root
    await alice.send(room, "maybe", thread_root=root)
    again = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("Please answer"))
    assert again.thread_root == root and older_than(stack, "2016-01-01") == before
    llm.push_text("Deleted them.")
    await alice.send(room, "yes", thread_root=root)
    done = await alice.wait_for_reply(stack.users.bot, room, reads("Deleted them."))
    assert done.thread_root == root
    assert older_than(stack, "2016-01-01") == 0


async def test_no_cancels_and_deletes_nothing(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    before = older_than(stack, "2019-01-01")
    await ask_delete(alice, stack, llm, room, "2019-01-01", "delete records older than 2019")
    llm.push_text("Okay, I did not delete anything.")
    await alice.send(room, "No")
    await alice.wait_for_reply(stack.users.bot, room, reads("Okay, I did not delete anything."))
    assert older_than(stack, "2019-01-01") == before
    tool = next(m for m in llm.requests[-1]["messages"] if m["role"] == "tool")
    assert "The user said no" in tool["content"]


async def test_confirmation_by_reaction(stack: Stack, alice: HumanClient, llm: ScriptedLLMServer) -> None:
    room = await dm_with_bot(alice, stack)
    q = await ask_delete(alice, stack, llm, room, "2017-01-01", "delete records older than 2017")
    llm.push_text("Deleted by reaction.")
    await alice.react(room, q.event_id, "✅")
    await alice.wait_for_reply(stack.users.bot, room, reads("Deleted by reaction."))
    assert older_than(stack, "2017-01-01") == 0


async def test_another_user_cannot_approve(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await group(alice, stack, "shared")
    before = older_than(stack, "2020-06-01")
    q = await ask_delete(alice, stack, llm, room, "2020-06-01", "!ai delete records older than 2020-06-01")
    await bob.send(room, "yes")
    await bob.send(room, "yes", reply_to=q.event_id)
    await bob.react(room, q.event_id, "✅")
    await asyncio.sleep(2)
    assert older_than(stack, "2020-06-01") == before
    # bob's reply to the bot is a question of his own session, never a resume of alice's run
    assert all(m["role"] != "tool" for r in llm.requests for m in r["messages"])
    # alice's question is still pending: only she can answer it
    llm.push_text("Deleted on alice's word.")
    await alice.send(room, "yes")
    await alice.wait_for_reply(stack.users.bot, room, reads("Deleted on alice's word."))
    assert older_than(stack, "2020-06-01") == 0


async def test_user_without_access_gets_nothing(
    stack: Stack, carol: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(carol, stack)
    await carol.send(room, "hello, are you there?")
    await carol.send(room, "!help")
    await carol.assert_no_message_from(stack.users.bot, room, within=3)
    assert not carol.typing_seen_from(stack.users.bot, room)
    assert llm.requests == []
    logs = stack.logs()
    assert "access_denied" in logs and stack.users.carol in logs


async def test_encrypted_dm_round_trip(stack: Stack, alice: HumanClient, llm: ScriptedLLMServer) -> None:
    room = await dm_with_bot(alice, stack, encrypted=True)
    reply = await echoed(alice, stack, room, "secret question")
    raw = [e for e in alice.events if e.event_id == reply.event_id]
    assert raw and raw[0].encrypted


async def test_help_and_group_addressing(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await group(alice, stack, "group")
    await alice.send(room, "just chatting with friends")
    await alice.send(room, "!ai !help")
    help_msg = await alice.wait_for_reply(stack.users.bot, room, lambda m: "!reset" in m.body)
    assert "!stop" in help_msg.body
    await alice.send(room, f"{stack.users.bot} ping", mentions=[stack.users.bot])
    await alice.wait_for_reply(stack.users.bot, room, said("ping"))
    assert not any("just chatting" in b for b in await bodies(alice, stack, room))


async def test_restart_mid_conversation_loses_nothing_answers_once(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    await echoed(alice, stack, room, "before restart")
    while_down = [f"while down {i}" for i in range(12)]
    with down(stack.main_bot, crash=True):  # a crash: no goodbye
        for text in while_down:
            await alice.send(room, text)
        # the same store (same device), and a small sync timeline so the backlog arrives `limited`
        with stack.another_bot("bot", SYNC_TIMELINE_LIMIT="5") as revived:
            await wait_for_echoes(alice, stack, room, while_down, timeout=40)
            await asyncio.sleep(1.5)
            expected = ["You said: before restart"] + [f"You said: {t}" for t in while_down]
            answers = await bodies(alice, stack, room)
            assert sorted(answers) == sorted(expected)  # none lost, none answered twice
            logs = revived.logs()
            assert '"method": "restored"' in logs  # the device was reused, not a new login
            assert '"event": "backfilled"' in logs


async def test_first_ever_start_does_not_answer_old_history(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    newbot_pw = "newbot-password"
    newbot = await asyncio.to_thread(stack.synapse.register_user, f"newbot{id(tmp_path) % 100000}", newbot_pw)
    # the bot's account is already in the room and history exists before it ever runs
    async with syncing_human(stack.synapse.url, newbot, newbot_pw, tmp_path / "as-bot", False):
        dm = await alice.create_dm(newbot)
    await alice.send(dm, "old message before the bot ever ran")
    with stack.another_bot("newbot", MATRIX_USER=newbot, MATRIX_PASSWORD=newbot_pw):
        await asyncio.sleep(2)
        await echoed(alice, stack, dm, "new message", bot=newbot)
        assert await bodies(alice, stack, dm, bot=newbot) == ["You said: new message"]


async def test_expired_question_makes_the_next_message_a_new_request(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    before = older_than(stack, "2021-01-01")
    await ask_delete(alice, stack, llm, room, "2021-01-01", "delete records older than 2021")
    sid = SessionId(room_id=room, user_id=stack.users.alice).format()
    await stack.redis_delete(redis_keys.hitl_pending(sid))  # what the question's TTL does
    await echoed(alice, stack, room, "yes")  # a new request, not an approval
    assert older_than(stack, "2021-01-01") == before
    msgs = llm.requests[-1]["messages"]
    results = [m["content"] for m in msgs if m["role"] == "tool"]
    assert results and results[0].startswith("Cancelled")  # the stale tool call was closed


async def test_long_answer_is_split_into_several_messages(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    paragraphs = [f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 40 for i in range(12)]
    text = "\n\n".join(paragraphs)  # ~13 KB
    llm.push_text(text, chunks=20)
    await alice.send(room, "write a book")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: "Paragraph 11" in m.body, 30)
    await asyncio.sleep(1)
    parts = await bodies(alice, stack, room)
    assert len(parts) >= 2
    assert "".join(parts).replace("\n", "").replace(" ", "") == text.replace("\n", "").replace(" ", "")


async def test_two_bot_processes_answer_each_message_exactly_once(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    with stack.another_bot("bot2"):
        room = await dm_with_bot(alice, stack)
        texts = [f"message {i}" for i in range(8)]
        sent = [await alice.send(room, text) for text in texts]
        await wait_for_echoes(alice, stack, room, texts, timeout=40)
        await asyncio.sleep(2)
        replies: list[Msg] = await alice.messages_from(stack.users.bot, room)
        assert sorted(m.in_reply_to or "" for m in replies) == sorted(sent)


async def test_flood_control_and_length_limit(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    await stack.redis_delete(redis_keys.flood(stack.users.alice))  # earlier tests' messages count too
    strict_env = {"FLOOD_MAX_MESSAGES": "2", "FLOOD_WINDOW_SECONDS": "60", "MAX_MESSAGE_CHARS": "50"}
    with down(stack.main_bot), stack.another_bot("bot", **strict_env):  # same store: the same device
        room = await dm_with_bot(alice, stack)
        await alice.send(room, "x" * 51)
        await alice.wait_for_reply(stack.users.bot, room, lambda m: "too long" in m.body)
        for i in range(3):
            await alice.send(room, f"burst {i}")
        await alice.wait_for_reply(stack.users.bot, room, lambda m: "too fast" in m.body)
        answers = await bodies(alice, stack, room)
        assert "You said: burst 0" in answers and "You said: burst 2" not in answers
        assert not any(r["messages"][-1]["content"] == "x" * 51 for r in llm.requests)


async def test_stop_cancels_the_running_answer(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    llm.push_text("slow " * 100, chunks=100, delay=0.1)
    await alice.send(room, "write a lot")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("slow"))
    await alice.send(room, "!stop")
    await alice.wait_for_reply(stack.users.bot, room, reads("⏹️ Stopped."))
    assert await asyncio.to_thread(llm.wait_for_streams, disconnected=1, timeout=10)
    assert llm.completed_streams == 0
    await echoed(alice, stack, room, "still there?")


async def test_reset_forgets_the_conversation(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    await echoed(alice, stack, room, "my name is Ada")
    await alice.send(room, "!reset")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("🧹"))
    await echoed(alice, stack, room, "what is my name?")
    assert "Ada" not in str(llm.requests[-1]["messages"])


async def test_invites_tenants_health_and_clean_shutdown(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    import httpx

    strict_env = {"INVITE_ALLOWLIST": stack.users.alice, "DEFAULT_DOMAIN": ""}
    with down(stack.main_bot), stack.another_bot("bot", **strict_env) as strict:
        # only alice may invite the bot: bob's invite is declined
        bobs = await bob.create_room([stack.users.bot], "bob's room", state=TENANT)
        await bob.wait_for(
            lambda e: (
                e.room_id == bobs
                and e.type == "m.room.member"
                and e.state_key == stack.users.bot
                and e.content.get("membership") == "leave"
            )
        )
        # a DM has no tenant state event and no DEFAULT_DOMAIN is set: silence
        dm = await dm_with_bot(alice, stack)
        await alice.send(dm, "hello from a room without a tenant")
        await alice.assert_no_message_from(stack.users.bot, dm, within=2)
        assert "no_tenant_domain" in strict.logs()
        # a room with the tenant event works
        room = await tenant_room(alice, "tenant room", [stack.users.bot])
        await echoed(alice, stack, room, "hi")
        port = strict.env["BOT_HEALTH_PORT"]
        health = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/health", timeout=10)
        assert health.status_code == 200
        assert health.json()["checks"] == {"sync": True, "redis": True, "graph": True}
        metrics = (await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/metrics", timeout=10)).text
        assert 'vagent_bot_events_total{outcome="answered"}' in metrics
        code = strict.stop()
    assert code == 0  # SIGTERM: a clean stop
    logs = strict.logs()
    assert "bot_stopped" in logs
    for secret in (stack.users.passwords[stack.users.bot], TOKEN):
        assert secret not in logs


async def test_history_before_the_bot_joined_is_not_answered(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await tenant_room(alice, "busy room", [stack.users.bob])
    for i in range(120):  # more than one sync timeline: the bot's first sync there is `limited`
        await alice.send(room, f"!ai old question {i}")
    await alice.client.room_invite(room, stack.users.bot)
    await alice.wait_joined(room, stack.users.bot)
    await alice.send(room, "!ai new question")
    await alice.wait_for_reply(stack.users.bot, room, said("new question"))
    await asyncio.sleep(1)
    assert await bodies(alice, stack, room) == ["You said: new question"]
