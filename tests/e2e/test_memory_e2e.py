"""Memory that follows the person, end to end in Matrix (docs/memory.md): real Synapse, bot,
graph, provider and Redis, the scripted LLM stand-in recording what the model is given.

In a DM alice says `!remember …` and sees it in a 🧠 Remembered line (no model call), `!memory`
lists it numbered with its date and where it was said, a question in a NEW thread gets it in
the model's system prompt (and her 🔍 says one memory was recalled), `!forget N` deletes it,
after which `!memory` lists none and nothing is recalled. In a group room with bob, her DM
memory is neither recalled nor listed; only what she said `--everywhere` is; `!forget all`
asks first, then forgets everything.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import DOMAIN, Stack
from tests.e2e.test_bot_e2e import dm_with_bot, group
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient, Msg

pytestmark = pytest.mark.e2e

REMEMBERED = "🧠 Remembered: "
#: The start of the recalled memories' section of the system prompt (memory/recall.py).
SECTION = "## Notes remembered about this user"
HEAD = "🔍 **How this answer came about:**"
NONE_AT_ALL = "You have no memories."
NONE_HERE = "You have no memories that may be recalled here."


@contextmanager
def remembering_allowed(stack: Stack) -> Iterator[None]:
    """Operators hold `tool:remember` for the block (the provider re-reads its policy file)."""
    policy = yaml.safe_load(stack.policy.read_text())
    operator = policy["domains"][DOMAIN]["roles"]["operator"]
    if "tool:remember" not in operator:
        operator.append("tool:remember")
    stack.policy.write_text(yaml.safe_dump(policy))
    try:
        yield
    finally:
        stack.write_policy()


def today() -> set[str]:
    """How `!memory` dates a memory written now (`3 Nov 2026`, UTC), either side of midnight."""
    now = datetime.now(UTC)
    return {f"{d.day} {d:%b %Y}" for d in (now - timedelta(minutes=5), now, now + timedelta(minutes=5))}


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def system_prompt_for(llm: ScriptedLLMServer, question: str) -> str:
    """The system prompt of the (latest) model call that answered `question`."""
    for request in reversed(llm.requests):
        messages = request["messages"]
        users = [m for m in messages if m["role"] == "user"]
        if users and question in text_of(users[-1]):
            return "\n".join(text_of(m) for m in messages if m["role"] == "system")
    raise AssertionError(f"the model was never asked {question!r}")


async def answer_to(human: HumanClient, stack: Stack, room: str, text: str, **kw: Any) -> Msg:
    """`human` says `text`; the bot's reply to exactly that message."""
    asked = await human.send(room, text, **kw)
    return await human.wait_for_reply(
        stack.users.bot, room, lambda m: m.in_reply_to == asked and bool(m.body)
    )


async def command(human: HumanClient, stack: Stack, room: str, text: str, **kw: Any) -> str:
    """A memory command and the graph's answer to it, asked without the model."""
    calls = len(stack.llm.requests)
    reply = await answer_to(human, stack, room, text, **kw)
    assert len(stack.llm.requests) == calls, f"{text!r} reached the model"
    return reply.body


async def forget_everything(human: HumanClient, stack: Stack, room: str) -> None:
    """`!forget all`, confirmed when there is anything to forget."""
    reply = await answer_to(human, stack, room, "!forget all")
    if reply.body == "You have no memories to forget.":
        return
    assert reply.body.startswith("❓ Forget ") and "(yes/no)" in reply.body, reply.body
    await stack.question_saved(reply.event_id)
    await human.send(room, "yes", thread_root=reply.thread_root)
    await human.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("Forgot "))


@pytest.fixture
async def fresh_alice(stack: Stack, alice: HumanClient) -> AsyncIterator[tuple[HumanClient, str]]:
    """Alice with `tool:remember`, no memories, and a new DM with the bot (forgotten after)."""
    with remembering_allowed(stack):
        dm = await dm_with_bot(alice, stack)
        await forget_everything(alice, stack, dm)
        yield alice, dm
        await forget_everything(alice, stack, dm)


async def test_remember_list_recall_in_a_new_thread_and_forget_in_a_dm(
    stack: Stack, fresh_alice: tuple[HumanClient, str], llm: ScriptedLLMServer
) -> None:
    alice, dm = fresh_alice
    mark = uuid.uuid4().hex[:8]
    fact = f"I prefer answers in German ({mark})"

    assert await command(alice, stack, dm, f"!remember {fact}") == f"{REMEMBERED}{fact}"
    listed = await command(alice, stack, dm, "!memory")
    lines = listed.splitlines()
    assert lines[0] == "**Your memories** (1):", listed
    assert any(lines[1] == f"1. {fact} — {day}, here" for day in today()), listed
    assert "!forget N" in listed

    # a new conversation (a thread of its own) recalls it: in the model's system prompt, framed as data
    root = await answer_to(alice, stack, dm, f"a new topic {mark}")
    question = f"how should you answer me? {mark}"
    answer = await answer_to(alice, stack, dm, question, thread_root=root.in_reply_to)
    assert answer.thread_root == root.in_reply_to and answer.body == f"You said: {question}"
    prompt = system_prompt_for(llm, question)
    assert SECTION in prompt and fact in prompt.split(SECTION, 1)[1], prompt
    user_turn = [text_of(m) for m in llm.requests[-1]["messages"] if m["role"] != "system"]
    assert not any(fact in t for t in user_turn)  # only the framed section carries it

    # her 🔍 on that answer says a memory was used: when and where, never what
    await alice.react(dm, answer.event_id, "🔍")
    account = await alice.wait_for_reply(
        stack.users.bot, dm, lambda m: m.thread_root == answer.thread_root and m.body.startswith(HEAD)
    )
    assert any(f"🧠 1 memory recalled: from {day} (this room)" in account.body for day in today()), (
        account.body
    )
    assert mark not in account.body and "German" not in account.body

    assert await command(alice, stack, dm, "!forget 1") == f"Forgot: {fact}"
    assert await command(alice, stack, dm, "!memory") == NONE_AT_ALL
    again = f"and now? {mark}"
    await answer_to(alice, stack, dm, again, thread_root=root.in_reply_to)
    prompt = system_prompt_for(llm, again)
    assert fact not in prompt and SECTION not in prompt


async def test_a_dm_memory_stays_out_of_a_group_room_unless_said_everywhere(
    stack: Stack, fresh_alice: tuple[HumanClient, str], bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    alice, dm = fresh_alice
    mark = uuid.uuid4().hex[:8]
    private = f"I am planning to leave the company in March ({mark})"
    public = f"Answer me in German ({mark})"
    assert await command(alice, stack, dm, f"!remember {private}") == f"{REMEMBERED}{private}"

    room = await group(alice, stack, f"memory-{mark}")  # alice, bob and the bot
    question = f"!ai what do you know about me? {mark}"
    await answer_to(alice, stack, room, question)
    prompt = system_prompt_for(llm, question.removeprefix("!ai "))
    assert private not in prompt and SECTION not in prompt  # bob did not hear it
    assert await command(alice, stack, room, "!ai !memory") == NONE_HERE
    reply = await command(alice, stack, room, "!ai !forget 1")
    assert private not in reply  # nothing of what is not recallable here can be reached from here

    everywhere = await command(alice, stack, dm, f"!remember --everywhere {public}")
    assert everywhere.startswith(f"{REMEMBERED}{public}")
    question = f"!ai and now? {mark}"
    await answer_to(alice, stack, room, question)
    prompt = system_prompt_for(llm, question.removeprefix("!ai "))
    assert SECTION in prompt and public in prompt and private not in prompt
    listed = await command(alice, stack, room, "!ai !memory")
    assert "1. " + public in listed and private not in listed

    # bob's own memories are his: alice's are never listed to him
    bobs = await command(bob, stack, room, "!ai !memory")
    assert mark not in bobs

    # in her DM she sees both, and `!forget all` (after a yes) forgets both
    listed = await command(alice, stack, dm, "!memory")
    assert "**Your memories** (2):" in listed and private in listed and public in listed
    await forget_everything(alice, stack, dm)
    assert await command(alice, stack, dm, "!memory") == NONE_AT_ALL
