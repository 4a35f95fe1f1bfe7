"""Memory that follows the person, through the real graph service (docs/memory.md): the model
stand-in calls `remember`, the user types `!remember` / `!memory` / `!forget` exactly as the
bot forwards them, and each test reads what the MODEL was given (the framed section of its
system message) and what the user saw.

The three recall rules, as a user would notice them: a memory reaches the model only in a
conversation of its owner, where every reader heard it, and where every reader may read what
it was derived from. Every test has users of its own (memories persist per user and tenant).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.factories import ac
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.memory_http import (
    MemoryChat,
    chat_with,
    dm,
    final,
    print_memory_log,
    put_document,
    room,
    running_graph,
)
from tests.support.redis_dump import dump_redis
from tests.support.vagent_cli import run_vagent
from vagent_graph.memory.commands import MEMORY_OFF, NOT_GRANTED
from vagent_graph.memory.recall import SECTION_HEADER
from vagent_shared import AcContext
from vagent_shared.events import HitlRequest
from vagent_shared.knowledge import Audience
from vagent_shared.memory import REMEMBERED

ADMIN = "admin-token-memory-flow-4b1c"
DOMAIN = "northwind"
ROOT = Path(__file__).resolve().parents[2]
DESCRIPTOR = ROOT / "graph" / "src" / "vagent_graph" / "agents" / "vagent.yaml"
HR_DOC = (
    "# Salary bands 2027\n\nThe band for senior engineers is 91 000 to 104 000 EUR, "
    "reference HR-BANDS-2027, approved by the board on 3 March.\n"
)
PRESS = "# Press summary\n\nNorthwind grew in the third quarter, reference PRESS-Q3.\n"
#: What a user of the packaged agent is granted here (the HR category on top for alice).
BASE = ["tool:search_documents", "tool:remember", "tool:ask_user", "document_tag:public"]


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    """The packaged agent (memory enabled, `remember` offered), an HR and a public document."""
    data = tmp_path_factory.mktemp("graph-memory")
    with running_graph(redis_url, data, _llm_session, "memflow_docs", GRAPH_ADMIN_TOKEN=ADMIN) as g:
        put_document(g, ADMIN, DOMAIN, "salary-bands", HR_DOC, category="hr", tags="confidential")
        put_document(g, ADMIN, DOMAIN, "press", PRESS, category="news", tags="public")
        yield g


@pytest.fixture
async def chat(graph: GraphProcess, llm_server: ScriptedLLMServer) -> AsyncIterator[MemoryChat]:
    """The packaged agent, spoken to as the bot does."""
    async with chat_with(graph, llm_server) as c:
        yield c


@dataclass(frozen=True)
class People:
    """A test's own users: alice (HR too), bob, carol (a newcomer)."""

    tag: str
    alice: AcContext
    bob: AcContext
    carol: AcContext

    def alice_without(self, *instances: str) -> AcContext:
        granted = ["document_category:hr", *BASE]
        return ac(self.alice.user_id, [i for i in granted if i not in instances], domain=DOMAIN)


@pytest.fixture
def people() -> People:
    t = uuid.uuid4().hex[:8]
    return People(
        t,
        ac(f"@alice-{t}:x", ["document_category:hr", *BASE], domain=DOMAIN),
        ac(f"@bob-{t}:x", BASE, domain=DOMAIN),
        ac(f"@carol-{t}:x", BASE, domain=DOMAIN),
    )


@pytest.fixture(autouse=True)
def memory_log(graph: GraphProcess, people: People) -> Iterator[None]:
    """After each test, what the service logged about its users' memories (pytest shows it
    for a failing test only)."""
    yield
    print_memory_log(graph, people.alice, people.bob, people.carol)


async def model_remembers(
    chat: MemoryChat, who: AcContext, text: str, audience: Audience | None = None
) -> str:
    """A turn in a new conversation in which the model calls `remember(text)`: the answer."""
    chat.llm.push_tool_calls([("remember", {"text": text})])
    chat.llm.push_text("Noted.")
    events = await chat.say(dm(who), f"Please remember: {text}", who, audience)
    return final(events)


async def recalls_run(chat: MemoryChat) -> float:
    """How many recalls the service has run (its Prometheus histogram's count)."""
    text = (await chat.client.get("/metrics")).text
    found = re.search(r"^vagent_graph_memory_recall_seconds_count (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def text_in_recall(found: str, text: str) -> bool:
    return f'"{text}"' in found


def keys_holding(snapshot: dict[str, str], text: str) -> list[str]:
    """The Redis keys whose name or value holds `text`."""
    return sorted(k for k, v in snapshot.items() if text in k + v)


# ---- the model's `remember` and the three rules -----------------------------------------
async def test_a_dm_memory_is_recalled_in_a_new_dm_and_survives_reset(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People
) -> None:
    alice = people.alice
    text = "Alice prefers answers in German"
    shown = await model_remembers(chat, alice, text)
    assert f"{REMEMBERED}{text}" in shown  # nothing remembered silently
    assert "remember" in llm_server.offered_tool_names(0)

    sid = dm(alice)  # another conversation: the model is given it, framed as data
    llm_server.clear()
    llm_server.push_text("Gern.")
    before = await recalls_run(chat)
    await chat.say(sid, "What is new?", alice)
    assert f'"{text}"' in chat.section()
    # one recall for the turn: the one started under the session's lock, taken by the model node
    assert await recalls_run(chat) == before + 1
    assert text not in chat.system().split(SECTION_HEADER)[0]
    assert [m["role"] for m in llm_server.requests[-1]["messages"]] == ["system", "user"]

    r = await chat.client.post(
        "/api/v1/reset_session", json={"session_id": sid.format()}, headers=chat.graph.headers
    )
    assert r.status_code == 200, r.text  # `!reset`: the conversation, not the memory
    llm_server.push_text("Gern.")
    await chat.say(sid, "And now?", alice)
    assert f'"{text}"' in chat.section()


async def test_a_dm_memory_is_withheld_in_a_group_room(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People
) -> None:
    text = "Alice is moving to Porto in May"
    await model_remembers(chat, people.alice, text)
    llm_server.clear()
    assert await chat.ask(people.alice, room(people.bob)) == ""
    assert text not in json.dumps(llm_server.requests, ensure_ascii=False)
    assert text in await chat.ask(people.alice)  # still hers in a DM


async def test_a_group_memory_follows_its_hearers_not_a_newcomer(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People
) -> None:
    alice, bob, carol = people.alice, people.bob, people.carol
    text = "The team offsite is in Lisbon in June"
    shown = await model_remembers(chat, alice, text, room(bob))
    assert f"{REMEMBERED}{text}" in shown
    llm_server.clear()
    assert text in await chat.ask(alice)  # her DM: {alice} heard it
    assert text in await chat.ask(alice, room(bob))  # another room with bob
    assert await chat.ask(alice, room(bob, carol)) == ""  # carol was not there
    assert text not in json.dumps(llm_server.requests[-1], ensure_ascii=False)


async def test_a_memory_from_an_hr_document_is_withheld_once_the_hr_role_is_lost(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People
) -> None:
    alice = people.alice
    text = "Senior band is 91 000 to 104 000 EUR"
    llm_server.push_tool_calls([("search_documents", {"query": "salary band senior engineers"})])
    llm_server.push_tool_calls([("remember", {"text": text})])
    llm_server.push_text("The senior band is 91 000 to 104 000 EUR [1].")
    events = await chat.say(dm(alice), "What is the senior band? Remember it.", alice)
    assert "HR-BANDS-2027" in json.dumps(llm_server.requests[1]["messages"])  # she read the HR doc
    assert f"{REMEMBERED}{text}" in final(events)

    llm_server.clear()
    assert text in await chat.ask(alice)
    assert await chat.ask(people.alice_without("document_category:hr")) == ""
    assert "104 000" not in json.dumps(llm_server.requests[-1], ensure_ascii=False)
    # a room with bob, who may not read HR: not heard by him, and not readable by him
    assert await chat.ask(alice, room(people.bob)) == ""


async def test_erasure_leaves_no_key_holding_a_memory(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People, redis_url: str
) -> None:
    alice = people.alice
    by_model = f"Alice takes her coffee black {people.tag}"
    by_hand = f"Alice plays the cello {people.tag}"
    await model_remembers(chat, alice, by_model)
    await chat.command(dm(alice), f"!remember {by_hand}", alice)
    await chat.command(dm(people.bob), f"!remember Bob likes chess {people.tag}", people.bob)

    before = await dump_redis(redis_url)
    assert keys_holding(before, by_model) and keys_holding(before, by_hand)  # the state is real
    ran = run_vagent(["admin", "forget", alice.user_id], {**os.environ, "REDIS_URL": redis_url})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    after = await dump_redis(redis_url)
    assert keys_holding(after, by_model) == [] and keys_holding(after, by_hand) == []
    assert keys_holding(after, f"Bob likes chess {people.tag}")  # bob's are his
    llm_server.clear()
    assert await chat.ask(alice) == ""
    assert f"Bob likes chess {people.tag}" in await chat.ask(people.bob)


# ---- the commands --------------------------------------------------------------------------
async def test_remember_memory_and_forget_one_without_the_model(chat: MemoryChat, people: People) -> None:
    alice, sid = people.alice, dm(people.alice)
    said = await chat.command(sid, "!remember I like green tea", alice)
    assert said.startswith(f"{REMEMBERED}I like green tea"), said
    listed = await chat.command(sid, "!memory", alice)
    assert re.search(r"^1\. I like green tea — \d{1,2} [A-Z][a-z]{2} \d{4}", listed, re.MULTILINE), listed
    assert "2." not in listed
    assert text_in_recall(await chat.ask(alice), "I like green tea")

    forgot = await chat.command(sid, "!forget 1", alice)
    assert forgot == "Forgot: I like green tea"
    assert "I like green tea" not in await chat.command(sid, "!memory", alice)
    assert await chat.command(sid, "!memory", alice) == "You have no memories."
    assert await chat.ask(alice) == ""


async def test_a_secret_or_an_ungranted_remember_is_refused_and_not_stored(
    chat: MemoryChat, people: People, redis_url: str
) -> None:
    alice, sid = people.alice, dm(people.alice)
    secret = f"Hunter2-Xy9!kq7Zt4{people.tag}"
    said = await chat.command(sid, f"!remember my password is {secret}", alice)
    assert said.startswith("Not remembered:") and "secret" in said and secret not in said, said
    ungranted = people.alice_without("tool:remember")
    said = await chat.command(sid, "!remember I cycle to work", ungranted)
    assert said == NOT_GRANTED
    assert await chat.command(sid, "!memory", alice) == "You have no memories."
    assert not any(secret in k + v for k, v in (await dump_redis(redis_url)).items())
    assert secret not in chat.graph.logs()  # nor in its logs


async def test_forget_all_asks_first_and_no_keeps_them(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People
) -> None:
    alice, sid = people.alice, dm(people.alice)
    for text in ("I like green tea", "I work from Lyon"):
        await chat.command(sid, f"!remember {text}", alice)
    calls = len(llm_server.requests)
    events = await chat.say(sid, "!forget all", alice)
    asked = [e for e in events if isinstance(e, HitlRequest)]
    assert asked and "2" in asked[0].question and sorted(asked[0].options) == ["no", "yes"], events
    said = final(await chat.answer(sid, "no"))
    assert "nothing was forgotten" in said, said
    listed = await chat.command(sid, "!memory", alice)
    assert "I like green tea" in listed and "I work from Lyon" in listed

    events = await chat.say(sid, "!forget all", alice)
    assert any(isinstance(e, HitlRequest) for e in events), events
    assert final(await chat.answer(sid, "yes")) == "Forgot 2 memories."
    assert await chat.command(sid, "!memory", alice) == "You have no memories."
    assert len(llm_server.requests) == calls  # the model never saw any of it


async def test_remember_everywhere_is_recalled_in_a_room_that_never_heard_it(
    chat: MemoryChat, people: People
) -> None:
    alice = people.alice
    said = await chat.command(dm(alice), "!remember --everywhere answer in German", alice)
    assert said.startswith(f"{REMEMBERED}answer in German"), said
    await chat.command(dm(alice), "!remember my sister is called Mia", alice)
    found = await chat.ask(alice, room(people.bob, people.carol))
    assert text_in_recall(found, "answer in German") and "Mia" not in found


async def test_nothing_of_a_command_is_checkpointed(
    chat: MemoryChat, llm_server: ScriptedLLMServer, people: People, redis_url: str
) -> None:
    alice, sid = people.alice, dm(people.alice)
    text = f"I keep bees on the roof {people.tag}"
    llm_server.push_text("Hello.")
    await chat.say(sid, "Hello", alice)
    await chat.command(sid, f"!remember {text}", alice)
    llm_server.push_text("Hello again.")
    await chat.say(sid, "Anything new?", alice)  # recalled, yet not saved with the turn
    assert text_in_recall(chat.section(), text)
    assert "!remember" not in json.dumps(llm_server.requests[-1]["messages"][1:])

    snapshot = await dump_redis(redis_url)
    session_keys = {k: v for k, v in snapshot.items() if sid.format() in k}
    assert any(k.startswith("checkpoint") for k in session_keys), sorted(session_keys)
    assert [k for k, v in session_keys.items() if text in v] == []
    # the memory store holds it, and nothing but the memory store
    holding = keys_holding(snapshot, text)
    assert holding and all(k.startswith("vagent_memory:") for k in holding), holding


async def test_an_unchecked_room_recalls_only_everywhere_memories(chat: MemoryChat, people: People) -> None:
    """A group room with AUDIENCE_FILTER=off: no audience, `audience_unchecked` set."""
    alice = people.alice
    await chat.command(dm(alice), "!remember I am allergic to nuts", alice)
    await chat.command(dm(alice), "!remember --everywhere keep answers short", alice)
    found = await chat.ask(alice, None, audience_unchecked=True)
    assert text_in_recall(found, "keep answers short") and "nuts" not in found
    listed = await chat.command(dm(alice), "!memory", alice, audience_unchecked=True)
    assert "keep answers short" in listed and "nuts" not in listed


# ---- memory off ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph_without_memory(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    """The packaged agent with `memory: {enabled: false}` (its tools list still names `remember`)."""
    data = tmp_path_factory.mktemp("graph-memory-off")
    agent = yaml.safe_load(DESCRIPTOR.read_text())
    agent["memory"]["enabled"] = False
    (data / "agent.yaml").write_text(yaml.safe_dump(agent))
    with running_graph(
        redis_url, data, _llm_session, "memoff_docs", AGENT_DESCRIPTOR=str(data / "agent.yaml")
    ) as g:
        yield g


async def test_memory_off_offers_no_tool_recalls_nothing_and_says_so(
    chat: MemoryChat, graph_without_memory: GraphProcess, llm_server: ScriptedLLMServer, people: People
) -> None:
    alice = people.alice
    await chat.command(dm(alice), "!remember I like green tea", alice)
    async with chat_with(graph_without_memory, llm_server) as off:
        llm_server.push_text("Sure.")
        await off.say(dm(alice), "How should you answer me?", alice)
        assert "remember" not in llm_server.offered_tool_names()
        assert "search_documents" in llm_server.offered_tool_names()
        assert SECTION_HEADER not in off.system() and "green tea" not in off.system()
        for typed in ("!memory", "!remember I like black tea", "!forget 1"):
            said = await off.command(dm(alice), typed, alice)
            assert said == MEMORY_OFF, (typed, said)
    assert "black tea" not in await chat.command(dm(alice), "!memory", alice)
