"""End to end in Matrix: a retrieved passage does not outlive its audience. Alice asks in a
room with only the bot (a DM: no audience) and the model gets a confidential finance passage;
then carol (public documents only) joins, the room becomes a group room, and when alice asks
the model to quote the document, the passage is withheld from the model (WITHHELD in its
place) while the answer already posted stays in the history. `!ai !reset` there forgets all."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nio
import pytest

from tests.e2e.conftest import DOMAIN, Stack
from tests.e2e.test_bot_e2e import dm_with_bot
from tests.support.knowledge import doc_store, ingest
from tests.support.llm_server import ScriptedLLMServer, TextResponse
from tests.support.matrix_human import HumanClient, Msg
from vagent_graph.tools.scope import WITHHELD

pytestmark = pytest.mark.e2e

REPLY_TIMEOUT = 60.0
FIRST_ANSWER = "There is a confidential board figure for the quarter [1]."
QUOTE_PREFIX = "The document said:"
QUOTE_END = "(end of quote)"


@dataclass(frozen=True)
class Secret:
    doc_id: str
    marker: str  # FIN-SECRET-<hex>: in the passage only
    figure: str  # the confidential number: in the passage only


@pytest.fixture
async def secret(stack: Stack) -> AsyncIterator[Secret]:
    """One confidential finance document in the stack's index (alice may read it, carol not)."""
    s = Secret(
        doc_id=f"board-financials-{uuid.uuid4().hex[:6]}",
        marker=f"FIN-SECRET-{uuid.uuid4().hex[:12]}",
        figure=f"EUR {uuid.uuid4().int % 900 + 100}.{uuid.uuid4().int % 10} million",
    )
    text = (
        "# Board financials\n\n"
        f"The confidential board figure for the quarter is {s.figure}, reference {s.marker}, "
        "for the board only.\n"
    )
    async with doc_store(stack.redis_url, index="vagent_docs") as store:
        await ingest(store, s.doc_id, text, domain=DOMAIN, category="finance", tags=("confidential",))
        try:
            yield s
        finally:
            await store.delete(DOMAIN, s.doc_id)


def quoting_model(request: dict[str, Any]) -> TextResponse:
    """A model that does what it is asked: it quotes every tool result it was given, word for
    word (so a passage that reached it would reach the room too)."""
    results = [str(m.get("content", "")) for m in request["messages"] if m["role"] == "tool"]
    return TextResponse(f"{QUOTE_PREFIX} {' | '.join(results) or 'nothing'} {QUOTE_END}")


def sent(requests: list[dict[str, Any]]) -> str:
    """Everything the model received in `requests`, as JSON (strings escaped)."""
    return json.dumps([r["messages"] for r in requests], ensure_ascii=False)


def audiences(stack: Stack, since: int, room: str) -> list[dict[str, Any]]:
    """The bot's `audience_resolved` lines for `room` written after log offset `since`."""
    lines = [json.loads(ln) for ln in stack.main_bot.logs()[since:].splitlines() if ln.startswith("{")]
    return [ln for ln in lines if ln.get("event") == "audience_resolved" and ln.get("room_id") == room]


async def invite_and_join(inviter: HumanClient, invitee: HumanClient, room: str) -> None:
    """`inviter` invites `invitee`, who joins (HumanClient joins invites as it syncs)."""
    resp = await inviter.client.room_invite(room, invitee.user_id)
    assert isinstance(resp, nio.RoomInviteResponse), resp
    await invitee.wait_joined(room, invitee.user_id, timeout=REPLY_TIMEOUT)
    await inviter.wait_joined(room, invitee.user_id, timeout=REPLY_TIMEOUT)


async def confidential_turn_in_a_dm(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, secret: Secret
) -> str:
    """Alice alone with the bot: the model searches, gets the passage, answers without quoting
    it. Returns the room."""
    room = await dm_with_bot(alice, stack)
    llm.push_tool_calls([("search_documents", {"query": "confidential board figure for the quarter"})])
    llm.push_text(FIRST_ANSWER)
    await alice.send(room, "What is the board figure for the quarter?")  # unaddressed: a DM
    first: Msg = await alice.wait_for_reply(
        stack.users.bot,
        room,
        lambda m: m.body.startswith(FIRST_ANSWER) and "Sources:" in m.body,
        REPLY_TIMEOUT,
    )
    turn1 = sent(llm.requests)
    assert secret.marker in turn1 and secret.figure in turn1  # alice alone may read it
    assert secret.marker not in first.body and secret.figure not in first.body
    return room


async def test_a_dm_passage_is_withheld_once_carol_joins(
    stack: Stack, alice: HumanClient, carol: HumanClient, llm: ScriptedLLMServer, secret: Secret
) -> None:
    room = await confidential_turn_in_a_dm(stack, alice, llm, secret)

    await invite_and_join(alice, carol, room)  # three members: a group room now
    since, turn1_requests = len(stack.main_bot.logs()), len(llm.requests)
    llm.set_default(quoting_model)
    chatting = await alice.send(room, "carol, welcome; just chatting here")  # not addressed
    asked = await alice.send(room, "!ai quote exactly what the document said")
    reply: Msg = await alice.wait_for_reply(
        stack.users.bot,
        room,
        lambda m: m.in_reply_to == asked and m.body.startswith(QUOTE_PREFIX) and m.body.endswith(QUOTE_END),
        REPLY_TIMEOUT,
    )

    turn2_requests = llm.requests[turn1_requests:]
    assert turn2_requests, "no model call on turn 2"
    turn2 = sent(turn2_requests)
    assert secret.marker not in turn2 and secret.figure not in turn2, turn2
    assert "for the board only" not in turn2, turn2  # nor any other part of the passage
    assert turn2.count(json.dumps(WITHHELD, ensure_ascii=False)[1:-1]) == len(turn2_requests)  # one per call
    assert FIRST_ANSWER in turn2  # the answer posted on turn 1 stays in the history
    assert "just chatting" not in turn2  # a group room: the unaddressed message went unanswered
    # what the room reads: the (obliging) model quoted only the placeholder
    assert secret.marker not in reply.body and secret.figure not in reply.body
    assert WITHHELD in reply.body
    seen = await carol.wait_for_reply(stack.users.bot, room, lambda m: m.event_id == reply.event_id)
    assert secret.marker not in seen.body
    assert not [m for m in await alice.messages_from(stack.users.bot, room) if m.in_reply_to == chatting]
    # the bot resolved the room as a group room: carol's AcContext went along as the audience
    [resolved] = audiences(stack, since, room)
    group = {"member_count": 3, "members": 1, "unresolved": 0, "public_only": False}
    assert group.items() <= resolved.items(), resolved


async def test_reset_in_the_group_room_forgets_everything(
    stack: Stack, alice: HumanClient, carol: HumanClient, llm: ScriptedLLMServer, secret: Secret
) -> None:
    room = await confidential_turn_in_a_dm(stack, alice, llm, secret)
    await invite_and_join(alice, carol, room)
    await alice.send(room, "!ai !reset")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("🧹"), REPLY_TIMEOUT)
    before = len(llm.requests)
    llm.push_text("We have not talked yet.")
    await alice.send(room, "!ai what did we talk about?")
    await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.body == "We have not talked yet.", REPLY_TIMEOUT
    )
    [request] = llm.requests[before:]
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert request["messages"][-1]["content"] == "what did we talk about?"
    after = sent([request])
    assert "board figure" not in after and secret.marker not in after and FIRST_ANSWER not in after
