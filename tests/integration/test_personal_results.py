"""Personal results in group rooms ask first (PERSONAL_RESULTS_IN_GROUPS): a tool acting with
the asker's own credential, or returning the asker's own data, shows it to the other members
only after the asker's yes; later turns withhold it from anyone who did not see it.

The real graph, the development Credential Registry and the ticket service as processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_credentials_flow import ALICE, DOMAIN, FB, PM, TICKET_TOOLS, Stack, tool_result
from tests.support.factories import ac, message_body, new_session
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import kinds
from vagent_graph.tools.scope import WITHHELD
from vagent_shared import SessionId
from vagent_shared.events import HitlRequest, SSEEvent
from vagent_shared.knowledge import Audience, AudienceMember

ALICE_TICKET = "VPN drops every hour"  # deploy/dev/tickets.yaml
BOB_AC = ac("@bob:localhost", [], domain=DOMAIN)
CAROL_AC = ac("@carol:localhost", [], domain=DOMAIN)


@pytest.fixture(scope="module")
def module_stack(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One stack for the module: every test asks in sessions of its own."""
    s = Stack(tmp_path_factory.mktemp("personal"), redis_url, _llm_session.base_url).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def stack(module_stack: Stack, llm_server: ScriptedLLMServer) -> Stack:
    """The module's stack, reset for this test (the LLM is emptied by `llm_server`)."""
    return module_stack.reset()


def room(*members: Any) -> dict[str, Any]:
    return Audience(
        members=[AudienceMember(user_id=m.user_id, ac_context=m) for m in members],
        member_count=len(members) + 2,
    ).model_dump(mode="json")


async def ask_in(stack: Stack, sid: SessionId, text: str, audience: dict[str, Any] | None) -> list[SSEEvent]:
    body = message_body(sid, text, ac(ALICE, TICKET_TOOLS, domain=DOMAIN))
    if audience is not None:
        body["audience"] = audience
    return await stack.send(PM, body)


async def answer(stack: Stack, sid: SessionId, text: str, audience: dict[str, Any] | None) -> list[SSEEvent]:
    body: dict[str, Any] = {"session_id": sid.format(), "response": text}
    if audience is not None:
        body["audience"] = audience
    return await stack.send(FB, body)


def the_question(events: list[SSEEvent]) -> str:
    asked = [e for e in events if isinstance(e, HitlRequest)]
    assert len(asked) == 1, events
    return asked[0].question


async def test_the_asker_is_asked_before_a_group_sees_their_tickets(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session(ALICE)
    llm_server.push_tool_calls([("list_my_tickets", {"status": "open"})])
    q = the_question(await ask_in(stack, sid, "list my tickets", room(BOB_AC)))
    assert q == "This will show your open tickets to the 1 other member of this room. Go ahead?"
    assert stack.received() == []  # nothing fetched before the answer
    llm_server.push_text("Not shown.")
    await answer(stack, sid, "no", room(BOB_AC))
    assert stack.received() == [] and "The user said no" in tool_result(llm_server)

    llm_server.push_tool_calls([("list_my_tickets", {"status": "all"})])
    q = the_question(await ask_in(stack, sid, "list all my tickets", room(BOB_AC, CAROL_AC)))
    assert q == "This will show all your tickets to the 2 other members of this room. Go ahead?"
    llm_server.push_text("Here.")
    events = await answer(stack, sid, "yes", room(BOB_AC, CAROL_AC))
    assert kinds(events)[-2:] == ["text_final", "done"]
    assert ALICE_TICKET in tool_result(llm_server)
    assert [r["owner"] for r in stack.received()] == [ALICE]

    # the same room next turn: they saw it; dave joins: withheld from the model
    llm_server.push_text("Same.")
    await ask_in(stack, sid, "repeat", room(BOB_AC, CAROL_AC))
    assert ALICE_TICKET in str(llm_server.requests[-1]["messages"])
    dave = ac("@dave:localhost", [], domain=DOMAIN)
    llm_server.push_text("Nothing to repeat.")
    await ask_in(stack, sid, "repeat my tickets word for word", room(BOB_AC, CAROL_AC, dave))
    turn = str(llm_server.requests[-1]["messages"])
    assert ALICE_TICKET not in turn and WITHHELD in turn


async def test_in_a_dm_personal_results_need_no_question(stack: Stack, llm_server: ScriptedLLMServer) -> None:
    llm_server.push_tool_calls([("list_my_tickets", {})])
    llm_server.push_text("Here.")
    events = await ask_in(stack, new_session(ALICE), "list my tickets", None)
    assert "hitl_request" not in kinds(events) and ALICE_TICKET in tool_result(llm_server)


async def test_someone_joining_before_the_answer_is_asked_about_again(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session(ALICE)
    llm_server.push_tool_calls([("list_my_tickets", {})])
    the_question(await ask_in(stack, sid, "list my tickets", room(BOB_AC)))
    again = the_question(await answer(stack, sid, "yes", room(BOB_AC, CAROL_AC)))
    assert again.startswith("This will show your open tickets to the 2 other members of this room.")
    assert "changed since I asked" in again and stack.received() == []
    llm_server.push_text("Here.")
    await answer(stack, sid, "yes", room(BOB_AC, CAROL_AC))
    assert [r["owner"] for r in stack.received()] == [ALICE]


async def test_a_confirmed_personal_action_says_who_will_see_it(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_tool_calls(
        [("create_ticket", {"title": "Printer jam", "description": "Floor 3 again", "priority": "low"})]
    )
    q = the_question(await ask_in(stack, new_session(ALICE), "open a ticket", room(BOB_AC)))
    assert q.splitlines() == [
        "Create this ticket in the ticket service, in your name?",
        "This will also show the new ticket to the 1 other member of this room.",
        "`title`: `Printer jam`",
        "`description`: `Floor 3 again`",
        "`priority`: `low`",
    ]


@pytest.mark.parametrize("policy", ["deny", "allow"])
async def test_personal_results_in_groups_deny_or_allow(
    policy: str, module_stack: Stack, tmp_path: Path, llm_server: ScriptedLLMServer
) -> None:
    """A graph of its own with the policy; the module's registry and ticket service."""
    stack = module_stack.reset().variant(tmp_path, PERSONAL_RESULTS_IN_GROUPS=policy)
    try:
        llm_server.push_tool_calls([("list_my_tickets", {})])
        llm_server.push_text("Done.")
        events = await ask_in(stack, new_session(ALICE), "list my tickets", room(BOB_AC))
        assert "hitl_request" not in kinds(events)
        if policy == "deny":
            assert "was NOT run" in tool_result(llm_server) and stack.received() == []
        else:
            assert ALICE_TICKET in tool_result(llm_server)
            assert [r["owner"] for r in stack.received()] == [ALICE]
    finally:
        stack.stop()
