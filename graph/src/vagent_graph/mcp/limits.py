"""What an MCP server may cost the graph, the prompt and the room, whatever it sends.

Why: a server is the organisation's, not ours, and may be careless or hostile: 2,000 tiny
images, 300 tools with huge schemas, a gigabyte of text. Every cap here holds before the
excess is read or built (the response while it is read, the list while it is paged), never
only after, and what goes over it is said (to the model, in the logs and the metrics).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from vagent_shared.settings import GraphSettings

#: What one image's line ("[x__chart returned an image (x__chart-1.png); it is shown ...]",
#: tool_images.py) may take of the result's MCP_RESULT_MAX_CHARS: kept free for it.
IMAGE_NOTE_CHARS = 240


@dataclass(frozen=True)
class McpLimits:
    """The caps of GraphSettings' MCP_* settings (README.md's configuration table)."""

    #: MCP_RESULT_MAX_CHARS: all the text the model reads of one result, notes included.
    result_max_chars: int = 20_000
    #: MCP_MAX_IMAGES: images of one result, and of one turn, that go to the room.
    max_images: int = 4
    #: MCP_MAX_TOOLS: tools one server brings (the first ones as it lists them).
    max_tools: int = 128
    #: MCP_MAX_SCHEMA_CHARS: the function specs (name, description, schema) of one server's
    #: tools, together, as the model is offered them on every call.
    max_schema_chars: int = 200_000
    #: MCP_RESPONSE_MAX_BYTES: one HTTP response of a server; more is not read.
    response_max_bytes: int = 16 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: GraphSettings) -> McpLimits:
        return cls(
            result_max_chars=settings.MCP_RESULT_MAX_CHARS,
            max_images=settings.MCP_MAX_IMAGES,
            max_tools=settings.MCP_MAX_TOOLS,
            max_schema_chars=settings.MCP_MAX_SCHEMA_CHARS,
            response_max_bytes=settings.MCP_RESPONSE_MAX_BYTES,
        )

    @property
    def listed_max(self) -> int:
        """Tools read of a server's list before paging stops (room for the ones skipped)."""
        return max(8 * self.max_tools, 256)


class TurnImages:
    """Images MCP tools have sent to the room, per turn (`TurnTrace.turn_id`, which a resume
    keeps): at most `per_turn` in all. Only the newest `turns` turns are remembered, so memory
    stays flat; a turn that old has long been answered."""

    def __init__(self, per_turn: int, turns: int = 4096) -> None:
        self.per_turn, self.turns = per_turn, turns
        self._used: OrderedDict[str, int] = OrderedDict()

    def take(self, turn: str | None, wanted: int) -> int:
        """How many of `wanted` images may still go to the room in `turn` (counted as taken).
        No turn (a call outside a recorded run): the per-result cap alone applies."""
        wanted = max(0, min(wanted, self.per_turn))
        if turn is None:
            return wanted
        used = self._used.pop(turn, 0)
        granted = min(wanted, self.per_turn - used)
        self._used[turn] = used + granted
        while len(self._used) > self.turns:
            self._used.popitem(last=False)
        return granted
