"""Pure translation between vagent's shapes and LangGraph's server API shapes.

Why pure: what a LangGraph client sees (message dicts, stream events, the human-in-the-loop
interrupt, the resume command) is the whole contract of the gateway; keeping it free of I/O
lets unit tests pin it down exactly as `langgraph_sdk` and agent-chat-ui read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from vagent_shared.events import HitlAction, HitlRequest
from vagent_shared.hitl import NO, YES, normalize_answer

#: The one node name clients see in `messages-tuple` metadata and `updates`.
NODE: Final = "agent"
#: Decisions a client may take on a confirmation: an edited action would not be the one confirmed.
ALLOWED_DECISIONS: Final = ("approve", "reject")
#: Stream modes the gateway produces; any other requested mode is accepted and ignored.
SUPPORTED_MODES: Final = frozenset({"values", "messages-tuple", "updates"})

Json = dict[str, Any]


def _message(kind: str, content: str, message_id: str) -> Json:
    """The fields every LangChain message dict has (`messages_to_dict`'s `data`)."""
    return {
        "type": kind,
        "content": content,
        "id": message_id,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
        "example": False,
    }


def human_message(content: str, message_id: str) -> Json:
    """A LangChain HumanMessage as `messages_to_dict` would give its `data`."""
    return _message("human", content, message_id)


def ai_message(content: str, message_id: str) -> Json:
    """A final LangChain AIMessage (no tool calls: tool calls and results are never shown)."""
    return {
        **_message("ai", content, message_id),
        "tool_calls": [],
        "invalid_tool_calls": [],
        "usage_metadata": None,
    }


def ai_chunk(content: str, message_id: str) -> Json:
    """One AIMessageChunk of the answer as it streams (same id as the final message, so a
    client merges the chunks into it)."""
    return {
        **ai_message(content, message_id),
        "type": "AIMessageChunk",
        "tool_call_chunks": [],
    }


def chunk_metadata(run_id: str, thread_id: str, assistant_id: str) -> Json:
    """The second element of a `messages-tuple` event."""
    return {
        "run_id": run_id,
        "thread_id": thread_id,
        "assistant_id": assistant_id,
        "graph_id": assistant_id,
        "langgraph_node": NODE,
    }


def action_requests(hitl: HitlRequest) -> list[Json]:
    """What the confirmation would run, as LangChain's `action_requests`. A question that runs
    no listed tool (none known yet, or a plain question) is offered as one action named after
    its first line."""
    actions = hitl.actions or [HitlAction(name=hitl.question.split("\n", 1)[0][:200] or "confirm")]
    return [{"name": a.name, "args": dict(a.args), "description": hitl.question} for a in actions]


def interrupt_value(hitl: HitlRequest) -> Json:
    """LangChain's human-in-the-loop request (`HITLRequest`): approve or reject only."""
    requests = action_requests(hitl)
    return {
        "action_requests": requests,
        "review_configs": [
            {"action_name": r["name"], "allowed_decisions": list(ALLOWED_DECISIONS)} for r in requests
        ],
    }


def interrupt(hitl: HitlRequest) -> Json:
    """One LangGraph `Interrupt` (`{value, id}`)."""
    return {"value": interrupt_value(hitl), "id": hitl.interrupt_id}


def values(messages: Sequence[Json], pending: HitlRequest | None = None) -> Json:
    """The thread's values: its messages, plus `__interrupt__` while a confirmation waits."""
    out: Json = {"messages": list(messages)}
    if pending is not None:
        out["__interrupt__"] = [interrupt(pending)]
    return out


def answer_update(message: Json) -> Json:
    """An `updates` event for the final answer."""
    return {NODE: {"messages": [message]}}


def interrupt_update(hitl: HitlRequest) -> Json:
    """An `updates` event for a confirmation."""
    return {"__interrupt__": [interrupt(hitl)]}


def error_data(code: str, message: str) -> Json:
    """The `error` event's data (and `runs.wait`'s `__error__`), as LangGraph's server sends it."""
    return {"error": code, "message": message}


def sse_frame(event: str, data: Any) -> bytes:
    """One SSE frame: `event:` and one `data:` line of JSON (JSON never contains a raw newline)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def modes(requested: str | Sequence[str] | None) -> set[str]:
    """The supported modes asked for (LangGraph's default is `values`)."""
    if requested is None:
        return {"values"}
    asked = {requested} if isinstance(requested, str) else set(requested)
    return asked & SUPPORTED_MODES


def text_of(content: Any) -> str:
    """A message's text: a string, or the `text` parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p if isinstance(p, str) else str(p.get("text", ""))
            for p in content
            if isinstance(p, str) or (isinstance(p, Mapping) and p.get("type") == "text")
        ]
        return "\n".join(parts)
    return ""


def last_human_text(run_input: Any) -> str | None:
    """The turn: the last human message of `input.messages` (LangChain dicts with `type`, or
    OpenAI-style `role`); None when there is none."""
    if not isinstance(run_input, Mapping):
        return None
    messages = run_input.get("messages")
    if isinstance(messages, Mapping | str):
        messages = [messages]
    if not isinstance(messages, list):
        return None
    for m in reversed(messages):
        if isinstance(m, str):
            return m
        if isinstance(m, Mapping) and (
            m.get("type") in ("human", "user") or m.get("role") in ("human", "user")
        ):
            return text_of(m.get("content"))
    return None


class BadResume(ValueError):
    """A resume value the gateway cannot answer with (an edit, several decisions, nonsense)."""


def resume_answer(resume: Any, options: Sequence[str]) -> str:
    """The answer a `Command(resume=...)` gives the pending question: LangChain's
    `{"decisions": [{"type": "approve" | "reject"}]}`, or plain text (`"yes"`, `"no"`, or
    one of a question's options). Raises BadResume otherwise."""
    if isinstance(resume, Mapping) and "decisions" in resume:
        decisions = resume["decisions"]
        if not isinstance(decisions, list) or len(decisions) != 1 or not isinstance(decisions[0], Mapping):
            raise BadResume("resume.decisions must hold exactly one decision")
        kind = decisions[0].get("type")
        if kind == "approve":
            return YES
        if kind == "reject":
            return NO
        raise BadResume(f"decision type {str(kind)[:20]!r} is not allowed: only approve or reject")
    if isinstance(resume, Mapping) and len(resume) == 1:  # {interrupt_id: value}, as LangGraph allows
        (value,) = resume.values()
        return resume_answer(value, options)
    if isinstance(resume, str):
        picked = normalize_answer(resume, list(options))
        if picked is None:
            raise BadResume("the answer matches none of the question's options")
        return picked
    raise BadResume("resume must be a decision list or a plain answer")
