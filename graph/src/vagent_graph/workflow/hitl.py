"""Asking the human from inside a node, with LangGraph's interrupt().

The node re-runs from its top on every resume, so everything before `interrupt()`
must be safe to repeat (building the question is; running the tool is not, so it
happens after). A wrong answer asks again with a second interrupt in the same node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langgraph.types import interrupt

from vagent_graph.tools import Question
from vagent_shared.hitl import normalize_answer

#: Resume value that closes a question nobody will answer (the bot's timeout expired).
CANCEL_RESUME: dict[str, str] = {"__vagent_cancel__": "expired"}


def is_cancel(value: Any) -> bool:
    return isinstance(value, dict) and "__vagent_cancel__" in value


def reask_text(question: Question) -> str:
    if question.options:
        return f"Please answer {' or '.join(question.options)}. {question.text}"
    return f"Please type an answer. {question.text}"


def ask_human(
    question: Question, timeout_seconds: int, actions: Sequence[Mapping[str, Any]] = ()
) -> str | None:
    """The validated answer, spelled as the option; None when the question was cancelled.
    `actions`: what "yes" runs ({name, args}, masked as the question masks them:
    confirmation.shown_action), carried in the interrupt value to the SSE `hitl_request`;
    none for a question that runs no tool. The checkpoint keeps the value."""
    text = question.text
    while True:
        value = interrupt(
            {
                "question": text,
                "options": list(question.options),
                "timeout_seconds": timeout_seconds,
                "kind": question.kind,
                "actions": [dict(a) for a in actions],
            }
        )
        if is_cancel(value):
            return None
        answer = normalize_answer(str(value), question.options)
        if answer is not None:
            return answer
        text = reask_text(question)
