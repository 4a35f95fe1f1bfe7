"""What the model reads back from an MCP tool call, and what it is told when there is none.
Pure: no I/O.

Text content as it is, but JSON text on one line (FastMCP indents it: tokens for nothing);
`structuredContent` as one-line JSON, once; images are taken out (`result_images`:
the room sees them after the answer, the model reads a line about each). Everything the
model reads of one result (the text, what the server asked mid-call, the images left out,
and the line about each image shown) fits in MCP_RESULT_MAX_CHARS: the text is cut to leave
room for the rest, and says so, so a hostile or careless server cannot flood the prompt
through any of them. At most MCP_MAX_IMAGES images of a result (and of a turn) are decoded
at all. A result the server marks `isError` is the tool's own error message (MCP's way of
letting the model correct a call), cut short; transport failures never reach the model with
their detail (client.py).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent

from vagent_graph.mcp.client import Elicited, McpUnavailable
from vagent_graph.mcp.limits import IMAGE_NOTE_CHARS, McpLimits
from vagent_graph.tools.base import ToolImage
from vagent_shared.secrets import mask_secrets

#: How much of a tool's own error message the model reads.
MAX_ERROR_CHARS = 500


def fit(text: str, limit: int) -> str:
    """`text`, or as much of its start as fits in `limit` characters together with the line
    that says it was cut."""
    if len(text) <= limit:
        return text
    longest = f"\n[cut: the tool returned {len(text)} characters, the first {limit} are shown]"
    shown = limit - len(longest)
    if shown <= 0:
        return text[: max(limit, 0)]
    return text[:shown] + f"\n[cut: the tool returned {len(text)} characters, the first {shown} are shown]"


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
    """The model's text for `result` (at most `max_chars`), and whether the tool reported
    an error."""
    if result.isError:
        detail = " ".join(_part(c) for c in result.content).strip()
        detail = fit(mask_secrets(detail, "[REDACTED]"), MAX_ERROR_CHARS)
        return fit(f"{tool} failed: {detail}" if detail else f"{tool} failed.", max_chars), True
    parts = [compact(_part(c)) for c in result.content]
    if result.structuredContent is not None:
        structured = json.dumps(result.structuredContent, ensure_ascii=False, default=str)
        # FastMCP also sends structured results as text: do not show the same thing twice.
        if structured not in parts and not any(_same_json(p, result.structuredContent) for p in parts):
            parts.append(structured)
    text = "\n".join(p for p in parts if p) or ("" if image_count(result) else f"{tool} returned nothing.")
    return fit(text, max_chars), False


def compact(text: str) -> str:
    """JSON text as one line without indentation (the model reads the same data in fewer
    tokens); any other text as it is."""
    stripped = text.strip()
    if stripped[:1] not in ("{", "["):
        return text
    try:
        one_line = json.dumps(json.loads(stripped), ensure_ascii=False, default=str)
    except ValueError:
        return text
    return one_line if len(one_line) < len(text) else text


def image_count(result: CallToolResult) -> int:
    return sum(isinstance(c, ImageContent) for c in result.content)


def result_images(result: CallToolResult, most: int | None = None) -> tuple[ToolImage, ...]:
    """The first `most` images of a successful result (the others are not even decoded); one
    whose base64 does not decode is dropped (its server is broken or hostile, and the model
    reads nothing of it)."""
    if result.isError:
        return ()
    images: list[ToolImage] = []
    offered = [c for c in result.content if isinstance(c, ImageContent)]
    for item in offered if most is None else offered[: max(most, 0)]:
        try:
            images.append(ToolImage(data=base64.b64decode(item.data, validate=True)))
        except (binascii.Error, ValueError):
            continue
    return tuple(images)


def images_left_out(tool: str, returned: int, kept: int, per_result: int) -> str:
    """The model's line about the images of a result that do not go to the room."""
    return (
        f"[{tool} returned {returned} images; {returned - kept} of them are not shown: at most "
        f"{per_result} per result and per turn go to the room]"
    )


def declined_text(elicited: Elicited) -> str:
    """What the model is told when the server asked the user for more input mid-call."""
    quoted = "; ".join(f'"{a}"' for a in elicited.asked)
    more = elicited.count - len(elicited.asked)
    if more > 0:
        quoted += f" and {more} more question{'' if more == 1 else 's'}"
    return (
        f"(The tool asked the user for more input ({quoted}); vagent cannot ask mid-call yet, so it "
        "declined. Ask the user for that information and call the tool again with it.)"
    )


def with_notes(text: str, notes: list[str], limit: int, images_shown: int = 0) -> str:
    """`text` and `notes` (each on a line of its own) in `limit` characters, less what the
    line about each of `images_shown` images will take: the notes win, the text is cut."""
    budget = max(limit - IMAGE_NOTE_CHARS * images_shown, 0)
    tail = "".join("\n" + n for n in notes if n)
    body = fit(text, max(budget - len(tail), budget // 2))
    return fit((body + tail) if body else tail.lstrip("\n"), budget)


@dataclass(frozen=True)
class Read:
    """A result as the model reads it (`text`) and the room sees it (`images`)."""

    text: str
    images: tuple[ToolImage, ...] = ()
    #: The tool itself reported an error (`isError`).
    failed: bool = False
    #: Images it returned that do not go to the room (over MCP_MAX_IMAGES).
    left_out: int = 0


def read(
    tool: str,
    result: CallToolResult,
    elicited: Elicited,
    limits: McpLimits,
    allow: Callable[[int], int] = lambda wanted: wanted,
) -> Read:
    """Everything the model reads of one result, in `limits.result_max_chars` together with
    the line tool_images.py writes about each image shown; `allow(n)`: how many of n images
    the turn may still send to the room."""
    text, failed = result_text(tool, result, limits.result_max_chars)
    notes = [declined_text(elicited)] if elicited.count else []
    returned = 0 if failed else image_count(result)
    images: tuple[ToolImage, ...] = ()
    allowed = 0
    if returned:
        # The lines about the images shown take at most half of what the model reads.
        per_result = min(limits.max_images, limits.result_max_chars // (2 * IMAGE_NOTE_CHARS))
        allowed = max(0, min(allow(min(returned, per_result)), per_result))
        images = result_images(result, allowed)
        if allowed < returned:
            notes.append(images_left_out(tool, returned, allowed, limits.max_images))
    text = with_notes(text, notes, limits.result_max_chars, len(images))
    return Read(text, images, failed, returned - allowed)


def failure_text(tool: str, failure: McpUnavailable, timeout_seconds: float) -> str:
    """What the model is told when the call got no answer (never the detail). A call that
    was sent may have acted: the model must not say it failed, nor retry blindly (a booking
    made twice)."""
    if failure.unknown:
        what = {
            "timeout": f"did not answer within {timeout_seconds:g} s",
            "too_large": "answered with more than vagent reads, so its answer is not shown",
        }.get(failure.reason, f"was interrupted ({failure.reason}) before it answered")
        return (
            f"{tool} {what}: the action MAY OR MAY NOT HAVE HAPPENED. Do not call it again blindly: "
            "first check whether it took effect (with a tool that reads it, if there is one), or "
            "tell the user it is unknown and ask before trying again."
        )
    return (
        f"{tool} is unavailable right now ({failure.reason}); the call did not go through. "
        "Tell the user it did not work. Do not retry now."
    )


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False
