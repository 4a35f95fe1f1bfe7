"""A server's tool list as registry Tools, offered and checked exactly like built-in ones.

Names: the server's tool `create_event` of server `calendar` is `calendar__create_event`. An
OpenAI function name allows `[A-Za-z0-9_-]`, at most 64 characters: a tool whose full name
does not fit is skipped with a warning naming it (never mangled into another tool's name).
Grants: `tool:calendar__create_event`, or `mcp_server:calendar` for all of the server's tools.
Descriptions are cut (a hostile server must not flood the prompt); an input schema that is
not a JSON-schema object is refused (the tool is skipped), and the model's arguments are
checked against the schema before anything is sent. A server brings at most MCP_MAX_TOOLS
tools whose specs together fit in MCP_MAX_SCHEMA_CHARS (every model call carries them): the
first ones in the order it lists them; the others are skipped, and the caller says so.

Confirmation, `confirm: auto`: `readOnlyHint` is the server's claim. It is believed when the
operator trusts the server (`trust_annotations: true`); otherwise it is believed only for a
tool that cannot send anything (its schema takes no argument at all), since whatever the
model puts into arguments leaves with the call.

Titles: the question asking to confirm a call names the tool by its title (the MCP
annotations' `title`, else the tool's `title`, else the first sentence of its description),
cleaned (`tool_title`): one line of at most MAX_TITLE_CHARS, no markup or question marks,
invisible characters escaped, so a hostile server's title cannot fake the question.

Building Tools costs CPU (a schema check and a pydantic model per tool: ~20 ms each): the
caller runs `build_tools` off the event loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from mcp.types import Tool as McpTool
from pydantic import BaseModel, ConfigDict, model_validator

from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.tools.base import LabelFn, RunFn, Tool, readable_name
from vagent_graph.tools.confirmation import visible
from vagent_shared.access import mcp_server

log = structlog.get_logger(__name__)

#: Makes the `run` of one of a server's tools, by the server's name for it.
RunFnFactory = Callable[[str], RunFn]

SEPARATOR = "__"
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_DESCRIPTION_CHARS = 1000
MAX_SCHEMA_CHARS = 20_000
MAX_ERRORS_SHOWN = 5
#: A tool's `description` is read only this far before it is cleaned up and cut.
_DESCRIPTION_READ = 20 * MAX_DESCRIPTION_CHARS


MAX_TITLE_CHARS = 80
#: Read this far into a title or description for the title (the rest never matters).
_TITLE_READ = 2000
#: What a title must not carry into a question: Markdown and HTML markup, question marks
#: (a title that asks its own question), brackets (a fake "(yes/no)").
_NOT_IN_TITLE = re.compile(r"[*_`~#|<>\[\]{}()?\\]")
_SENTENCE_END = re.compile(r"(?<=[.!;:])\s")


def clean_title(raw: str) -> str:
    """`raw` as one short line a person reads in a question: white space runs (line breaks,
    long runs of spaces) as one space, markup and question marks dropped, invisible
    characters escaped (`visible`), at most MAX_TITLE_CHARS (cut at a word, with "…")."""
    text = " ".join(_NOT_IN_TITLE.sub(" ", raw[:_TITLE_READ]).split())
    text = text.strip(" .,;:!-")
    if len(text) > MAX_TITLE_CHARS:
        cut = text[: MAX_TITLE_CHARS - 1]
        text = (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" .,;:!-") + "…"
    return visible(text)  # escapes make it longer, at most ten times


def tool_title(tool: McpTool) -> str:
    """What the confirmation calls an MCP tool: its annotations' title, else its title, else
    the first sentence of its description, cleaned (`clean_title`); else its name, readable."""
    hints = tool.annotations
    for raw in (hints.title if hints is not None else None, tool.title):
        if isinstance(raw, str) and clean_title(raw):
            return clean_title(raw)
    if isinstance(tool.description, str):
        first = _SENTENCE_END.split(" ".join(tool.description[:_TITLE_READ].split()), maxsplit=1)[0]
        if clean_title(first):
            return clean_title(first)
    return clean_title(readable_name(tool.name)).capitalize() or "A tool"


def result_label(label: str) -> LabelFn:
    """What a personal result of an MCP tool shows, for the question to a group room (never
    its internal name)."""
    return lambda _: label


def exposed_name(server: str, tool: str) -> str | None:
    """`server__tool`, or None when that is no valid function name."""
    name = f"{server}{SEPARATOR}{tool}"
    return name if _FUNCTION_NAME.match(name) else None


def takes_arguments(schema: dict[str, Any]) -> bool:
    """Can a call of a tool with this input schema carry anything to the server?"""
    return bool(schema.get("properties")) or schema.get("additionalProperties", True) is not False


def needs_confirmation(server: McpServerConfig, tool: McpTool, schema: dict[str, Any] | None = None) -> bool:
    """`auto`: only a tool that says it is read-only runs without asking, and only where that
    claim is believed (module docstring)."""
    if tool.name in server.confirm_tools or server.confirm == "always":
        return True
    if server.confirm == "never":
        return False
    hints = tool.annotations
    if not (hints is not None and hints.readOnlyHint is True):
        return True
    if schema is None:
        schema = tool.inputSchema if isinstance(tool.inputSchema, dict) else {}
    return not server.trust_annotations and takes_arguments(schema)


def arguments_model(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model that lets through exactly the arguments `schema` accepts."""
    validator = Draft202012Validator(schema)

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

        @model_validator(mode="before")
        @classmethod
        def _schema(cls, data: Any) -> Any:
            errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
            if errors:
                shown = [
                    f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message[:200]}"
                    for e in errors[:MAX_ERRORS_SHOWN]
                ]
                raise ValueError("; ".join(shown))
            return data

    Arguments.__name__ = Arguments.__qualname__ = f"Arguments_{name}"
    return Arguments


def _schema_of(tool: McpTool) -> dict[str, Any] | None:
    """The tool's input schema if it is an object schema of a sane size (cheap: checking it
    is a valid JSON schema, which is not, comes once it fits the budget)."""
    schema = tool.inputSchema
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return None
    if len(repr(schema)) > MAX_SCHEMA_CHARS:
        return None
    return {"type": "object", **schema}


def _valid(schema: dict[str, Any]) -> bool:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return False
    return True


@dataclass(frozen=True)
class Skipped:
    tool: str
    #: invalid_name | invalid_schema | max_tools | schema_budget (| name_taken: servers.py)
    reason: str


def spec_chars(name: str, description: str, parameters: dict[str, Any]) -> int:
    """What one tool adds to every model call: its function spec (Tool.openai_schema), as JSON."""
    spec = {"name": name, "description": description, "parameters": parameters}
    return len(json.dumps({"type": "function", "function": spec}, ensure_ascii=False))


def build_tools(
    server: McpServerConfig,
    listed: list[McpTool],
    make_run: RunFnFactory,
    *,
    max_tools: int = 128,
    max_schema_chars: int = 200_000,
) -> tuple[list[Tool], list[Skipped]]:
    """The registry Tools of `server`'s listed tools that the agent uses (at most
    `max_tools`, their specs together at most `max_schema_chars`), and what was skipped and
    why (the caller logs it)."""
    tools: list[Tool] = []
    skipped: list[Skipped] = []
    budget = max_schema_chars
    for t in listed:
        if not server.offers(t.name):
            continue
        name = exposed_name(server.name, t.name)
        if name is None:
            skipped.append(Skipped(f"{server.name}{SEPARATOR}{t.name}"[:100], "invalid_name"))
            continue
        if len(tools) >= max_tools:
            skipped.append(Skipped(name, "max_tools"))
            continue
        schema = _schema_of(t)
        if schema is None:
            skipped.append(Skipped(name, "invalid_schema"))
            continue
        description = " ".join(str(t.description or t.title or t.name)[:_DESCRIPTION_READ].split())
        if len(description) > MAX_DESCRIPTION_CHARS:
            description = description[: MAX_DESCRIPTION_CHARS - 1] + "…"
        size = spec_chars(name, description, schema)
        if size > budget:
            skipped.append(Skipped(name, "schema_budget"))
            continue
        if not _valid(schema):
            skipped.append(Skipped(name, "invalid_schema"))
            continue
        budget -= size
        title = tool_title(t)
        tools.append(
            Tool(
                name=name,
                description=description,
                args_model=arguments_model(name, schema),
                run=make_run(t.name),
                requires_confirmation=needs_confirmation(server, t, schema),
                requires_credentials=server.credential == "user",
                credential_resource=server.credential_resource,
                parameters=schema,
                server=server.name,
                origin=server.origin,
                grants=(mcp_server(server.name),),
                title=title,
                personal_label=result_label(f"the result of “{title}” ({server.name} server)"),
            )
        )
    return tools, skipped
