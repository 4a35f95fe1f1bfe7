"""Earlier tool results follow the audience (scope.py): what the readers of an answer may not
read is withheld from the model, whenever it was retrieved."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from tests.support.factories import ac
from vagent_graph.knowledge.citations import artifact_for, turn_sources
from vagent_graph.tools.scope import (
    WITHHELD,
    DocRef,
    EntityRef,
    Readership,
    ResultScope,
    visible_history,
)
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience, AudienceMember, SourceRef

ALICE = ac("@alice:x", ["document_category:hr", "document_tag:public", "entity_type:person"])
CAROL = ac("@carol:x", ["document_tag:public"])
HR = ResultScope(domain="acme", documents=(DocRef(doc_id="salaries", category="hr", tags=("confidential",)),))
PUBLIC = ResultScope(domain="acme", documents=(DocRef(doc_id="press", category="news", tags=("public",)),))
PEOPLE = ResultScope(domain="acme", entities=(EntityRef(id="ana", entity_type="person"),))


def room(*members: AcContext | str, public_only: bool = False, count: int = 0) -> Audience:
    """A group room of the asker and `members` (an AcContext, or a user the provider did not
    answer for)."""
    listed = [
        AudienceMember(user_id=m, ac_context=None)
        if isinstance(m, str)
        else AudienceMember(user_id=m.user_id, ac_context=m)
        for m in members
    ]
    return Audience(members=listed, public_only=public_only, member_count=count or len(listed) + 2)


def test_documents_follow_every_reader() -> None:
    assert Readership(ALICE, None).may_read(HR)
    assert not Readership(ALICE, room(CAROL)).may_read(HR)
    assert Readership(ALICE, room(CAROL)).may_read(PUBLIC)
    assert not Readership(ALICE, room("@eve:x")).may_read(PUBLIC)  # unresolved member: nothing
    assert not Readership(ALICE, room(public_only=True, count=90)).may_read(HR)
    assert Readership(ALICE, room(public_only=True, count=90)).may_read(PUBLIC)
    other_domain = ac("@alice:x", ["document_category:hr"], domain="globex")
    assert not Readership(other_domain, None).may_read(HR)  # the asker switched domains
    revoked = ac("@alice:x", ["document_tag:public"])
    assert not Readership(revoked, None).may_read(HR)  # the grant is gone


def test_entities_follow_every_reader() -> None:
    assert Readership(ALICE, None).may_read(PEOPLE)
    assert not Readership(ALICE, room(CAROL)).may_read(PEOPLE)


def test_personal_results_only_for_those_who_saw_them() -> None:
    mine = ResultScope(personal_to="@alice:x")
    assert Readership(ALICE, None).may_read(mine)
    assert not Readership(ALICE, room(CAROL)).may_read(mine)
    shown = ResultScope(personal_to="@alice:x", shown_to=("@carol:x",))
    assert Readership(ALICE, room(CAROL)).may_read(shown)
    assert not Readership(ALICE, room(CAROL, "@dave:x")).may_read(shown)  # dave joined since
    assert not Readership(ALICE, room(public_only=True, count=90)).may_read(shown)
    assert not Readership(ac("@bob:x"), None).may_read(mine)  # never another user's


def tool_msg(call_id: str, text: str, scope: ResultScope | None, doc: str = "") -> ToolMessage:
    sources = [SourceRef(doc_id=doc, title=doc)] if doc else []
    return ToolMessage(content=text, tool_call_id=call_id, name="t", artifact=artifact_for(sources, scope))


def call(call_id: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"id": call_id, "name": "t", "args": args}])


def args_of(message: AnyMessage) -> dict[str, Any]:
    assert isinstance(message, AIMessage)
    return dict(message.tool_calls[0]["args"])


def test_withheld_results_and_the_calls_that_followed_them() -> None:
    history: list[AnyMessage] = [
        HumanMessage(content="what do we pay?"),
        call("c1", query="salaries"),
        tool_msg("c1", "Ana earns 91 000 EUR", HR, doc="salaries"),
        call("c2", description="Ana earns 91 000 EUR"),  # the model copied the passage
        tool_msg("c2", "Created ticket T-1", None),
        AIMessage(content="Ana earns 91 000 EUR [1]."),  # posted: everyone saw it
        HumanMessage(content="and the press release?"),
        call("c3", query="press"),
        tool_msg("c3", "Northwind grew", PUBLIC, doc="press"),
        call("c4", query="again"),
    ]
    seen = visible_history(history, Readership(ALICE, room(CAROL)).may_read)
    text = str([m.content for m in seen]) + str([getattr(m, "tool_calls", "") for m in seen])
    assert seen[2].content == WITHHELD and "91 000" not in str(args_of(seen[3]))
    assert args_of(seen[3]) == {} and args_of(seen[1]) == {"query": "salaries"}
    assert seen[5].content == "Ana earns 91 000 EUR [1]."  # the final answer stays
    # the current turn's calls were made for these readers (the passage already withheld)
    assert seen[8].content == "Northwind grew" and args_of(seen[9]) == {"query": "again"}
    assert text.count("91 000") == 1
    assert [s.doc_id for s in turn_sources(seen[:6])] == []  # a withheld result cites nothing
    assert history[2].content == "Ana earns 91 000 EUR"  # the checkpoint's messages are untouched
    assert visible_history(history, Readership(ALICE, None).may_read) == history  # a DM: all of it


def test_a_damaged_scope_is_withheld() -> None:
    broken = ToolMessage(content="secret", tool_call_id="c", artifact={"scope": {"documents": "nonsense"}})
    [seen] = visible_history([broken], Readership(ALICE, None).may_read)
    assert seen.content == WITHHELD


def test_the_result_of_a_call_made_after_a_withheld_result_is_withheld_too() -> None:
    """The model copied the HR passage into a page; the tool's answer repeats it. With carol
    reading now, neither the call's arguments nor its result reach the model."""
    history: list[AnyMessage] = [
        HumanMessage(content="put the salary bands on a wiki page"),
        call("c1", query="salaries"),
        tool_msg("c1", "Ana earns 91 000 EUR", HR, doc="salaries"),
        call("c2", title="Bands", body="Ana earns 91 000 EUR"),
        tool_msg("c2", 'Created page 42: "Ana earns 91 000 EUR"', None),
        AIMessage(content="Done: page 42."),
    ]
    seen = visible_history(history, Readership(ALICE, room(CAROL)).may_read)
    assert "91 000" not in str([(m.content, getattr(m, "tool_calls", "")) for m in seen])
    assert isinstance(seen[4], ToolMessage) and seen[4].content == WITHHELD and seen[4].artifact is None
    assert seen[5].content == "Done: page 42."  # posted: everyone saw it
    assert history[4].content == 'Created page 42: "Ana earns 91 000 EUR"'  # the checkpoint's: untouched
    assert visible_history(history, Readership(ALICE, None).may_read) == history  # alice alone: all of it


def test_a_call_made_in_a_later_turn_is_withheld_too() -> None:
    """Alice alone: salaries, then (next turn, the passage still in the history) a wiki page
    of them. Carol joins: the page's call and its result, which repeat the passage, are
    withheld as well as the passage; a call from before the passage keeps its result."""
    history: list[AnyMessage] = [
        HumanMessage(content="how many records?"),
        call("c0", sql="SELECT COUNT(*)"),
        tool_msg("c0", "691 records", None),
        AIMessage(content="691."),
        HumanMessage(content="what do we pay?"),
        call("c1", query="salaries"),
        tool_msg("c1", "Ana earns 91 000 EUR", HR, doc="salaries"),
        AIMessage(content="See the HR policy."),
        HumanMessage(content="put that on a wiki page"),
        call("c2", title="Bands", body="Ana earns 91 000 EUR"),
        tool_msg("c2", 'Created page 42: "Ana earns 91 000 EUR"', None),
        AIMessage(content="Done: page 42."),
        HumanMessage(content="(carol joined) how many records now?"),
        call("c3", sql="SELECT COUNT(*)"),
        tool_msg("c3", "692 records", None),
    ]
    seen = visible_history(history, Readership(ALICE, room(CAROL)).may_read)
    assert "91 000" not in str([(m.content, getattr(m, "tool_calls", "")) for m in seen])
    assert seen[2].content == "691 records" and args_of(seen[1]) == {"sql": "SELECT COUNT(*)"}
    assert seen[10].content == WITHHELD and args_of(seen[9]) == {}
    assert seen[11].content == "Done: page 42."
    # this turn's call was made with the passage withheld: it keeps its result
    assert seen[14].content == "692 records" and args_of(seen[13]) == {"sql": "SELECT COUNT(*)"}
    assert visible_history(history, Readership(ALICE, None).may_read) == history


def test_a_call_made_beside_a_withheld_result_keeps_its_result() -> None:
    """Calls of the same model message were made before any of their results existed: only
    calls made after the withheld result can carry what it said."""
    history: list[AnyMessage] = [
        HumanMessage(content="salaries, and how many records?"),
        AIMessage(
            content="",
            tool_calls=[
                {"id": "c1", "name": "t", "args": {"query": "salaries"}},
                {"id": "c2", "name": "t", "args": {"sql": "SELECT COUNT(*)"}},
            ],
        ),
        tool_msg("c1", "Ana earns 91 000 EUR", HR, doc="salaries"),
        tool_msg("c2", "691 records", None),
    ]
    seen = visible_history(history, Readership(ALICE, room(CAROL)).may_read)
    assert seen[2].content == WITHHELD and seen[3].content == "691 records"
    assert seen[1] == history[1]


# ---- property: what a withheld result said never reaches the model through later calls ----------

#: Each result's scope as drawn: None (unscoped), readable by alice and carol, or not.
SCOPES: dict[str, ResultScope | None] = {
    "none": None,
    "public": PUBLIC,
    "hr": HR,
    "people": PEOPLE,
    "mine": ResultScope(personal_to="@alice:x"),
    "shown": ResultScope(personal_to="@alice:x", shown_to=("@carol:x",)),
}
ROOM = Readership(ALICE, room(CAROL))
#: A model message's calls (1-2, their scope names), a turn's rounds of them, a session's turns.
rounds = st.lists(st.lists(st.sampled_from(sorted(SCOPES)), min_size=1, max_size=2), min_size=1, max_size=4)
sessions = st.lists(rounds, min_size=1, max_size=3)


def session_of(turns: list[list[list[str]]]) -> tuple[list[AnyMessage], dict[str, bool]]:
    """The history of a worst-case model and tools: every call's arguments copy every result
    seen earlier in the session (the history is the model's on every turn, and earlier turns
    had other readers, who saw everything), and every tool's answer repeats its arguments. The
    last turn is the current one: its readers are the room's now, so its calls copy only what
    they may read of this turn. Each result carries a unique marker; returns the markers with
    whether the room may read that result."""
    history: list[AnyMessage] = []
    readable: dict[str, bool] = {}
    n = 0
    seen: list[str] = []
    for t, turn in enumerate(turns):
        history.append(HumanMessage(content=f"question {t}"))
        if t == len(turns) - 1:
            seen = []
        for calls in turn:
            current = t == len(turns) - 1
            copied = " ".join(m for m in seen if readable[m] or not current)
            ids = [f"c{n + i}" for i in range(len(calls))]
            history.append(
                AIMessage(
                    content="", tool_calls=[{"id": i, "name": "t", "args": {"text": copied}} for i in ids]
                )
            )
            for call_id, name in zip(ids, calls, strict=True):
                marker, n = f"<M{n:03d}>", n + 1
                scope = SCOPES[name]
                readable[marker] = scope is None or ROOM.may_read(scope)
                history.append(tool_msg(call_id, f"{marker} {copied}", scope))
                seen.append(marker)
        history.append(AIMessage(content=f"answer {t}"))
    return history, readable


@settings(max_examples=300, deadline=None)
@given(turns=sessions)
def test_nothing_a_withheld_result_said_reaches_the_model(turns: list[list[list[str]]]) -> None:
    history, readable = session_of(turns)
    before = [m.model_copy(deep=True) for m in history]
    seen = visible_history(history, ROOM.may_read)
    given_to_model = str([(m.content, getattr(m, "tool_calls", "")) for m in seen])
    for marker, ok in readable.items():
        if not ok:
            assert marker not in given_to_model, (marker, given_to_model)
    assert history == before  # the checkpoint's messages are untouched


@settings(max_examples=200, deadline=None)
@given(turns=sessions)
def test_nothing_is_withheld_needlessly(turns: list[list[list[str]]]) -> None:
    """Everything before the first unreadable result reaches the model as it was, every
    posted answer, and the current turn's readable results; with alice alone, all of it."""
    history, readable = session_of(turns)
    seen = visible_history(history, ROOM.may_read)
    assert len(seen) == len(history)
    current = max(i for i, m in enumerate(history) if isinstance(m, HumanMessage))
    clean = True
    for i, (m, kept) in enumerate(zip(history, seen, strict=True)):
        if i == current:
            clean = True
        if isinstance(m, ToolMessage) and not readable[str(m.content).split()[0]]:
            clean = False
        if clean or isinstance(m, HumanMessage) or (isinstance(m, AIMessage) and not m.tool_calls):
            assert kept == m
    assert visible_history(history, Readership(ALICE, None).may_read) == history
