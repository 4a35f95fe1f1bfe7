"""Which messages of a session's history carry the user's files, and which of them the
current turn uses. Pure: the workflow (citations), the history window and the offline
model ask the same question.

A file sent alone is kept as a HumanMessage of its own followed by the reply saying so
(turn/intake.py); the next question uses it. So the current turn's files are its own message's
and those of the kept pairs right before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

#: The HumanMessage's additional_kwargs key listing its files (never sent to the model:
#: langchain-openai sends a user message's content only). The offline model and the answer's
#: "Sources:" read it.
FILES_KEY = "vagent_files"
#: additional_kwargs key of the reply that kept files for the next question.
KEPT_KEY = "vagent_kept_files"


def files_of(message: BaseMessage) -> list[dict[str, Any]]:
    """The files a HumanMessage carries (file_facts), or none."""
    files = message.additional_kwargs.get(FILES_KEY) if isinstance(message, HumanMessage) else None
    return [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []


def turn_files(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The files the current turn uses (file_facts), oldest first."""
    return [f for m in turn_file_messages(messages) for f in files_of(m)]


def turn_file_messages(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages that brought the current turn's files: its own, and those sent alone just
    before it (each kept with a reply saying so), oldest first."""
    i = next((n for n in range(len(messages) - 1, -1, -1) if isinstance(messages[n], HumanMessage)), -1)
    if i < 0:
        return []
    found = [messages[i]] if files_of(messages[i]) else []
    while kept_before(messages, i):
        found.insert(0, messages[i - 2])
        i -= 2
    return found


def kept_before(messages: Sequence[BaseMessage], i: int) -> bool:
    """Whether a file sent alone (and the reply keeping it) comes right before message `i`."""
    if i < 2 or messages[i - 1].additional_kwargs.get(KEPT_KEY) is not True:
        return False
    return bool(files_of(messages[i - 2]))
