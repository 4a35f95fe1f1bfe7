"""What a tool result was derived from, and who may therefore read it later. Pure.

Why: a session's history is sent to the model on every turn, but the people who read the
answer change (a DM gains a member, someone joins a group room). A result retrieved for an
earlier audience (an HR passage in a DM, the asker's own tickets) must not be handed to the
model when an answer goes to people who may not read it: the model would quote it. So each
result records its scope (`ResultScope`, kept with the ToolMessage in the checkpoint), and
before every model call `visible_history` replaces the results the current readers may not
read with a short placeholder. Final answers stay: everyone in the room saw them.

A result with no scope (a records query, a created ticket) is as visible as running the tool
again would be. A tool call made AFTER a withheld result in the same turn may carry what that
result said in its arguments (the model copied a passage into a ticket description): its
arguments are withheld too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from pydantic import BaseModel, ConfigDict, Field

from vagent_graph.knowledge.readers import DOCUMENT_KINDS, ENTITY_KINDS, Readers, readers_for
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience

WITHHELD = (
    "[Withheld: this earlier tool result is not available here, because not everyone who reads "
    "this conversation now may read it. Do not guess what it said; run the tool again if needed.]"
)
WITHHELD_ARGS: dict[str, Any] = {}


class DocRef(BaseModel):
    """A document a result quoted, with what decides who may read it."""

    model_config = ConfigDict(frozen=True)

    doc_id: str
    category: str = ""
    tags: tuple[str, ...] = ()


class EntityRef(BaseModel):
    """An entity a result showed, with what decides who may see it."""

    model_config = ConfigDict(frozen=True)

    id: str
    entity_type: str = ""
    tags: tuple[str, ...] = ()


class ResultScope(BaseModel):
    """What one tool result was derived from. `personal_to`: the result is that user's own
    (their tickets, something done with their credential); `shown_to`: the other readers that
    user let see it (a group room where they said yes, or PERSONAL_RESULTS_IN_GROUPS=allow)."""

    model_config = ConfigDict(frozen=True)

    domain: str = ""
    documents: tuple[DocRef, ...] = ()
    entities: tuple[EntityRef, ...] = ()
    personal_to: str | None = None
    shown_to: tuple[str, ...] = Field(default=())

    @property
    def empty(self) -> bool:
        return not (self.documents or self.entities) and self.personal_to is None


def scope_of(message: ToolMessage) -> ResultScope | None:
    """The scope a tool message carries in its artifact (None: unscoped, or unreadable)."""
    raw = message.artifact.get("scope") if isinstance(message.artifact, dict) else None
    if raw is None:
        return None
    try:
        return ResultScope.model_validate(raw)
    except ValueError:  # a damaged scope is treated as the strictest one: nobody reads it
        return ResultScope(personal_to="")


@dataclass
class Readership:
    """Who reads the answer now: the asker and, in a group room, the audience."""

    ac: AcContext
    audience: Audience | None
    _readers: dict[str, Readers | None] = field(default_factory=dict, repr=False)

    def _for(self, what: str) -> Readers | None:
        if what not in self._readers:
            kinds = DOCUMENT_KINDS if what == "documents" else ENTITY_KINDS
            self._readers[what] = readers_for(self.ac, self.audience, kinds)
        return self._readers[what]

    def others(self) -> frozenset[str] | None:
        """The other readers' ids; None when they are not known one by one (a large room)."""
        if self.audience is None:
            return frozenset()
        if self.audience.public_only:
            return None
        return frozenset(m.user_id for m in self.audience.members)

    def may_read(self, scope: ResultScope) -> bool:
        """May EVERY current reader read what `scope` was derived from?"""
        for items, what in ((scope.documents, "documents"), (scope.entities, "entities")):
            if not items:
                continue
            readers = self._for(what)
            if readers is None or readers.domain != scope.domain:
                return False
            for item in items:
                item_id, item_class = (
                    (item.doc_id, item.category) if isinstance(item, DocRef) else (item.id, item.entity_type)
                )
                if not readers.allows(item_id, item_class, frozenset(item.tags)):
                    return False
        if scope.personal_to is not None:
            if scope.personal_to != self.ac.user_id:
                return False
            others = self.others()
            if others is None or not others <= set(scope.shown_to):
                return False
        return True


def visible_history(
    messages: Sequence[AnyMessage], may_read: Callable[[ResultScope], bool]
) -> list[AnyMessage]:
    """`messages` as the model may see them now: results the readers may not read replaced by
    WITHHELD (their sources dropped), and the arguments of later tool calls in the same turn
    emptied. Messages are copied, never changed in place (they are the checkpoint's)."""
    out: list[AnyMessage] = []
    tainted = False
    for m in messages:
        if isinstance(m, HumanMessage):
            tainted = False
        elif isinstance(m, ToolMessage):
            scope = scope_of(m)
            if scope is not None and not scope.empty and not may_read(scope):
                tainted = True
                m = m.model_copy(update={"content": WITHHELD, "artifact": None})
        elif isinstance(m, AIMessage) and m.tool_calls and tainted:
            calls = [{**tc, "args": dict(WITHHELD_ARGS)} for tc in m.tool_calls]
            m = m.model_copy(update={"tool_calls": calls, "invalid_tool_calls": [], "additional_kwargs": {}})
        out.append(m)
    return out
