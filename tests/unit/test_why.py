"""🔍 / `!why`: what asks for an account, and the account itself: the audience rule, judged
against whoever reads the room when the account is asked for (not the turn's readers)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.acl_strategies import ADVERSARIAL_TAGS, audiences, contexts
from tests.support.factories import ac
from vagent_bot.answers.rendering import render_markdown
from vagent_bot.conversation.routing import parse_message, should_answer
from vagent_bot.why.account import (
    account,
    duration,
    expired_notice,
    is_why_command,
    is_why_reaction,
    kept_for,
    memories_line,
    memory_place,
    memory_rooms,
    unscoped_only,
)
from vagent_shared.access import AcContext
from vagent_shared.knowledge import PUBLIC_TAG, Audience, AudienceMember
from vagent_shared.readers import DocRef, EntityRef, Readership, ResultScope
from vagent_shared.traces import LlmCallTrace, MemoryTrace, SourceTrace, ToolCallTrace, TurnTrace

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
ALICE = "@alice:localhost"
#: alice reads HR and public documents; bob HR too; carol public documents only.
ALICE_AC = ac(ALICE, ["document_category:hr", "document_tag:public"])
BOB_AC = ac("@bob:localhost", ["document_category:hr", "document_tag:public"])
CAROL_AC = ac("@carol:localhost", ["document_tag:public"])
TRAVEL = ResultScope(domain="acme", documents=(DocRef(doc_id="doc-7", category="policy", tags=("public",)),))
SALARY = ResultScope(domain="acme", documents=(DocRef(doc_id="doc-secret", category="hr"),))
MINE = ResultScope(personal_to=ALICE)


def readers(*members: AcContext | str) -> Readership:
    """Alice and, now in the room, `members` (a user id: the provider did not answer for them)."""
    if not members:
        return Readership(ALICE_AC, None)
    listed = [
        AudienceMember(user_id=m, ac_context=None)
        if isinstance(m, str)
        else AudienceMember(user_id=m.user_id, ac_context=m)
        for m in members
    ]
    return Readership(ALICE_AC, Audience(members=listed, member_count=len(listed) + 2))


ALONE = readers().may_read


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def full_trace(**kw: object) -> TurnTrace:
    """A turn with a document search, a confirmed tool with the user's credential, an MCP call
    whose result was the asker's alone, and a denied tool."""
    fields: dict[str, object] = {
        "turn_id": "t1",
        "session_id": "!room:localhost:main:@alice:localhost",
        "user_id": ALICE,
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
            ToolCallTrace(
                name="search_documents", result_chars=2345, duration_ms=120, started_at=at(1), scope=TRAVEL
            ),
            ToolCallTrace(
                name="delete_records",
                scope=ResultScope(),
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
                scope=MINE,
                result_chars=99,
                started_at=at(3),
            ),
            ToolCallTrace(
                name="drop_table", decision="denied", outcome="denied", started_at=at(4), scope=ResultScope()
            ),
        ],
        "sources": [
            SourceTrace(kind="document", id="doc-7", title="Travel policy", scope=TRAVEL),
            SourceTrace(kind="document", id="doc-secret", title="Alice's salary review", scope=SALARY),
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
    text = account(full_trace(), ALONE)
    lines = text.splitlines()
    assert lines[0] == ("🔍 **How this answer came about:** ✅ answered in 14.2 s, first words after 1.3 s")
    steps = [line for line in lines if line[:2] in {f"{i}." for i in range(1, 10)}]
    assert steps == [
        "1. 🧠 `gpt-x` chose tools · 1,200 in / 40 out tokens · first token after 350 ms · 900 ms",
        "2. 🔧 `search_documents` (built-in) · done, 2,345 characters back · 120 ms",
        "3. 🔧 `delete_records` (built-in) · asked first, you said **yes** after 8.0 s · "
        "🔑 with your credential · done · 40 ms",
        "4. 🔧 `list_events` (mcp:calendar) · done, 99 characters back",
        "5. 🔧 a tool you were not offered · ⛔ not run",
        "6. 🧠 `gpt-x` wrote the answer · 2,100 in / 180 out tokens · first token after 300 ms · 2.4 s",
    ]
    assert "- 📄 Travel policy (`doc-7`)" in lines
    assert "- 📄 Alice's salary review (`doc-secret`)" in lines
    assert "Withheld" not in text and "drop_table" not in text  # never offered: never named
    assert lines[-1] == "**Total:** 3,300 in / 220 out tokens · 2 model calls · 4 tool calls · 14.2 s"
    html = render_markdown(text)
    assert html.count("<li>") == 8 and "<ol>" in html  # six steps, two sources


def test_in_a_group_room_only_what_everyone_there_may_read_is_named() -> None:
    text = account(full_trace(group=True), readers(CAROL_AC).may_read)
    assert "list_events" not in text and "calendar" not in text
    assert "salary" not in text and "doc-secret" not in text
    assert "search_documents" in text and "Travel policy" in text and "a tool you were not offered" in text
    assert "🔒 Withheld here: 1 step and 1 source not everyone in this room may see." in text
    assert "**Total:** 3,300 in / 220 out tokens" in text


def test_the_readers_are_those_of_the_room_now_not_of_the_turn() -> None:
    """Finding 1: asked alone (a DM), or with bob (HR too): the salary review is named. Carol
    joined since: it is withheld, and so is the personal step, whoever read the turn."""
    for turn_was_group in (False, True):
        trace = full_trace(group=turn_was_group)
        assert "Alice's salary review (`doc-secret`)" in account(trace, ALONE)
        with_bob = account(trace, readers(BOB_AC).may_read)
        assert "Alice's salary review (`doc-secret`)" in with_bob and "list_events" not in with_bob
        newcomer = account(trace, readers(BOB_AC, CAROL_AC).may_read)
        assert "salary" not in newcomer and "doc-secret" not in newcomer and "list_events" not in newcomer
        assert "🔒 Withheld here: 1 step and 1 source" in newcomer
        unknown = account(trace, readers(BOB_AC, "@dave:localhost").may_read)  # no AcContext for dave
        assert "doc-secret" not in unknown and "Travel policy" not in unknown
        assert "🔒 Withheld here: 2 steps and 2 sources" in unknown


def test_members_unknown_only_what_derives_from_nothing_is_named() -> None:
    text = account(full_trace(), unscoped_only)
    assert "Travel policy" not in text and "doc-secret" not in text and "list_events" not in text
    assert "delete_records" in text and "a tool you were not offered" in text
    assert "🔒 Withheld here: 2 steps and 2 sources not everyone in this room may see." in text


def test_items_of_an_older_trace_are_named_only_to_the_asker_alone() -> None:
    """Stored before scopes were recorded: only the turn's judgement (`room_may_see`), which
    knew nothing of who joined since. Named while nobody else reads the room; a file (the
    asker's own message here) is named as the room's history shows it."""
    old = {
        "turn_id": "t",
        "session_id": "!r:localhost:main:@alice:localhost",
        "user_id": ALICE,
        "tool_calls": [{"name": "search_documents", "room_may_see": True}],
        "sources": [
            {"kind": "document", "id": "layoffs", "title": "Layoff plan Q3", "room_may_see": True},
            {"kind": "file", "id": "notes.txt", "title": "notes.txt"},
        ],
    }
    trace = TurnTrace.model_validate(old)
    assert "Layoff plan Q3" in account(trace, ALONE) and "search_documents" in account(trace, ALONE)
    text = account(trace, readers(CAROL_AC).may_read)
    assert "Layoff" not in text and "layoffs" not in text and "search_documents" not in text
    assert "📎 notes.txt" in text and "🔒 Withheld here: 1 step and 1 source" in text


def test_the_room_may_see_everything_nothing_is_hidden() -> None:
    ent = ResultScope(domain="acme", entities=(EntityRef(id="e1", entity_type="customer", tags=("public",)),))
    trace = full_trace(
        tool_calls=[ToolCallTrace(name="search_documents", scope=TRAVEL)],
        sources=[
            SourceTrace(kind="document", id="doc-7", title="Travel policy", scope=TRAVEL),
            SourceTrace(kind="entity", id="e1", title="ACME", scope=ent),
        ],
    )
    alice, carol = (ac(u, ["document_tag:public", "entity_tag:public"]) for u in (ALICE, "@carol:localhost"))
    room = Audience(members=[AudienceMember(user_id=carol.user_id, ac_context=carol)], member_count=3)
    text = account(trace, Readership(alice, room).may_read)
    assert "Withheld" not in text and "- 🗂️ ACME (`e1`)" in text and "Travel policy" in text


def test_only_hidden_steps() -> None:
    trace = full_trace(llm_calls=[], sources=[], tool_calls=[ToolCallTrace(name="my_mail", scope=MINE)])
    text = account(trace, readers(BOB_AC).may_read)
    assert "my_mail" not in text and "**Steps**" not in text and "No model call" not in text
    assert "🔒 Withheld here: 1 step not everyone in this room may see." in text


def test_an_empty_turn() -> None:
    trace = TurnTrace(turn_id="t", session_id="!r:l:main:@a:l", user_id="@a:l", total_ms=12)
    text = account(trace, ALONE)
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
    text = account(trace, ALONE)
    assert (
        text.splitlines()[0] == "🔍 **How this answer came about:** ⚠️ failed (`llm_unavailable`) in 1 min 5 s"
    )
    assert "🧠 `m` wrote the answer · tokens not reported · 1 min" in text


def test_an_over_budget_turn_made_no_model_call() -> None:
    trace = TurnTrace(
        turn_id="t", session_id="!r:l:main:@a:l", user_id="@a:l", outcome="over_budget", reason="user_daily"
    )
    text = account(trace, readers(CAROL_AC).may_read)
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
    text = account(trace, ALONE)
    assert "Elm" not in text and "asked first, you answered · done" in text
    assert "asked for your confirmation · waiting for your answer" in text
    assert "you said **no** · declined" in text


def test_tool_arguments_are_never_shown() -> None:
    trace = full_trace(
        tool_calls=[ToolCallTrace(name="database_query", arguments={"query": "SELECT secret"})]
    )
    assert "SELECT" not in account(trace, ALONE)


# ---- property: the account names an item iff everyone reading the room now may read it ----------

DOMAINS = ["acme", "globex"]
LABELS = ["hr", "policy", "finance", *ADVERSARIAL_TAGS]
DOC_IDS = ["d0", "d1", "d2"]
doc_grants = st.one_of(
    st.builds(
        lambda kind, name: f"{kind}:{name}",
        st.sampled_from(["document", "document_category", "document_tag"]),
        st.sampled_from([*LABELS, *DOC_IDS]),
    ),
    st.sampled_from(["tool:search_documents", "entity:*", "document_tag:public|confidential"]),
)
docs = st.builds(
    DocRef,
    doc_id=st.sampled_from(DOC_IDS),
    category=st.sampled_from(LABELS),
    tags=st.lists(st.sampled_from(LABELS), max_size=2).map(tuple),
)


def may_read_doc(ctx: AcContext, domain: str, doc: DocRef) -> bool:
    """The oracle, from the AcContext alone: the active domain, and id OR category OR a tag."""
    return ctx.active_acl_domain == domain and (
        ctx.can_access(f"document:{doc.doc_id}")
        or ctx.can_access(f"document_category:{doc.category}")
        or any(ctx.can_access(f"document_tag:{t}") for t in doc.tags)
    )


def everyone_may_read(asker: AcContext, audience: Audience | None, domain: str, doc: DocRef) -> bool:
    if audience is not None and audience.public_only and PUBLIC_TAG not in doc.tags:
        return False
    members = [m.ac_context for m in audience.members] if audience else []
    return may_read_doc(asker, domain, doc) and all(
        m is not None and may_read_doc(m, domain, doc) for m in members
    )


@st.composite
def rooms_and_items(
    draw: st.DrawFn,
) -> tuple[AcContext, Audience | None, list[tuple[str, DocRef]], bool]:
    asker = draw(contexts(doc_grants, DOMAINS, empty_one_in=10))
    audience = draw(audiences(doc_grants, DOMAINS, asker.active_acl_domain))
    items = draw(st.lists(st.tuples(st.sampled_from(DOMAINS), docs), max_size=5))
    return asker, audience, items, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(case=rooms_and_items())
def test_an_item_is_named_iff_everyone_reading_now_may_read_it(
    case: tuple[AcContext, Audience | None, list[tuple[str, DocRef]], bool],
) -> None:
    asker, audience, items, personal = case
    sources = [
        SourceTrace(
            kind="document", id=doc.doc_id, title=f"Title-{i}-", scope=ResultScope(domain=d, documents=(doc,))
        )
        for i, (d, doc) in enumerate(items)
    ]
    tools = (
        [ToolCallTrace(name="my_tickets", scope=ResultScope(personal_to=asker.user_id))] if personal else []
    )
    trace = TurnTrace(
        turn_id="t",
        session_id=f"!r:x:main:{asker.user_id}",
        user_id=asker.user_id,
        sources=sources,
        tool_calls=tools,
    )
    text = account(trace, Readership(asker, audience).may_read)
    withheld = 0
    for i, (d, doc) in enumerate(items):
        allowed = everyone_may_read(asker, audience, d, doc)
        assert (f"Title-{i}-" in text) == allowed, (i, doc, d, asker.granted_instances(), audience)
        withheld += not allowed
    alone = audience is None or (not audience.public_only and not audience.members)
    assert ("my_tickets" in text) == (personal and alone)
    hidden_steps = int(personal and not alone)
    if withheld or hidden_steps:
        assert "🔒 Withheld here: " in text
        assert (f"{withheld} source" in text) == bool(withheld) and (f"{hidden_steps} step" in text) == bool(
            hidden_steps
        )
    else:
        assert "Withheld" not in text


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


# ---- memories the turn recalled (docs/memory.md) -------------------------------------------
HERE = "!room:localhost"
ALICE_DM = "!alicedm:localhost"
HR_ROOM = "!hr-layoffs-2026:localhost"
RECALLED = [
    MemoryTrace(id="m-1", created_at=datetime(2026, 11, 3, 9, 30, tzinfo=UTC), room_id=HERE),
    MemoryTrace(id="m-2", created_at=datetime(2026, 11, 1, 23, 59, tzinfo=UTC), room_id=ALICE_DM),
    MemoryTrace(id="m-3", created_at=datetime(2026, 10, 28, tzinfo=UTC), room_id=HR_ROOM),
]


def test_the_account_lists_the_memories_used_by_date_and_place_never_their_text_or_other_rooms() -> None:
    trace = full_trace(memories=RECALLED)
    assert memory_rooms(trace) == {ALICE_DM, HR_ROOM}
    text = account(trace, ALONE, dm_rooms={ALICE_DM})
    assert (
        "🧠 3 memories recalled: from 3 Nov 2026 (this room), from 1 Nov 2026 (a direct chat), "
        "from 28 Oct 2026 (another room)"
    ) in text.splitlines()
    assert "hr-layoffs" not in text and HR_ROOM not in text and ALICE_DM not in text
    assert "m-1" not in text  # ids mean nothing to a reader
    assert text.splitlines()[-1].startswith("**Total:**")


def test_one_memory_and_none() -> None:
    assert memories_line(RECALLED[:1], here=HERE) == "🧠 1 memory recalled: from 3 Nov 2026 (this room)"
    assert memories_line([], here=HERE) == ""
    assert "recalled" not in account(full_trace(), ALONE)


@pytest.mark.parametrize(
    "room_id,shown",
    [(HERE, "this room"), (ALICE_DM, "a direct chat"), (HR_ROOM, "another room"), ("", "outside Matrix")],
)
def test_where_a_memory_was_written_names_only_the_current_room(room_id: str, shown: str) -> None:
    assert memory_place(room_id, here=HERE, dm_rooms={ALICE_DM}) == shown
