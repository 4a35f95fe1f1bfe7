"""Earlier tool results follow the audience (scope.py): what the readers of an answer may not
read is withheld from the model, whenever it was retrieved."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from tests.support.factories import ac
from vagent_graph.citations import artifact_for, turn_sources
from vagent_graph.scope import (
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
    assert seen[8].content == "Northwind grew" and args_of(seen[9]) == {"query": "again"}
    assert text.count("91 000") == 1
    assert [s.doc_id for s in turn_sources(seen[:6])] == []  # a withheld result cites nothing
    assert history[2].content == "Ana earns 91 000 EUR"  # the checkpoint's messages are untouched
    assert visible_history(history, Readership(ALICE, None).may_read) == history  # a DM: all of it


def test_a_damaged_scope_is_withheld() -> None:
    broken = ToolMessage(content="secret", tool_call_id="c", artifact={"scope": {"documents": "nonsense"}})
    [seen] = visible_history([broken], Readership(ALICE, None).may_read)
    assert seen.content == WITHHELD
