"""What the model reads back from an MCP tool call. Pure: no I/O.

Text content as it is; `structuredContent` as JSON; an image is announced (posting it into
the room is the attachments issue's); a result longer than MCP_RESULT_MAX_CHARS is cut and
says so, so a hostile or careless server cannot flood the prompt. A result the server marks
`isError` is the tool's own error message (MCP's way of letting the model correct a call),
cut short; transport failures never reach the model with their detail (client.py).
"""

from __future__ import annotations

import json
from typing import Any

from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent

from vagent_shared.secrets import mask_secrets

#: How much of a tool's own error message the model reads.
MAX_ERROR_CHARS = 500


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[cut: the tool returned {len(text)} characters, {limit} are shown]"


def _part(item: Any) -> str:
    if isinstance(item, TextContent):
        return item.text
    if isinstance(item, ImageContent):
        return f"[the tool returned an image ({item.mimeType}); images are not shown yet]"
    if isinstance(item, EmbeddedResource):
        resource = item.resource
        text = getattr(resource, "text", None)
        return text if isinstance(text, str) else f"[a resource: {resource.uri}]"
    kind = getattr(item, "type", "content")
    return f"[{kind} content, not shown]"


def result_text(tool: str, result: CallToolResult, max_chars: int) -> tuple[str, bool]:
    """The model's text for `result`, and whether the tool reported an error."""
    if result.isError:
        detail = " ".join(_part(c) for c in result.content).strip()
        detail = cut(mask_secrets(detail, "[REDACTED]"), MAX_ERROR_CHARS)
        return (f"{tool} failed: {detail}" if detail else f"{tool} failed."), True
    parts = [_part(c) for c in result.content]
    if result.structuredContent is not None:
        structured = json.dumps(result.structuredContent, ensure_ascii=False, default=str)
        # FastMCP also sends structured results as text: do not show the same thing twice.
        if structured not in parts and not any(_same_json(p, result.structuredContent) for p in parts):
            parts.append(structured)
    text = "\n".join(p for p in parts if p) or f"{tool} returned nothing."
    return cut(text, max_chars), False


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
