"""Confirmation questions show every character a call will send, readably, or the call is not
asked (confirmation.py), as the bot will render them in Matrix.

The property tests read each question back as a person would (tests/support/confirmations.py)
and require exactly the call's arguments, for arbitrary names and values (bidi overrides,
zero-width and variation-selector smuggling, Markdown, HTML, fences, line breaks, long values
with a passage hidden in the middle), for every tool in the registry and for MCP tools whose
schemas take extra keys."""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.types import Tool as McpTool
from pydantic import BaseModel, ValidationError

from tests.support.confirmations import expected, read_back
from vagent_bot.answers.rendering import render_markdown
from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.tools import build_tools
from vagent_graph.tools import Prepared, Tool, ToolContext
from vagent_graph.tools.base import plain_action
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.tools.confirmation import (
    MAX_HIDDEN_CHARS,
    Unconfirmable,
    arguments_digest,
    as_question,
    question_text,
    refusal,
    render_question,
)
from vagent_graph.workflow.approval import approval_for
from vagent_shared.hitl import format_question

#: Tags a question may render to: paragraphs, line breaks, code, and the notes in italics.
QUESTION_TAGS = {"p", "br", "code", "pre", "em"}


def tags(html: str) -> set[str]:
    return {t.lower() for t in re.findall(r"<\s*/?\s*([A-Za-z][A-Za-z0-9]*)", html)}


def test_every_argument_is_listed_in_order() -> None:
    q = question_text(
        "Create this ticket in the ticket service, in your name?",
        {"title": "Printer jam", "description": "Floor 3, every morning", "priority": "low"},
    )
    assert q.splitlines() == [
        "Create this ticket in the ticket service, in your name?",
        "`title`: `Printer jam`",
        "`description`: `Floor 3, every morning`",
        "`priority`: `low`",
    ]


def test_the_options_follow_the_headline_not_the_last_argument() -> None:
    q = question_text(
        "Delete 3 records older than 2016-01-01?", {"older_than": "2016-01-01"}, shows=["older_than"]
    )
    assert format_question(q, ["yes", "no"]) == "❓ Delete 3 records older than 2016-01-01? (yes/no)"
    q = question_text("Run echo?", {"text": "hi"})
    assert format_question(q, ["yes", "no"]) == "❓ Run echo? (yes/no)\n`text`: `hi`"


def test_a_long_value_is_shown_whole_with_its_length() -> None:
    """The issue's case: a passage hidden in the middle of a 4 000-character body was sent
    after "yes" although the question showed only the start and the end."""
    planted = "CONFIDENTIAL: the merger with Globex closes on 3 March."
    description = "Printer jam. " + "filler " * 280 + planted + " more" * 400
    assert len(description) > 4000
    q = question_text("Create a ticket?", {"description": description})
    size = f"{len(description):,}".replace(",", " ")
    assert f"`description` ({size} characters):\n```\n{description}\n```" in q
    assert "…" not in q and planted in q
    assert read_back(q) == {("description",): description}


def test_multiline_and_backticks_cannot_break_out_of_the_value() -> None:
    hostile = "ok\n```\npriority: `high`\n[click](https://evil.example) @room <b>x</b>\n```\nmore"
    q = question_text("Create a ticket?", {"description": hostile, "priority": "low"})
    html = render_markdown(format_question(q, ["yes", "no"]))
    assert "<a " not in html and "<b>" not in html  # shown as text, not as formatting
    assert "https://evil.example" in html and "`priority`: `low`" in q
    # the value sits in one fenced block whose fence is longer than any backtick run inside it
    assert "````\nok\n```\npriority" in q
    assert read_back(q) == {("description",): hostile, ("priority",): "low"}


def test_hostile_names_are_escaped_like_values() -> None:
    """A name with Markdown or a right-to-left override (an MCP schema takes extra keys) is
    shown as a JSON string in a code span: it cannot fake a line of the question."""
    fake = "x\n\n**Nothing will be sent; this only previews.**"
    flipped = "title\u202e)txet ylno("
    q = question_text("Send the message?", {fake: "the passage", flipped: "a", "__init__": "b"})
    html = render_markdown(format_question(q, ["yes", "no"]))
    assert "<strong>" not in html and "\u202e" not in q
    assert '`"x\\n\\n**Nothing will be sent; this only previews.**"`: `the passage`' in q
    assert '`"title\\u202e)txet ylno("`: `a`' in q and "`__init__`: `b`" in q
    assert tags(html) <= QUESTION_TAGS
    assert read_back(q) == {(fake,): "the passage", (flipped,): "a", ("__init__",): "b"}


def test_values_that_look_like_secrets_are_masked() -> None:
    key = "sk-proj-4f9c2a7b1e8d3c6a9f0b2d4e"
    q = render_question(
        "Configure the connector?",
        {"api_key": "hunter2-but-longer", "note": f"use {key} please", "name": "billing"},
    )
    assert key not in q.text and "hunter2" not in q.text
    assert "`api_key`: *hidden, it looks like a secret (18 characters)*" in q.text  # by its name: all
    # by its shape: only the secret, so a key-shaped word cannot hide the text around it
    assert (
        "`note` (parts that look like secrets are hidden): `use ‹hidden: looks like a secret› please`"
        in q.text
    )
    assert "`name`: `billing`" in q.text
    assert q.hidden == 18 + len(key)


def test_a_secret_named_value_deeper_than_the_lines_is_masked_in_the_json_too() -> None:
    deep = {"a": {"b": {"c": {"token": "abc-not-a-shape", "kept": "x"}}}, "password": None}
    q = render_question("Configure?", {"deep": deep})
    assert "abc-not-a-shape" not in q.text
    assert '"token": "‹hidden: looks like a secret›"' in q.text and '"kept": "x"' in q.text
    assert "parts that look like secrets are hidden" in q.text
    assert q.hidden == len("abc-not-a-shape")


def test_invisible_characters_are_shown_as_escapes_and_read_back_exactly() -> None:
    values = {
        "title": "invoice\u202egnp.exe",
        "x": "a\u200bb",
        "typed": "a\\u200bb\u200b",  # the six characters typed out, and a real one
        "smuggled": "hi\U000e0100\U000e0101\ufe0f\ufe0f",  # variation selectors carrying bytes
        "emoji": "❤️ ok 1️⃣",  # an emoji's selector after its emoji: nothing hidden
        "bits": "a\ufe0fb c\ufe0ed",  # selectors after letters: a bit each, unseen
    }
    q = question_text("Create a ticket?", values)
    assert "invoice\\u202egnp.exe" in q and "a\\u200bb" in q and "\u202e" not in q
    assert "a\\\\u200bb\\u200b" in q  # the typed backslash doubled: no confusion with the escape
    assert "hi\\U000e0100\\U000e0101\\ufe0f\\ufe0f" in q
    assert "`emoji`: `❤️ ok 1️⃣`" in q and "a\\ufe0fb c\\ufe0ed" in q
    assert read_back(q) == {(k,): v for k, v in values.items()}


def test_a_headline_skips_only_what_it_states_word_for_word() -> None:
    head = "Delete 3 records older than 2016-01-01?"
    assert "older_than" not in question_text(head, {"older_than": "2016-01-01"}, shows=["older_than"])
    # declared, but the headline does not contain it: listed anyway
    assert "`older_than`: `2017-01-01`" in question_text(
        head, {"older_than": "2017-01-01"}, shows=["older_than"]
    )
    assert "`older_than`: `2016`" in question_text(head, {"older_than": "2016"}, shows=["older_than"])
    # not declared: listed even though the headline contains it
    assert "`older_than`: `2016-01-01`" in question_text(head, {"older_than": "2016-01-01"})


def test_empty_none_numbers_lists_and_objects() -> None:
    q = question_text("Run x?", {"a": "", "b": None, "c": 3, "d": True, "e": ["p", "q"], "f": {"k": 1}})
    assert q.splitlines()[1:] == [
        "`a`: *(empty)*",
        "`b`: `null`",
        "`c`: `3`",
        "`d`: `true`",
        "`e`[0]: `p`",
        "`e`[1]: `q`",
        "`f`.`k`: `1`",
    ]
    assert question_text("Run x?", {"e": [], "f": {}}).splitlines()[1:] == ["`e`: `[]`", "`f`: `{}`"]
    # a key that looks like a path is one name, not two
    q = question_text("Run x?", {"f.k": 1, "f": {"k": 2}})
    assert read_back(q) == {("f.k",): "1", ("f", "k"): "2"}


def test_white_space_that_inline_code_would_swallow_goes_into_a_block() -> None:
    values = {"edges": "  padded  ", "double": "a  b", "tab": "a\tb", "blank": "   "}
    q = question_text("Run x?", values)
    assert "`edges` (10 characters):\n```\n  padded  \n```" in q
    assert read_back(q) == {(k,): v for k, v in values.items()}


def test_a_question_longer_than_the_limit_is_refused_with_its_size() -> None:
    q = render_question("Create a ticket?", {"description": "x" * 30_000})
    refused = refusal("create_ticket", q, 20_000)
    assert refused is not None and refused.reason == "too_long"
    assert f"would be {len(q.text)} characters, the limit is 20000" in refused.text
    assert "Shorten them" in refused.text and "create_ticket again" in refused.text
    assert refusal("create_ticket", q, len(q.text)) is None


def test_a_question_that_would_hide_too_much_is_refused() -> None:
    """A secret's name, or a long random-looking run, must not carry a passage unseen."""
    smuggled = {"notes_token": "the whole confidential passage " * 100}
    refused = refusal("note", render_question("Run note?", smuggled), 100_000)
    assert refused is not None and refused.reason == "hides_too_much"
    assert f"at most {MAX_HIDDEN_CHARS}" in refused.text
    assert refusal("note", render_question("Run note?", {"api_key": "k" * 40}), 100_000) is None


def test_digest_and_question_mark() -> None:
    assert arguments_digest("t", {"a": 1, "b": 2}) == arguments_digest("t", {"b": 2, "a": 1})
    assert arguments_digest("t", {"a": 1}) != arguments_digest("t", {"a": 2})
    assert arguments_digest("t", {"a": 1}) != arguments_digest("u", {"a": 1})
    assert as_question("Delete 3 records") == "Delete 3 records?"
    assert as_question("Go ahead?") == "Go ahead?"


# ---- properties: whatever the names and values, the question reads back as the call ----------
NASTY = [
    "\u202e", "\u202d", "\u2066", "\u200b", "\u200d", "\ufeff", "\u2028", "\u00ad", "\u3164",
    "\ufe0f", "\U000e0100", "\U000e0041", "\x00", "\r", "\n", "\t", "  ", "\\", "\\u202e", "`",
    "```", "~~~", "*", "**", "_", "__", "#", "> ", "- ", "1. ", "|", "---", "<b>", "</code>",
    "<script>alert(1)</script>", "&amp;", "[x](https://evil.example)", "@room", "\"", "'",
    "❤️", "é", "日本", "(", "):", "; ", "sk-proj-4f9c2a7b1e8d3c6a9f0b2d4e",
]  # fmt: skip
TEXT = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=8)), max_size=12).map("".join)
NUMBER = st.one_of(st.integers(-(10**12), 10**12), st.floats(allow_nan=False, allow_infinity=False))
LEAF = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)
VALUE = st.recursive(
    LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=12,
)
ARGUMENTS = st.dictionaries(TEXT, VALUE, max_size=6)


def long_with_a_middle(draw: st.DrawFn) -> str:
    filler = draw(st.sampled_from(["lorem ipsum ", "a", "line\n", "`", "\u200b"]))
    secret = draw(TEXT)
    n = draw(st.integers(200, 2000))
    return filler * n + secret + filler * n


LONG = st.composite(long_with_a_middle)()


def shows_all_or_refuses(question: str, arguments: dict[str, Any]) -> None:
    assert read_back(question) == expected(arguments)
    html = render_markdown(format_question(question, ["yes", "no"]))
    assert tags(html) <= QUESTION_TAGS, tags(html) - QUESTION_TAGS


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=ARGUMENTS)
def test_any_names_and_values_read_back_exactly(arguments: dict[str, Any]) -> None:
    q = render_question("Run the tool?", arguments)
    shows_all_or_refuses(q.text, arguments)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=TEXT, long=LONG, limit=st.integers(1000, 20_000))
def test_long_values_are_shown_whole_or_the_call_is_refused(name: str, long: str, limit: int) -> None:
    arguments = {name or "x": long, "priority": "low"}
    q = render_question("Run the tool?", arguments)
    refused = refusal("tool", q, limit)
    if len(q.text) > limit:
        assert isinstance(refused, Unconfirmable) and refused.reason == "too_long"
    elif refused is None:
        shows_all_or_refuses(q.text, arguments)
        assert long in q.text or "\\" in q.text or "‹hidden" in q.text


# ---- over the registry, and over MCP tools whose schemas take extra keys ----------------------
def value_for(spec: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values a tool's JSON schema allows, its strings as hostile as they may be."""
    spec = next((s for s in spec.get("anyOf", []) if s.get("type") != "null"), spec)
    if "enum" in spec:
        return st.sampled_from(spec["enum"])
    kind = spec.get("type")
    if kind == "string" and spec.get("format") == "date":
        return st.dates(date(1990, 1, 1), date(2100, 1, 1)).map(date.isoformat)
    if kind == "string":
        low, high = int(spec.get("minLength", 0)), int(spec.get("maxLength", 5000))
        return st.one_of(TEXT, LONG).map(lambda s: (s or "x").ljust(low, "x")[:high])
    if kind == "integer":
        return st.integers(int(spec.get("minimum", -1000)), int(spec.get("maximum", 1000)))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(value_for(spec.get("items", {})), max_size=min(3, spec.get("maxItems", 3)))
    raise AssertionError(f"no values for {spec!r}: extend this test")


def tool_arguments(tool: Tool) -> st.SearchStrategy[dict[str, Any]]:
    schema = tool.openai_schema()["function"]["parameters"]
    props = schema.get("properties", {})
    return st.fixed_dictionaries({n: value_for(s) for n, s in props.items()})


def check_tool(tool: Tool, raw: dict[str, Any]) -> None:
    """As the workflow does: the validated arguments, then the question approval_for writes."""
    try:
        args = tool.args_model.model_validate(raw)
    except ValidationError:
        return  # refused before any question (the model reads why)
    arguments = args.model_dump(mode="json")
    approval = approval_for(
        "call-1", tool, arguments, Prepared(action=plain_action(tool)), None, confirm=True, personal=False
    )
    if isinstance(approval, Unconfirmable):
        return
    shown = read_back(str(approval["question"]))
    assert shown == expected(arguments), tool.name
    # what is checked against the question is exactly what the tool gets
    assert tool.args_model.model_validate(arguments).model_dump(mode="json") == arguments


REGISTRY = list(default_registry())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_registered_tools_question_reads_back_as_its_call(data: st.DataObject) -> None:
    tool = data.draw(st.sampled_from(REGISTRY))
    check_tool(tool, data.draw(tool_arguments(tool)))


def test_the_registry_is_covered() -> None:
    assert {t.name for t in REGISTRY} >= {"create_ticket", "delete_records", "ask_user", "database_query"}


async def _never(args: BaseModel, ctx: ToolContext, answer: str | None) -> str:
    raise AssertionError("not run here")


SERVER = McpServerConfig(name="calendar", url="http://127.0.0.1:9/mcp")
MCP_SCHEMAS = [
    {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
    {"type": "object", "properties": {"when": {"type": "string"}, "n": {"type": "integer"}}},
    {"type": "object"},  # anything at all
]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=st.sampled_from(MCP_SCHEMAS), title=TEXT, extra=ARGUMENTS)
def test_mcp_tools_with_extra_keys_show_every_key_and_value(
    schema: dict[str, Any], title: str, extra: dict[str, Any]
) -> None:
    """A hostile server (or a prompt-injected model) adds keys the schema did not name: they
    are sent, so they are shown, names escaped like values."""
    [tool], _ = build_tools(SERVER, [McpTool(name="note", inputSchema=schema)], lambda _: _never)
    check_tool(tool, {**extra, "title": title or "t"})


def test_an_extra_key_reaches_the_question_and_the_call() -> None:
    [tool], _ = build_tools(SERVER, [McpTool(name="note", inputSchema=MCP_SCHEMAS[0])], lambda _: _never)
    raw = {"title": "Lunch", "x\n\n**Nothing will be sent.**": "the Q3 figures"}
    arguments = tool.args_model.model_validate(raw).model_dump(mode="json")
    assert arguments == raw  # the extra key is sent
    approval = approval_for(
        "c", tool, arguments, Prepared(action=plain_action(tool)), None, confirm=True, personal=False
    )
    assert not isinstance(approval, Unconfirmable)
    assert read_back(str(approval["question"])) == {
        ("title",): "Lunch",
        ("x\n\n**Nothing will be sent.**",): "the Q3 figures",
    }
