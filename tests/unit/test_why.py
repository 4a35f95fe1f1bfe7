"""🔍 / `!why`: what asks for an account, and the account itself (the audience rule in a group room)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vagent_bot.rendering import render_markdown
from vagent_bot.routing import parse_message, should_answer
from vagent_bot.why import account, duration, expired_notice, is_why_command, is_why_reaction, kept_for
from vagent_shared.traces import LlmCallTrace, SourceTrace, ToolCallTrace, TurnTrace

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def full_trace(**kw: object) -> TurnTrace:
    """A turn with a document search, a confirmed tool with the user's credential, an MCP call
    whose result was the asker's alone, and a denied tool."""
    fields: dict[str, object] = {
        "turn_id": "t1",
        "session_id": "!room:localhost:main:@alice:localhost",
        "user_id": "@alice:localhost",
        "outcome": "answered",
        "total_ms": 14_250.0,
        "first_token_ms": 1_300.0,
        "llm_calls": [
            LlmCallTrace(
                model="gpt-x",
                purpose="tools",
                input_tokens=1200,
                output_tokens=40,
                first_token_ms=350,
                duration_ms=900,
                started_at=at(0),
            ),
            LlmCallTrace(
                model="gpt-x",
                purpose="answer",
                input_tokens=2100,
                output_tokens=180,
                first_token_ms=300,
                duration_ms=2400,
                started_at=at(12),
            ),
        ],
        "tool_calls": [
            ToolCallTrace(name="search_documents", result_chars=2345, duration_ms=120, started_at=at(1)),
            ToolCallTrace(
                name="delete_records",
                confirmation_asked=True,
                confirmation_answer="yes",
                confirmation_seconds=8.0,
                credential_used=True,
                duration_ms=40,
                started_at=at(2),
            ),
            ToolCallTrace(
                name="list_events",
                source="mcp:calendar",
                room_may_see=False,
                result_chars=99,
                started_at=at(3),
            ),
            ToolCallTrace(name="drop_table", decision="denied", outcome="denied", started_at=at(4)),
        ],
        "sources": [
            SourceTrace(kind="document", id="doc-7", title="Travel policy"),
            SourceTrace(kind="document", id="doc-secret", title="Alice's salary review", room_may_see=False),
        ],
    }
    fields.update(kw)
    return TurnTrace.model_validate(fields)


@pytest.mark.parametrize("key", ["🔍", "🔍\ufe0f", "🔎", "🔎\ufe0f", " 🔍 "])
def test_magnifying_glasses_ask_why(key: str) -> None:
    assert is_why_reaction(key)


@pytest.mark.parametrize("key", ["✅", "❌", "👍", "🔍🔍", "", "why", "\ufe0f"])
def test_other_reactions_do_not(key: str) -> None:
    assert not is_why_reaction(key)


@pytest.mark.parametrize("text", ["!why", "!WHY", "  !Why ", "!why is that"])
def test_why_command(text: str) -> None:
    assert is_why_command(text)


@pytest.mark.parametrize("text", ["why", "!whyy", "why?", "! why", "please !why", "!ai why", ""])
def test_not_a_why_command(text: str) -> None:
    assert not is_why_command(text)


def test_why_after_the_prefix_or_as_a_reply_in_a_group_room() -> None:
    """`!ai !why` and a reply `!why` to the bot's answer reach `is_why_command` as `!why`."""
    cases = [
        ({"msgtype": "m.text", "body": "!ai !why"}, None),
        (
            {
                "msgtype": "m.text",
                "body": "> <@vagent:example.org> The answer\n\n!why",
                "m.relates_to": {"m.in_reply_to": {"event_id": "$answer"}},
            },
            "@vagent:example.org",
        ),
    ]
    for content, replied_to in cases:
        raw = {"type": "m.room.message", "event_id": "$e", "sender": "@a:example.org", "content": content}
        msg = parse_message(raw, "!r:example.org")
        assert msg is not None
        decision = should_answer(
            msg,
            bot_user_id="@vagent:example.org",
            bot_display_name="vagent",
            is_dm=False,
            prefix="!ai",
            replied_to_sender=replied_to,
            bot_in_thread=False,
        )
        assert decision.answer and is_why_command(decision.text)


def test_the_asker_in_a_dm_sees_every_step_source_token_and_time() -> None:
    text = account(full_trace(), group=False)
    lines = text.splitlines()
    assert lines[0] == ("🔍 **How this answer came about:** ✅ answered in 14.2 s, first words after 1.3 s")
    steps = [line for line in lines if line[:2] in {f"{i}." for i in range(1, 10)}]
    assert steps == [
        "1. 🧠 `gpt-x` chose tools · 1,200 in / 40 out tokens · first token after 350 ms · 900 ms",
        "2. 🔧 `search_documents` (built-in) · done, 2,345 characters back · 120 ms",
        "3. 🔧 `delete_records` (built-in) · asked first, you said **yes** after 8.0 s · "
        "🔑 with your credential · done · 40 ms",
        "4. 🔧 `list_events` (mcp:calendar) · done, 99 characters back",
        "5. 🔧 `drop_table` (built-in) · ⛔ not allowed for you · denied",
        "6. 🧠 `gpt-x` wrote the answer · 2,100 in / 180 out tokens · first token after 300 ms · 2.4 s",
    ]
    assert "- 📄 Travel policy (`doc-7`)" in lines
    assert "- 📄 Alice's salary review (`doc-secret`)" in lines
    assert "Not shown here" not in text
    assert lines[-1] == "**Total:** 3,300 in / 220 out tokens · 2 model calls · 4 tool calls · 14.2 s"
    html = render_markdown(text)
    assert html.count("<li>") == 8 and "<ol>" in html  # six steps, two sources


def test_in_a_group_room_only_what_the_room_may_see_is_named() -> None:
    text = account(full_trace(group=True), group=True)
    assert "list_events" not in text and "calendar" not in text
    assert "salary" not in text and "doc-secret" not in text
    assert "search_documents" in text and "Travel policy" in text and "drop_table" in text
    assert "🔒 Not shown here: 1 step and 1 source only you may see." in text
    assert "**Total:** 3,300 in / 220 out tokens" in text


def test_the_room_may_see_everything_nothing_is_hidden() -> None:
    trace = full_trace(tool_calls=[], sources=[SourceTrace(kind="entity", id="e1", title="ACME")])
    text = account(trace, group=True)
    assert "Not shown here" not in text and "- 🗂️ ACME (`e1`)" in text


def test_only_hidden_steps() -> None:
    trace = full_trace(
        llm_calls=[], sources=[], tool_calls=[ToolCallTrace(name="my_mail", room_may_see=False)]
    )
    text = account(trace, group=True)
    assert "my_mail" not in text and "**Steps**" not in text and "No model call" not in text
    assert "🔒 Not shown here: 1 step only you may see." in text


def test_an_empty_turn() -> None:
    trace = TurnTrace(turn_id="t", session_id="!r:l:main:@a:l", user_id="@a:l", total_ms=12)
    text = account(trace, group=False)
    assert text.splitlines()[0] == "🔍 **How this answer came about:** ✅ answered in 12 ms"
    assert "No model call and no tool were needed." in text
    assert text.splitlines()[-1] == "**Total:** 0 in / 0 out tokens · 0 model calls · 0 tool calls · 12 ms"


def test_a_failed_turn_names_its_reason_and_unreported_usage() -> None:
    trace = TurnTrace(
        turn_id="t",
        session_id="!r:l:main:@a:l",
        user_id="@a:l",
        outcome="failed",
        reason="llm_unavailable",
        total_ms=65_000,
        llm_calls=[LlmCallTrace(model="m", duration_ms=60_000)],
    )
    text = account(trace, group=False)
    assert (
        text.splitlines()[0] == "🔍 **How this answer came about:** ⚠️ failed (`llm_unavailable`) in 1 min 5 s"
    )
    assert "🧠 `m` wrote the answer · tokens not reported · 1 min" in text


def test_an_over_budget_turn_made_no_model_call() -> None:
    trace = TurnTrace(
        turn_id="t", session_id="!r:l:main:@a:l", user_id="@a:l", outcome="over_budget", reason="user_daily"
    )
    text = account(trace, group=True)
    assert "🪫 over the token budget (`user_daily`)" in text
    assert "0 model calls" in text


def test_a_confirmation_answered_in_words_is_not_quoted() -> None:
    """Only yes/no are shown: other words the user gave are theirs (and may be personal)."""
    trace = full_trace(
        tool_calls=[
            ToolCallTrace(
                name="ask_user", confirmation_asked=True, confirmation_answer="my flat is at 5 Elm St"
            ),
            ToolCallTrace(name="delete_records", confirmation_asked=True, outcome="asked"),
            ToolCallTrace(name="x", confirmation_asked=True, confirmation_answer="No", outcome="declined"),
        ]
    )
    text = account(trace, group=False)
    assert "Elm" not in text and "asked first, you answered · done" in text
    assert "asked for your confirmation · waiting for your answer" in text
    assert "you said **no** · declined" in text


def test_tool_arguments_are_never_shown() -> None:
    trace = full_trace(
        tool_calls=[ToolCallTrace(name="database_query", arguments={"query": "SELECT secret"})]
    )
    assert "SELECT" not in account(trace, group=False)


@pytest.mark.parametrize(
    "ms,shown", [(0, "0 ms"), (999.4, "999 ms"), (1000, "1.0 s"), (59_940, "59.9 s"), (120_000, "2 min")]
)
def test_durations(ms: float, shown: str) -> None:
    assert duration(ms) == shown


def test_how_long_details_are_kept() -> None:
    assert kept_for(7 * 86400) == "7 days" and kept_for(86400) == "1 day" and kept_for(7200) == "2 hours"
    assert kept_for(60) == "1 hour"
    assert expired_notice(604800) == (
        "🔍 I no longer have the details of that answer (they are kept 7 days)."
    )
