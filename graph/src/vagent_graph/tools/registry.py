"""Tool metadata and the registry the workflow reads; the workflow never names a tool.

A tool is data: a name, a description, an argument model, metadata
(`requires_confirmation`, `requires_credentials`), an optional `ask` step that
builds the question a human must answer first, and `run`. What a tool works with
(stores, clients) comes from `ToolContext.services`, looked up by type, so a new
capability brings its own service instead of a field here.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal, TypeVar

import structlog
from pydantic import BaseModel

from vagent_shared.access import AcContext
from vagent_shared.credentials import CredentialResponse
from vagent_shared.knowledge import Audience, SourceRef

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "vagent.tools"
S = TypeVar("S")


class ServiceUnavailable(LookupError):
    """A tool needs a service this process was not started with."""


class Services:
    """The stores and clients tools may use, one instance per type (built once at start)."""

    def __init__(self, *services: object) -> None:
        self._by_type: dict[type[Any], object] = {type(s): s for s in services}

    def find(self, kind: type[S]) -> S | None:
        found = self._by_type.get(kind)
        if found is None:  # a subclass registered for its base type
            found = next((s for s in self._by_type.values() if isinstance(s, kind)), None)
        return found  # type: ignore[return-value]

    def get(self, kind: type[S]) -> S:
        found = self.find(kind)
        if found is None:
            raise ServiceUnavailable(f"{kind.__name__} is not configured")
        return found


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


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns when it has more than text: the documents its text cites (never
    shown to the model; they become the answer's "Sources:" list)."""

    text: str
    sources: tuple[SourceRef, ...] = ()


@dataclass(frozen=True)
class Question:
    """A question for the human. `confirm` questions cancel the call on "no";
    `input` questions pass the answer to `run`."""

    text: str
    options: list[str] = field(default_factory=list)
    kind: Literal["confirm", "input"] = "confirm"


def result_text(result: str | ToolResult) -> str:
    """The text the model reads, whichever way the tool answered."""
    return result.text if isinstance(result, ToolResult) else result


AskFn = Callable[[Any, ToolContext], Awaitable[Question | None]]
RunFn = Callable[[Any, ToolContext, str | None], Awaitable[str | ToolResult]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    run: RunFn
    ask: AskFn | None = None
    requires_confirmation: bool = False
    requires_credentials: bool = False
    #: The Credential Registry's resource_id of the system the tool acts on (default: its name).
    credential_resource: str | None = None

    @functools.cached_property
    def _parameters(self) -> dict[str, Any]:
        """Generating a JSON schema costs ~0.1 ms; a tool's never changes."""
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


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Any:
        return iter(self._tools.values())


def default_registry() -> ToolRegistry:
    """Built-in tools plus any installed package's `vagent.tools` entry points.

    An entry point names a callable returning a Tool or a list of Tools.
    """
    from vagent_graph.tools import ask_user, documents, entities, records, tickets

    registry = ToolRegistry([documents.TOOL, entities.TOOL, *records.TOOLS, *tickets.TOOLS, ask_user.TOOL])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()()
            for t in loaded if isinstance(loaded, list) else [loaded]:
                registry.register(t)
        except Exception:  # a broken plugin must not take the service down
            log.exception("tool_plugin_failed", entry_point=ep.name)
    return registry
