"""What the model reads back from an MCP tool call. Pure: no I/O.

Text content as it is; `structuredContent` as JSON; images are taken out (`result_images`:
the room sees them after the answer, the model reads a line about each); a result longer
than MCP_RESULT_MAX_CHARS is cut and says so, so a hostile or careless server cannot flood
the prompt. A result the server marks `isError` is the tool's own error message (MCP's way
of letting the model correct a call), cut short; transport failures never reach the model
with their detail (client.py).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent

from vagent_graph.tools.base import ToolImage
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
        return ""  # result_images: the model reads what became of it (tool_images.py)
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
    has_image = any(isinstance(c, ImageContent) for c in result.content)
    text = "\n".join(p for p in parts if p) or ("" if has_image else f"{tool} returned nothing.")
    return cut(text, max_chars), False


def result_images(result: CallToolResult) -> tuple[ToolImage, ...]:
    """The images of a successful result; one whose base64 does not decode is dropped (its
    server is broken or hostile, and the model reads nothing of it)."""
    if result.isError:
        return ()
    images: list[ToolImage] = []
    for item in result.content:
        if isinstance(item, ImageContent):
            try:
                images.append(ToolImage(data=base64.b64decode(item.data, validate=True)))
            except (binascii.Error, ValueError):
                continue
    return tuple(images)


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
