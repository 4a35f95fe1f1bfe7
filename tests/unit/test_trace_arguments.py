"""Tool arguments as a turn trace keeps them for 7 days (trace_arguments.py): the audit
trail's rule, plus every string counted as free text unless the tool's schema makes it a
choice or a date, free text only with OTEL_CAPTURE_CONTENT, and a cap on the whole."""

from __future__ import annotations

import json
import re
import secrets
from enum import Enum
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from vagent_graph.observability.trace_arguments import MAX_TRACE_ARGUMENTS_CHARS, trace_arguments
from vagent_graph.tools.catalogue import default_registry

#: An MCP server's tool: `title` and `notes` are no "content" names, but they are words.
MCP_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "notes": {"type": "string"},
        "when": {"type": "string", "format": "date-time"},
        "visibility": {"type": "string", "enum": ["private", "team"]},
        "attendees": {"type": "array", "items": {"type": "string"}},
        "minutes": {"type": "integer"},
    },
}
KEY = f"sk-proj-{secrets.token_hex(16)}"


def test_mcp_free_text_is_left_out_choices_dates_and_numbers_kept() -> None:
    args = {
        "title": "Merger with Globex",
        "notes": "closes on 3 March, keep it quiet",
        "when": "2026-12-01T10:00:00Z",
        "visibility": "private",
        "attendees": ["@bob:localhost"],
        "minutes": 30,
        "api_key": KEY,
    }
    assert trace_arguments(args, MCP_SCHEMA, capture=False) == {
        "title": "[omitted: 18 chars]",
        "notes": "[omitted: 32 chars]",
        "when": "2026-12-01T10:00:00Z",
        "visibility": "private",
        "attendees": "[omitted: 18 chars]",
        "minutes": 30,
        "api_key": "[REDACTED]",
    }


def test_with_capture_free_text_is_kept_as_the_audit_trail_keeps_content() -> None:
    args = {"title": f"Merger, key {KEY}", "notes": "x" * 500, "password": "hunter2"}
    kept = trace_arguments(args, MCP_SCHEMA, capture=True)
    assert kept["title"] == "Merger, key [REDACTED]"
    assert kept["notes"].startswith("x" * 200) and kept["notes"].endswith("(500 chars)")
    assert kept["password"] == "[REDACTED]"


def test_a_value_the_schema_does_not_allow_is_free_text() -> None:
    assert trace_arguments({"visibility": "everyone, and the Q3 figures"}, MCP_SCHEMA, capture=False) == {
        "visibility": "[omitted: 28 chars]"
    }
    assert trace_arguments({"extra": "anything"}, MCP_SCHEMA, capture=False) == {
        "extra": "[omitted: 8 chars]"
    }
    assert trace_arguments({"title": "t"}, None, capture=False) == {"title": "[omitted: 1 chars]"}


def test_built_in_tools_keep_their_choices_and_dates() -> None:
    registry = default_registry()

    def schema(name: str) -> dict[str, Any]:
        tool = registry.get(name)
        assert tool is not None
        parameters: dict[str, Any] = tool.openai_schema()["function"]["parameters"]
        return parameters

    assert trace_arguments({"older_than": "2016-01-01"}, schema("delete_records"), False) == {
        "older_than": "2016-01-01"
    }
    ticket = {"title": "Printer jam", "description": "Floor 3", "priority": "low"}
    assert trace_arguments(ticket, schema("create_ticket"), False) == {
        "title": "[omitted: 11 chars]",
        "description": "[omitted: 7 chars]",
        "priority": "low",
    }
    assert trace_arguments({"query": "Q3 revenue"}, schema("search_documents"), False) == {
        "query": "[omitted: 10 chars]"
    }


def test_pydantic_enums_behind_a_ref_are_choices() -> None:
    class Colour(Enum):
        RED = "red"

    class Args(BaseModel):
        colour: Colour
        colours: list[Colour] = []

    schema = Args.model_json_schema()
    assert "$ref" in json.dumps(schema)
    assert trace_arguments({"colour": "red", "colours": ["red"]}, schema, False) == {
        "colour": "red",
        "colours": ["red"],
    }


def test_names_that_look_like_secrets_are_masked_too() -> None:
    kept = trace_arguments({KEY: 1, "x" * 100: 2}, None, capture=False)
    assert KEY not in json.dumps(kept)
    assert "[REDACTED]" in kept and "x" * 64 in kept and all(len(k) <= 64 for k in kept)


def test_the_whole_is_capped() -> None:
    numbers = list(range(10**12, 10**12 + 300))
    kept = trace_arguments({f"a{i}": numbers for i in range(15)}, None, capture=False)  # kept, too many
    assert len(json.dumps(kept)) <= MAX_TRACE_ARGUMENTS_CHARS + 100
    assert kept["a0"] == numbers[:20]  # the audit rule: 20 items of a list
    assert kept["a6"] == "[omitted: 4500 chars]"  # no room for it: its size
    assert kept["…"].endswith("more arguments]")  # no room even for that: how many are left out
    many = trace_arguments({f"name{i:03}": i for i in range(40)}, None, capture=False)
    assert many["…"] == "[20 more arguments]"


WORD = st.text(st.characters(categories=["L", "N", "P", "Zs"]), min_size=8, max_size=40)
NAME = st.one_of(st.sampled_from(list(MCP_SCHEMA["properties"])), st.text(max_size=20))
VALUE = st.one_of(WORD, st.lists(WORD, max_size=3), st.dictionaries(WORD, WORD, max_size=2))


@settings(max_examples=150, deadline=None)
@given(args=st.dictionaries(NAME, VALUE))
def test_without_capture_no_free_text_survives(args: dict[str, Any]) -> None:
    """Whatever the names and values (under the schema's own names too: a `date-time` field
    holding words), none of the words is kept, and the whole stays within the cap."""
    kept = trace_arguments(args, MCP_SCHEMA, capture=False)
    values = json.dumps(list(kept.values()), ensure_ascii=False)
    shown = re.sub(r"\[omitted: \d+ chars\]|\[REDACTED\]|\[\d+ more arguments\]", "", values)
    words = [
        w
        for v in args.values()
        for w in ([v] if isinstance(v, str) else [*v, *v.values()] if isinstance(v, dict) else v)
    ]
    assert not [w for w in words if json.dumps(w, ensure_ascii=False)[1:-1] in shown]
    assert len(json.dumps(kept)) <= MAX_TRACE_ARGUMENTS_CHARS + 100


def test_a_date_field_holding_words_is_free_text() -> None:
    words = "the merger closes on 3 March"
    assert trace_arguments({"when": words}, MCP_SCHEMA, False) == {"when": f"[omitted: {len(words)} chars]"}
