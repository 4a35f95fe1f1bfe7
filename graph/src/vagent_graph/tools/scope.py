"""What a tool result was derived from, and who may therefore read it later. Pure.

Why: a session's history is sent to the model on every turn, but the people who read the
answer change (a DM gains a member, someone joins a group room). A result retrieved for an
earlier audience (an HR passage in a DM, the asker's own tickets) must not be handed to the
model when an answer goes to people who may not read it: the model would quote it. So each
result records its scope (`ResultScope`, kept with the ToolMessage in the checkpoint), and
before every model call `visible_history` replaces the results the current readers may not
read with a short placeholder. Final answers stay: everyone in the room saw them.

A result with no scope (a records query, a created ticket) is as visible as running the tool
again would be. A tool call made AFTER a withheld result may carry what that result said (the
model copied a passage into a ticket description): its arguments are withheld, and so is its
result, which may repeat them ("Created page 42: <the passage>"). That holds in the same turn
and in every later turn before the current one: the withheld result was in the history the
model saw when it made those calls (while the room was still alice's alone). The current
turn's calls were made with it already withheld (the same readers), and keep their results.
A call made beside it, in the same model message, could not know what it said either.

The rule itself (`ResultScope`, `Readership`) is `vagent_shared.readers`: the bot judges a
turn's 🔍 account by the same rule against the readers at the time of asking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from vagent_shared.readers import DocRef, EntityRef, Readership, ResultScope

__all__ = [
    "WITHHELD",
    "WITHHELD_ARGS",
    "DocRef",
    "EntityRef",
    "Readership",
    "ResultScope",
    "scope_of",
    "traced_scope",
    "visible_history",
]

WITHHELD = (
    "[Withheld: this earlier tool result is not available here, because not everyone who reads "
    "this conversation now may read it. Do not guess what it said; run the tool again if needed.]"
)
WITHHELD_ARGS: dict[str, Any] = {}


def traced_scope(scope: ResultScope | None) -> ResultScope:
    """What decides who may be told about a tool call later (its TurnTrace entry, judged
    by the 🔍 account against the room's readers at that time): its result's scope, but a
    personal result is named to nobody but its owner, even where they let the room see the
    result itself."""
    return (scope or ResultScope()).model_copy(update={"shown_to": ()})


def scope_of(message: ToolMessage) -> ResultScope | None:
    """The scope a tool message carries in its artifact (None: unscoped, or unreadable)."""
    raw = message.artifact.get("scope") if isinstance(message.artifact, dict) else None
    if raw is None:
        return None
    try:
        return ResultScope.model_validate(raw)
    except ValueError:  # a damaged scope is treated as the strictest one: nobody reads it
        return ResultScope(personal_to="")


def visible_history(
    messages: Sequence[AnyMessage], may_read: Callable[[ResultScope], bool]
) -> list[AnyMessage]:
    """`messages` as the model may see them now: results the readers may not read replaced by
    WITHHELD (their sources dropped), and the tool calls made after one (in its turn or a later
    one, up to the current turn) emptied, their results withheld too (a call made beside it,
    in the same model message, could not know what it said; nor could the current turn's,
    made for these readers). Messages are copied, never changed in place (they are the
    checkpoint's)."""
    current = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=0)
    out: list[AnyMessage] = []
    tainted = False
    after: set[str] = set()  # the ids of calls made after a withheld result
    for i, m in enumerate(messages):
        if i == current:
            tainted = False
        if isinstance(m, ToolMessage):
            scope = scope_of(m)
            if m.tool_call_id in after or (scope is not None and not scope.empty and not may_read(scope)):
                tainted = True
                m = m.model_copy(update={"content": WITHHELD, "artifact": None})
        elif isinstance(m, AIMessage) and m.tool_calls and tainted:
            after.update(str(tc.get("id")) for tc in m.tool_calls)
            calls = [{**tc, "args": dict(WITHHELD_ARGS)} for tc in m.tool_calls]
            m = m.model_copy(update={"tool_calls": calls, "invalid_tool_calls": [], "additional_kwargs": {}})
        out.append(m)
    return out
