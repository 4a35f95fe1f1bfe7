"""The offline model: says it is offline, routes obvious requests to OFFERED tools only."""

from __future__ import annotations

from langchain_core.messages import HumanMessage, ToolMessage

from vagent_graph.offline_model import OfflineChatModel, plan_reply
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
    assert "offline" in str(reply.content) and "access" in str(reply.content)


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
    assert not refused.tool_calls and "list_my_tickets" in str(refused.content)


def test_files_are_answered_from_what_the_model_was_given() -> None:
    from vagent_graph.attachments import ReadFile, turn_content
    from vagent_graph.file_messages import FILES_KEY
    from vagent_graph.intake import file_facts

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
