"""The text of a message, whatever shape its content has."""

from __future__ import annotations

from langchain_core.messages import BaseMessage


def text_of(message: BaseMessage) -> str:
    """The text a message carries: its str content, or the text of its content parts."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))
