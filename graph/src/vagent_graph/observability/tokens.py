"""What a list of messages costs, estimated: ~4 characters a token, an image a fixed price.
One estimate for every budget (the history window, a call's hold, what a stopped answer is
charged), so they agree with each other; free to compute, no tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

#: ~Characters a token: the estimate of every budget here (the history window, a call's hold
#: and what a stopped answer is charged, usage.py).
CHARS_PER_TOKEN = 4

#: What an image part costs in a budget (providers charge ~85-1600 tokens an image by its
#: size; its base64, counted as text, would be ~100x that and push the history out).
IMAGE_PART_TOKENS = 1000


def approx_tokens(messages: Sequence[BaseMessage]) -> int:
    """~4 characters a token, an image part IMAGE_PART_TOKENS; good enough for a budget, and free."""
    total = 0
    for m in messages:
        total += 4 + _content_chars(m.content) // CHARS_PER_TOKEN + IMAGE_PART_TOKENS * image_parts(m.content)
        if isinstance(m, AIMessage):
            total += sum(len(str(tc.get("args", ""))) // CHARS_PER_TOKEN + 8 for tc in m.tool_calls)
    return total


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(len(p) if isinstance(p, str) else len(str(p.get("text", ""))) for p in content)


def image_parts(content: Any) -> int:
    if isinstance(content, str):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "image"))
