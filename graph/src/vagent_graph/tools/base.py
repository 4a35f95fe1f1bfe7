"""What a tool is, and what it gets and gives back; the workflow never names a tool.

A tool is data: a name, a description, an argument model, metadata
(`requires_confirmation`, `requires_credentials`, `personal`), an optional `prepare` step
that fixes what a confirmed call will do (its plan) before anybody is asked, an optional
`ask` step for a question whose answer the tool needs (`ask_user`), and `run`. What a tool
works with (stores, clients) comes from `ToolContext.services` (vagent_graph.services), looked
up by type, so a new capability brings its own service instead of a field here. Which tools
exist is the registry's business (registry.py, catalogue.py), not this module's.

The workflow, not the tool, writes confirmation questions (tools/confirmation.py): every argument
is shown, so no tool can hide one. `prepare` only contributes the headline ("Delete 129
records older than 2016-01-01") and the plan `run` gets back in `ToolContext.plan` once the
human said yes. A tool whose effect depends on state that may change meanwhile (a count, a
set of rows) checks the plan in `run` and answers `Changed` instead of acting on more.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from vagent_graph.services import Services
from vagent_graph.tools.scope import ResultScope
from vagent_shared.access import AcContext
from vagent_shared.credentials import CredentialResponse
from vagent_shared.knowledge import Audience, SourceRef


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call: who asks, in which session, who else reads the
    answer (`audience`, None in a DM), the sources already cited in this turn (so citation
    numbers continue), the services it may use, and, for a tool that `requires_credentials`,
    the asking user's own credential (fetched for this call only; never stored)."""

    ac: AcContext
    session_id: str
    services: Services = field(default_factory=Services)
    audience: Audience | None = None
    sources: tuple[SourceRef, ...] = ()
    credential: CredentialResponse | None = field(default=None, repr=False)
    #: What the human confirmed (`Prepared.plan`), for a call that was confirmed; else the
    #: plan `prepare` made for this call, or None for a tool without `prepare`.
    plan: dict[str, Any] | None = None
    #: What the model had seen in this conversation when it made the call: the union of the
    #: scopes of the tool results in its context (a memory written now records it).
    seen: ResultScope | None = None
    #: A group room whose readers are not checked (AUDIENCE_FILTER=off; `audience` is None).
    audience_unchecked: bool = False


@dataclass(frozen=True)
class ToolImage:
    """An image a tool returned: posted into the room after the answer (tool_images.py), not
    given to the model, which reads that it was shown. `data` is never checkpointed."""

    data: bytes = field(repr=False)
    name: str = "image"


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns when it has more than text: the documents its text cites (never
    shown to the model; they become the answer's "Sources:" list), and what the text was
    derived from (`scope`: which documents and entities; kept with the result in the
    session's history, so later turns withhold it from readers who may not read those)."""

    text: str
    sources: tuple[SourceRef, ...] = ()
    scope: ResultScope | None = None
    images: tuple[ToolImage, ...] = ()


@dataclass(frozen=True)
class Prepared:
    """What a call will do, fixed before the human is asked. `action` is the question's
    headline without its question mark ("Delete 129 records older than 2016-01-01"); `plan`
    (plain JSON, checkpointed with the question) is handed back to `run` as `ctx.plan`."""

    action: str
    plan: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NothingToDo:
    """`prepare` found nothing to act on: the model is told `text`; nobody is asked and the
    tool does not run (so rows appearing later are never touched by this call)."""

    text: str


@dataclass(frozen=True)
class Changed:
    """`run` found that what was confirmed no longer holds (more rows match now): it did
    nothing, and the human is asked again with the new figure (`prepared`). `reason` says
    what changed, for the new question."""

    prepared: Prepared
    reason: str


@dataclass(frozen=True)
class Question:
    """A question for the human. `confirm` questions cancel the call on "no";
    `input` questions pass the answer to `run`."""

    text: str
    options: list[str] = field(default_factory=list)
    kind: Literal["confirm", "input"] = "confirm"


def result_text(result: str | ToolResult | Changed) -> str:
    """The text the model reads, whichever way the tool answered."""
    if isinstance(result, Changed):
        return f"Not run: {result.reason}"
    return result.text if isinstance(result, ToolResult) else result


def readable_name(name: str) -> str:
    """`create_ticket` as "create ticket", `calendar__create_event` as "create event": a
    name a person can read, for a tool without a title."""
    return " ".join(name.rsplit("__", 1)[-1].replace("_", " ").replace("-", " ").split()) or name


def plain_action(tool: Tool) -> str:
    """The headline of the confirmation of a tool without `prepare`: its title (a built-in
    tool without one: "Use the database query tool"), the server an MCP tool comes from, and
    "in your name" when it acts with the asker's own credential (as the ticket question
    does). Never the internal `server__tool` name: that is for the trace and the logs."""
    if tool.title:
        action = tool.title
    elif tool.server is None:
        action = f"Use the {readable_name(tool.name)} tool"
    else:
        action = readable_name(tool.name).capitalize()
    if tool.server is not None:
        action += f" ({tool.server} server)"
    if tool.requires_credentials:
        action += ", in your name"
    return action


AskFn = Callable[[Any, ToolContext], Awaitable[Question | None]]
PrepareFn = Callable[[Any, ToolContext], Awaitable[Prepared | NothingToDo]]
RunFn = Callable[[Any, ToolContext, str | None], Awaitable[str | ToolResult | Changed]]
LabelFn = Callable[[Any], str]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    run: RunFn
    #: A question whose ANSWER the tool needs (ask_user); confirmations are not built here.
    ask: AskFn | None = None
    #: Fixes what a call will do before anybody is asked (see Prepared / NothingToDo).
    prepare: PrepareFn | None = None
    requires_confirmation: bool = False
    requires_credentials: bool = False
    #: The Credential Registry's resource_id of the system the tool acts on (default: its name).
    credential_resource: str | None = None
    #: Its result is the asking user's own (it acts with their credential, or returns their
    #: data): in a group room the asker is asked before the others see it
    #: (PERSONAL_RESULTS_IN_GROUPS). None: personal iff `requires_credentials`.
    personal: bool | None = None
    #: What a personal result shows, for that question ("your open tickets").
    personal_label: LabelFn | None = None
    #: Arguments the question's headline states itself (checked: a value the headline does
    #: not contain word for word is listed anyway).
    shows: tuple[str, ...] = ()
    #: The JSON schema the model is offered, when it is not `args_model`'s (an MCP tool's own).
    parameters: dict[str, Any] | None = None
    #: The MCP server the tool comes from (the agent uses it by listing the server); None:
    #: built in (the agent uses it by naming it in `tools:`).
    server: str | None = None
    #: What the tool acts on beyond its name (an MCP tool: its server's `origin`); a
    #: confirmation is bound to it, so after a configuration change a "yes" never runs
    #: another server's tool of the same name. None: built in.
    origin: str | None = None
    #: Resource instances that grant the tool besides `tool:<name>` (`mcp_server:<server>`).
    grants: tuple[str, ...] = ()
    #: What a person calls it ("Book a calendar event"): the headline of its confirmation
    #: when it has no `prepare` (`plain_action`). None: a readable form of its name. An MCP
    #: tool's comes from its server, cleaned (mcp/tools.py: `tool_title`).
    title: str | None = None

    @property
    def is_personal(self) -> bool:
        return self.requires_credentials if self.personal is None else self.personal

    @functools.cached_property
    def _parameters(self) -> dict[str, Any]:
        """Generating a JSON schema costs ~0.1 ms; a tool's never changes."""
        if self.parameters is not None:
            return self.parameters
        params = self.args_model.model_json_schema()
        params.pop("title", None)
        return params

    def openai_schema(self) -> dict[str, Any]:
        """The function spec the LLM is offered."""
        params = copy.deepcopy(self._parameters)  # callers may edit theirs
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }
