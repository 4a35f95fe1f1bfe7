"""The pure parts of turn traces: how a turn's outcome is decided, one entry per tool call
(a resume updates the question's), what the room may be told, what `vagent trace` prints,
and which event pointers `forget` takes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from tests.support.factories import ac
from vagent_graph.cli.output import header
from vagent_graph.cli.trace import COLUMNS, describe, table_row
from vagent_graph.observability.recorder import TurnRecorder, new_trace, turn_outcome
from vagent_graph.observability.trace_store import TraceFilter, is_turn_id
from vagent_graph.state.erasure import their_trace_pointers
from vagent_graph.tools import Tool
from vagent_graph.tools.base import ToolContext
from vagent_graph.tools.scope import DocRef, ResultScope
from vagent_graph.workflow.tool_calls import answered_after, room_may_see
from vagent_shared.events import ErrorEvent, HitlRequest, TextFinal
from vagent_shared.knowledge import Audience, AudienceMember
from vagent_shared.traces import LlmCallTrace, SourceTrace, ToolCallTrace, TurnTrace

ALICE, BOB = "@alice:localhost", "@bob:localhost"


def trace(*calls: ToolCallTrace) -> TurnTrace:
    sid = f"!r:localhost:main:{ALICE}"
    return TurnTrace(turn_id="a" * 32, session_id=sid, user_id=ALICE, tool_calls=list(calls))


ANSWER = TextFinal(content="Here.", is_final=True)
DENIED = ToolCallTrace(name="a", outcome="denied", decision="denied")
REFUSED = ("denied", "tool_refused")


@pytest.mark.parametrize(
    ("last", "error", "calls", "expected"),
    [
        (ANSWER, None, [], ("answered", "")),
        (ANSWER, None, [DENIED, ToolCallTrace(name="b")], ("answered", "")),
        (ANSWER, None, [DENIED], REFUSED),
        (ANSWER, None, [ToolCallTrace(name="a", outcome="refused")], REFUSED),
        (HitlRequest(question="Go?", interrupt_id="i"), None, [], ("asked", "")),
        (ANSWER, ErrorEvent(error_code="timeout", message="x"), [], ("failed", "timeout")),
        (None, ErrorEvent(error_code="internal_error", message="x"), [], ("failed", "internal_error")),
        (None, None, [], ("cancelled", "client_gone")),
        (
            TextFinal(content="", is_final=True),
            None,
            [ToolCallTrace(name="a", outcome="cancelled")],
            ("cancelled", "question_not_confirmed"),
        ),
        (ANSWER, None, [ToolCallTrace(name="a", outcome="declined")], ("answered", "")),
    ],
)
def test_a_turns_outcome_follows_how_its_stream_ended(
    last: TextFinal | HitlRequest | None,
    error: ErrorEvent | None,
    calls: list[ToolCallTrace],
    expected: tuple[str, str],
) -> None:
    assert turn_outcome(last, error, trace(*calls)) == expected


def test_a_forced_outcome_wins_and_a_resume_adds_its_time() -> None:
    rec = TurnRecorder(new_trace("!r:localhost:main:@alice:localhost", ac(ALICE), None))
    assert is_turn_id(rec.trace.turn_id) and rec.trace.tenant == "acme" and not rec.trace.group
    rec.force("over_budget", "budget_exceeded")
    done = rec.finish("answered")
    assert (done.outcome, done.reason) == ("over_budget", "budget_exceeded")
    done.total_ms = 1000.0
    again = TurnRecorder.resumed(done).finish("answered")
    assert again.outcome == "answered" and again.total_ms >= 1000.0


def test_a_resumed_call_updates_its_entry_instead_of_adding_one() -> None:
    rec = TurnRecorder(trace())
    rec.tool_call(ToolCallTrace(name="note", call_id="c1", outcome="asked", confirmation_asked=True))
    rec.tool_call(ToolCallTrace(name="other", call_id="c2"))
    known = rec.tool_entry("c1")
    assert known is not None and known.outcome == "asked"
    rec.tool_call(known.model_copy(update={"outcome": "ok", "confirmation_answer": "yes"}))
    assert [(c.name, c.outcome) for c in rec.trace.tool_calls] == [("note", "ok"), ("other", "ok")]
    assert rec.tool_entry("") is None  # a call without an id is never matched


def test_the_wait_is_counted_from_the_entry_or_else_from_the_saved_question() -> None:
    now = datetime.now(UTC).timestamp()
    entry = ToolCallTrace(name="n", asked_at=datetime.fromtimestamp(now - 5, UTC))
    seconds = answered_after(entry, None)
    assert seconds is not None and 4.9 <= seconds < 10
    from_action = answered_after(ToolCallTrace(name="n"), {"asked_at": now - 2})
    assert from_action is not None and 1.9 <= from_action < 10
    assert answered_after(ToolCallTrace(name="n"), None) is None


class _Args(BaseModel):
    pass


async def _run(args: _Args, ctx: ToolContext, answer: str | None) -> str:
    return "ok"


def test_the_room_is_told_of_a_result_only_when_every_reader_may_read_it() -> None:
    plain = Tool(name="t", description="t", args_model=_Args, run=_run)
    personal = Tool(name="p", description="p", args_model=_Args, run=_run, personal=True)
    bob = AudienceMember(user_id=BOB, ac_context=ac(BOB, ["document_category:public"]))
    room = Audience(members=[bob], member_count=3)
    alice = ac(ALICE, ["document_category:finance", "document_category:public"])
    dm, group = ToolContext(ac=alice, session_id="s"), ToolContext(ac=alice, session_id="s", audience=room)
    finance = ResultScope(domain="acme", documents=(DocRef(doc_id="q3", category="finance"),))
    public = ResultScope(domain="acme", documents=(DocRef(doc_id="pr", category="public"),))
    assert room_may_see(plain, None, group) and room_may_see(plain, finance, dm)
    assert room_may_see(plain, public, group) and not room_may_see(plain, finance, group)
    assert room_may_see(personal, None, dm) and not room_may_see(personal, None, group)


def test_the_trace_filter_and_turn_ids() -> None:
    t = trace()
    assert TraceFilter().matches(t) and TraceFilter(user=ALICE, outcome="answered").matches(t)
    assert not TraceFilter(user=BOB).matches(t) and not TraceFilter(outcome="denied").matches(t)
    assert is_turn_id("0123456789abcdef" * 2) and not is_turn_id("$event:localhost")


def test_forget_takes_only_the_pointers_to_their_turns() -> None:
    pointers = [(b"trace:event:$a", b"t1"), (b"trace:event:$b", b"t2"), (b"trace:event:$c", None)]
    assert their_trace_pointers(pointers, ["t1", "t3"]) == [b"trace:event:$a"]


def test_vagent_trace_prints_the_turn_without_terminal_escapes() -> None:
    t = trace(
        ToolCallTrace(
            name="calendar__note",
            source="mcp:calendar",
            arguments={"api_key": "[REDACTED]"},
            confirmation_asked=True,
            confirmation_answer="yes",
            confirmation_seconds=3.25,
            credential_used=True,
            duration_ms=42.0,
            result_chars=120,
        ),
        ToolCallTrace(name="delete_records", decision="denied", outcome="denied", scope=ResultScope()),
        ToolCallTrace(name="list_my_tickets", scope=ResultScope(personal_to=ALICE)),
        ToolCallTrace(name="from_an_older_version"),
    )
    t.llm_calls.append(LlmCallTrace(model="m", purpose="tools", input_tokens=100, output_tokens=7))
    q3 = ResultScope(
        domain="acme", documents=(DocRef(doc_id="q3", category="finance", tags=("conf\x1bidential",)),)
    )
    t.sources.append(
        SourceTrace(kind="document", id="q3", title="Q3 \x1b[2Jreport", room_may_see=False, scope=q3)
    )
    text = "\n".join(describe(t))
    assert f"Turn {'a' * 32}: answered" in text and "1 (100 tokens in, 7 out)" in text
    note = "calendar__note  mcp:calendar  allowed  ok  42 ms  confirmation asked, answered yes after 3.2 s"
    assert note in text
    assert "with the user's credential" in text and '"api_key": "[REDACTED]"' in text
    assert "delete_records  builtin  denied  denied  0 ms\n" in text  # derived from nobody's data
    assert "list_my_tickets  builtin  allowed  ok  0 ms  derived from personal to @alice:localhost" in text
    assert "from_an_older_version  builtin  allowed  ok  0 ms  scope not recorded" in text
    assert (
        "document q3 'Q3 ?[2Jreport'  (for the asker only)  [acme: document q3 (finance; conf?idential)]"
        in text
    )
    assert "\x1b" not in text
    assert header(COLUMNS).startswith("STARTED (UTC)")
    assert table_row(t).split()[1:4] == ["a" * 32, "answered", ALICE]
