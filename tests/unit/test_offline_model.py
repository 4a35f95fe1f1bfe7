"""The offline model: says it is offline, routes obvious requests to OFFERED tools only."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import yaml
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from vagent_graph.models.offline_model import (
    CALENDAR_CREATE,
    CALENDAR_LIST,
    OfflineChatModel,
    plan_reply,
    quote_passages,
)
from vagent_graph.tools.catalogue import default_registry

REG = default_registry()


def offered(*names: str) -> list[dict[str, object]]:
    return [t.openai_schema() for t in REG if t.name in names]


def test_delete_request_becomes_a_delete_call() -> None:
    reply = plan_reply(
        [HumanMessage(content="Please delete records older than 2020")],
        offered("delete_records", "database_query"),
    )
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [
        ("delete_records", {"older_than": "2020-01-01"})
    ]


def test_count_request_becomes_a_query() -> None:
    reply = plan_reply(
        [HumanMessage(content="how many records are older than 2019-06-30?")], offered("database_query")
    )
    assert reply.tool_calls[0]["name"] == "database_query"
    assert "2019-06-30" in reply.tool_calls[0]["args"]["sql"]


def test_never_calls_a_tool_it_was_not_offered() -> None:
    reply = plan_reply([HumanMessage(content="delete records older than 2020")], offered("database_query"))
    assert not reply.tool_calls
    assert "I can't do that here." in str(reply.content) and "delete_records" not in str(reply.content)


def test_otherwise_says_it_is_offline_and_what_it_can_do() -> None:
    text = str(plan_reply([HumanMessage(content="hello")], offered("database_query")).content)
    assert "without a language model" in text
    assert "count or list records" in text and "delete" not in text


def test_tool_results_are_summarised() -> None:
    reply = plan_reply([ToolMessage(content="Deleted 5 records.", tool_call_id="x")], [])
    assert "Deleted 5 records." in str(reply.content)


async def test_streams_word_by_word_with_usage() -> None:
    model = OfflineChatModel()
    chunks = [c async for c in model.astream([HumanMessage(content="hi")])]
    text = "".join(str(c.content) for c in chunks)
    assert text.startswith("(offline model)") and len(chunks) > 5
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.usage_metadata and total.usage_metadata["output_tokens"] > 0


def test_questions_search_the_documents_and_people_questions_the_graph() -> None:
    tools = offered("search_documents", "lookup_entities", "database_query")
    (search,) = plan_reply([HumanMessage(content="What is the per diem?")], tools).tool_calls
    assert (search["name"], search["args"]) == ("search_documents", {"query": "What is the per diem?"})
    (who,) = plan_reply([HumanMessage(content="Who is Ana Costa?")], tools).tool_calls
    assert (who["name"], who["args"]) == ("lookup_entities", {"query": "Ana Costa"})
    (path,) = plan_reply([HumanMessage(content="How is Ana Costa connected to Fabrikam?")], tools).tool_calls
    assert path["args"] == {"query": "Ana Costa", "depth": 2}
    helped = plan_reply([HumanMessage(content="What can you do?")], tools)
    assert not helped.tool_calls and "search the documents you may read" in str(helped.content)
    records = plan_reply([HumanMessage(content="how many records are older than 2019?")], tools)
    assert records.tool_calls[0]["name"] == "database_query"  # records requests keep their tools
    assert not plan_reply(
        [HumanMessage(content="What is the per diem?")], offered("database_query")
    ).tool_calls


def test_search_results_are_quoted_with_their_citations() -> None:
    result = (
        "2 passages from documents you may read. Cite them as [n] where you use them.\n\n"
        "[1] Travel policy — Per diem (document travel-policy)\n"
        "The per diem is EUR 60 for domestic trips. It covers meals.\n\n"
        "[2] Handbook (document employee-handbook)\nWelcome to Northwind."
    )
    reply = plan_reply([ToolMessage(content=result, tool_call_id="x", name="search_documents")], [])
    text = str(reply.content)
    assert "- The per diem is EUR 60 for domestic trips. It covers meals. [1]" in text
    assert "- Welcome to Northwind. [2]" in text
    nothing = ToolMessage(
        content="No passages in the documents you may read match this search.", tool_call_id="y"
    )
    nothing.name = "search_documents"
    assert "No passages" in str(plan_reply([nothing], []).content)


def test_ticket_requests_become_ticket_calls() -> None:
    tools = offered("list_my_tickets", "create_ticket", "search_documents")
    cases = {
        "what are my open tickets?": ("list_my_tickets", {"status": "open"}),
        "show my closed tickets": ("list_my_tickets", {"status": "closed"}),
        "list all my tickets": ("list_my_tickets", {"status": "all"}),
        "open a ticket about the broken printer": (
            "create_ticket",
            {"title": "the broken printer", "priority": "normal"},
        ),
        "Please create a new high priority ticket: VPN is down!": (
            "create_ticket",
            {"title": "VPN is down", "priority": "high"},
        ),
    }
    for text, (name, args) in cases.items():
        call = plan_reply([HumanMessage(content=text)], tools).tool_calls[0]
        assert (call["name"], call["args"]) == (name, args), text
    refused = plan_reply([HumanMessage(content="what are my open tickets?")], offered("search_documents"))
    assert not refused.tool_calls and "I can't do that here." in str(refused.content)
    assert "list_my_tickets" not in str(refused.content)


def test_files_are_answered_from_what_the_model_was_given() -> None:
    from vagent_graph.attachments import ReadFile, turn_content
    from vagent_graph.attachments.messages import FILES_KEY
    from vagent_graph.turn.intake import file_facts

    pdf = ReadFile(
        "report.pdf",
        "application/pdf",
        "document",
        900,
        text="[page 1]\nQ3 report\nRevenue up 12%.\nChurn 3%.\nMore.",
        pages=2,
    )
    shot = ReadFile(
        "shot.png",
        "image/png",
        "image",
        50_000,
        image=b"\x89PNG",
        image_mime="image/png",
        width=800,
        height=600,
    )
    human = HumanMessage(
        content=turn_content("summarise this", [pdf, shot], vision=False, max_tokens=1000),
        additional_kwargs={FILES_KEY: [file_facts(pdf), file_facts(shot)]},
    )
    reply = str(plan_reply([human], []).content)
    assert (
        "`report.pdf` (application/pdf, 2 pages) begins:\n> Q3 report\n> Revenue up 12%.\n> Churn 3%."
        in reply
    )
    assert "More." not in reply and "[page 1]" not in reply
    assert "`shot.png` is an image (image/png, 800×600 pixels, 49 KB)" in reply and "cannot see" in reply


# ---- issue 30: hidden stays hidden, readable results, its own examples work ------------------

ROOT = Path(__file__).resolve().parents[2]
KNOWLEDGE = ROOT / "deploy" / "dev" / "knowledge"
#: Wednesday 18 Nov 2026: the demo calendar's busy week (deploy/dev/calendar.yaml).
NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)


def calendar_tools() -> list[dict[str, object]]:
    """The demo calendar MCP server's tools as a model is offered them."""
    return [
        {"type": "function", "function": {"name": name, "description": "", "parameters": {"type": "object"}}}
        for name in (CALENDAR_LIST, CALENDAR_CREATE)
    ]


def everything() -> list[dict[str, object]]:
    return [t.openai_schema() for t in REG] + calendar_tools()


#: Requests the offline model routes to a tool, and that tool.
ROUTED = {
    "delete records older than 2020": "delete_records",
    "how many records are older than 2020?": "database_query",
    "list the records": "database_query",
    "which database? ask me": "ask_user",
    "who is Ana Costa?": "lookup_entities",
    "what is the per diem?": "search_documents",
    "what are my open tickets?": "list_my_tickets",
    "open a ticket about the printer": "create_ticket",
    "what is on my calendar this week?": CALENDAR_LIST,
    "book a design review with @bob:localhost on 2026-12-01 at 10:00": CALENDAR_CREATE,
}


def test_a_tool_that_was_not_offered_is_never_called_nor_named() -> None:
    """Adversarial: every routed request, offered everything BUT its tool: no call, and no
    internal tool name anywhere in the reply (a hidden tool stays hidden)."""
    names = {str(t["function"]["name"]) for t in everything()}  # type: ignore[index]
    for text, tool in ROUTED.items():
        assert plan_reply([HumanMessage(content=text)], everything()).tool_calls[0]["name"] == tool, text
        lacking = [t for t in everything() if t["function"]["name"] != tool]  # type: ignore[index]
        reply = plan_reply([HumanMessage(content=text)], lacking, NOW)
        assert all(c["name"] != tool for c in reply.tool_calls), text
        content = str(reply.content)
        # internal names (`a_b`, `server__tool`), and the withheld tool's in any form ("remember",
        # a plain word, may be said when that tool is offered: the help's example says it)
        assert not [n for n in names if n in content and (n == tool or "_" in n)], (text, content)
        if not reply.tool_calls:
            assert content.startswith("(offline model) ") and "have access" not in content, content


def test_refusals_and_a_no_are_said_to_the_person() -> None:
    def after(content: str, name: str = CALENDAR_CREATE) -> str:
        return str(
            plan_reply(
                [ToolMessage(content=content, tool_call_id="x", name=name, status="error")], []
            ).content
        )

    said_no = "The user said no: calendar__create_event was NOT run; nothing was changed. Tell them so."
    assert after(said_no) == "(offline model) You said no; nothing was changed."
    assert after("The user declined. delete_records was NOT run; nothing was changed.", "delete_records") == (
        "(offline model) You said no; nothing was changed."
    )
    assert after("I can't do that here.") == "(offline model) I can't do that here."
    denied = after("Access denied: the tool 'calendar__list_events' is not available to this user.")
    assert denied == "(offline model) I can't do that here."
    failed = after("calendar__create_event failed: title: must not be empty")
    assert "calendar__" not in failed and "create event failed: title: must not be empty" in failed


def test_the_calendar_question_asks_for_its_period_and_lists_only_it() -> None:
    question = HumanMessage(content="what is on my calendar this week?")
    (call,) = plan_reply([question], calendar_tools(), NOW).tool_calls
    assert call["args"] == {"start": "2026-11-16T00:00:00+00:00", "end": "2026-11-23T00:00:00+00:00"}
    (today,) = plan_reply(
        [HumanMessage(content="What is on my calendar today?")], calendar_tools(), NOW
    ).tool_calls
    assert today["args"] == {"start": "2026-11-18T00:00:00+00:00", "end": "2026-11-19T00:00:00+00:00"}
    events = [
        {"id": "E-1001", "title": "Quarterly planning", "start": "2026-11-16T09:00:00+00:00",
         "end": "2026-11-16T10:30:00+00:00", "attendees": ["@bob:localhost"]},
        {"id": "E-1004", "title": "Team offsite", "start": "2026-12-03T09:00:00+00:00",
         "end": "2026-12-03T17:00:00+00:00", "attendees": []},
    ]  # fmt: skip
    listed = ToolMessage(content=json.dumps({"events": events}), tool_call_id=call["id"], name=CALENDAR_LIST)
    answer = str(plan_reply([question, AIMessage(content="", tool_calls=[call]), listed], [], NOW).content)
    assert answer == (
        "(offline model) Your calendar this week (1 event):\n"
        "- Mon 16 Nov 09:00–10:30 Quarterly planning (with @bob:localhost)"
    )
    empty = ToolMessage(content='{"events": []}', tool_call_id=call["id"], name=CALENDAR_LIST)
    nothing = plan_reply([question, AIMessage(content="", tool_calls=[call]), empty], [], NOW)
    assert nothing.content == "(offline model) Nothing on your calendar this week."


def test_a_booking_and_a_count_are_answered_in_a_sentence() -> None:
    booked = {"id": "E-1008", "title": "design review", "start": "2026-12-01T10:00:00+00:00",
              "end": "2026-12-01T10:30:00+00:00", "attendees": ["@bob:localhost"]}  # fmt: skip
    reply = plan_reply(
        [ToolMessage(content=json.dumps(booked), tool_call_id="x", name=CALENDAR_CREATE)], [], NOW
    )
    assert reply.content == (
        "(offline model) Booked 'design review' on Tue 1 Dec 10:00–10:30 with @bob:localhost (E-1008)."
    )
    count = plan_reply([ToolMessage(content="records: 0", tool_call_id="y", name="database_query")], [], NOW)
    assert count.content == "(offline model) There are 0 matching records."


def test_delete_old_records_asks_which_year_and_the_answer_deletes() -> None:
    tools = offered("delete_records", "ask_user", "database_query")
    human = HumanMessage(content="delete old records")
    (ask,) = plan_reply([human], tools).tool_calls
    assert (ask["name"], ask["args"]) == (
        "ask_user",
        {"question": "Delete records older than which year?", "options": ["2018", "2020", "2022"]},
    )
    answered = ToolMessage(content="The user answered: 2020", tool_call_id=ask["id"], name="ask_user")
    (delete,) = plan_reply([human, AIMessage(content="", tool_calls=[ask]), answered], tools).tool_calls
    assert (delete["name"], delete["args"]) == ("delete_records", {"older_than": "2020-01-01"})
    vague = ToolMessage(content="The user answered: the old ones", tool_call_id=ask["id"], name="ask_user")
    again = plan_reply([human, AIMessage(content="", tool_calls=[ask]), vague], tools)
    assert not again.tool_calls and "nothing was deleted" in str(again.content)


def test_every_example_of_its_help_works_on_the_demo_data() -> None:
    """Each quoted example of the help is routed to the tool it advertises, and names what
    the demo data has (the person exists, the calendar day has events)."""
    help_text = str(plan_reply([HumanMessage(content="help")], everything()).content)
    examples = re.findall(r'"([^"]+)"', help_text)
    assert len(examples) >= 9, help_text
    for example in examples:
        if example in ("today", "tomorrow", "on 2026-11-16"):
            example = f"what is on my calendar {example}?"
        if example == "what do you remember about me?":  # answered from the recalled memories
            continue
        reply = plan_reply([HumanMessage(content=example)], everything(), NOW)
        assert reply.tool_calls, (example, reply.content)
    people = {
        e["name"] for e in json.loads((KNOWLEDGE / "entities" / "localhost.json").read_text())["entities"]
    }
    who = re.search(r'"who is ([^"?]+)\?"', help_text)
    assert who and who.group(1) in people
    seed = yaml.safe_load((ROOT / "deploy" / "dev" / "calendar.yaml").read_text())["events"]
    days = {str(e["start"])[:10] for events in seed.values() for e in events}
    assert "2026-11-16" in days and "on 2026-11-16" in help_text


def search_result(doc: str, question: str) -> str:
    """search_documents' text for one demo document's chunks, as tools/documents.py writes it."""
    from vagent_graph.knowledge.chunking import chunk_document
    from vagent_graph.knowledge.parsing import detect_format, parse_document

    path = next((KNOWLEDGE / "docs").rglob(f"{doc}.*"))
    parsed = parse_document(path.read_bytes(), detect_format(path.name), path.name)
    blocks = [f"[1] {parsed.title} (document {doc})\n{c.text.strip()}" for c in chunk_document(parsed)]
    head = f"{len(blocks)} passages from documents you may read. Cite them as [n] where you use them."
    return head + "\n\n" + "\n\n".join(blocks)


def test_the_salary_bands_question_quotes_the_figures() -> None:
    question = "What are the salary bands for engineers?"
    text = quote_passages(search_result("salary-bands-2026", question), question)
    for figures in (
        "E1 Junior Software Engineer: 52,000 to 60,000",
        "E5 Principal Engineer: 105,000 to 125,000",
    ):
        assert figures in text, text
    assert "HR-COMP-2026" not in text and text.endswith("[1]")
    # carol's answer: the handbook's wrapped prose reads as the sentence it is
    handbook = quote_passages(search_result("employee-handbook", question), question)
    assert "The bands themselves are confidential" in handbook, handbook


def test_a_quoted_list_item_has_one_bullet() -> None:
    result = "1 passages.\n\n[1] Q4 (document q4)\n- Revenue: 5.1 M EUR.\n* Costs: 3.6 M EUR."
    text = quote_passages(result, "what was the revenue?")
    assert "- Revenue: 5.1 M EUR. Costs: 3.6 M EUR. [1]" in text and "- -" not in text and "* " not in text


async def test_the_outlook_question_quotes_the_outlook_of_the_sample_pdf() -> None:
    from vagent_graph.attachments import ReadLimits, read_attachment, turn_content
    from vagent_graph.attachments.messages import FILES_KEY
    from vagent_graph.turn.intake import file_facts

    sample = ROOT / "deploy" / "dev" / "samples" / "report.pdf"
    limits = ReadLimits(max_bytes=10_000_000, timeout=60, memory_mb=1024, image_max_side=1024)
    pdf = await read_attachment("report.pdf", sample.read_bytes(), limits)

    def asked(question: str) -> str:
        human = HumanMessage(
            content=turn_content(question, [pdf], vision=False, max_tokens=4000),
            additional_kwargs={FILES_KEY: [file_facts(pdf)]},
        )
        return str(plan_reply([human], []).content)

    outlook = asked("what is the outlook?")
    assert "> Outlook: Q1 2027 revenue expected between 5.0 and 5.4 M EUR." in outlook, outlook
    assert "Quarterly report" not in outlook
    # a matching heading is quoted with what it heads (the samples README's docx question)
    notes = await read_attachment("notes.docx", (sample.parent / "notes.docx").read_bytes(), limits)
    human = HumanMessage(
        content=turn_content("what are my action items?", [notes], vision=False, max_tokens=4000),
        additional_kwargs={FILES_KEY: [file_facts(notes)]},
    )
    items = str(plan_reply([human], []).content)
    assert "> ## Action items\n> Bob: draft the API specification by 2026-12-04." in items, items
    assert "> Carol: update the onboarding guide" in items
    # nothing in the question matches: the document's first lines, as before
    assert "begins:\n> Quarterly report Q4 2026" in asked("summarise it")


def test_wrapped_prose_is_quoted_as_the_sentence_it_is() -> None:
    """Lines of a paragraph wrapped in the source join with a space, never a ";" (which
    only follows a list item), even when a line looks like `label: figures`."""
    result = (
        "1 passages.\n\n[1] Budget (document budget)\n"
        "The plan adds 38 people, from 243 to 281: 18 in engineering, 9 in sales and partnerships,\n"
        "5 in customer success, 3 in security.\n"
    )
    text = quote_passages(result, "how many people does the plan add in engineering?")
    assert (
        "- The plan adds 38 people, from 243 to 281: 18 in engineering, 9 in sales and partnerships, 5 in"
        in text
    )
    assert ";" not in text
