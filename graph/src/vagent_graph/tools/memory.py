"""`remember`: the model saves one short fact for the user, for later conversations
(docs/memory.md). Offered only when the agent enables memory, granted as `tool:remember`.

The memory records who heard it (everyone reading now) and what the model had seen in this
conversation (`ctx.seen`), so it is recalled only where all readers heard it and may read
its sources. The answer shows each memory written in its turn word for word (the 🧠 line:
nothing is remembered silently, and a planted "remember that ..." is visible at once).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from vagent_graph.memory.memories import Memories, Refused
from vagent_graph.tools.base import Tool, ToolContext, ToolResult
from vagent_shared.memory import MEMORY_MAX_CHARS, REMEMBER_TOOL, REMEMBERED


class RememberArgs(BaseModel):
    text: str = Field(
        min_length=1,
        max_length=MEMORY_MAX_CHARS,
        description="The fact to remember, short and self-contained (e.g. 'Prefers answers in German').",
    )


async def _run(args: RememberArgs, ctx: ToolContext, answer: str | None) -> str | ToolResult:
    memories = ctx.services.get(Memories)
    found = await memories.write(
        ctx.ac,
        ctx.session_id,
        ctx.audience,
        args.text,
        unchecked=ctx.audience_unchecked,
        scope=ctx.seen,
        origin="tool",
    )
    if isinstance(found, Refused):
        return f"Not remembered: {found.reason}"
    # What a later reader may see of this result is what may see the memory itself.
    return ToolResult(text=f"{REMEMBERED}{found.text}", scope=found.scope)


TOOL = Tool(
    name=REMEMBER_TOOL,
    description=(
        "Remember one short fact or preference the user told you, for later conversations "
        "with them. Never use it for secrets (passwords, keys, tokens)."
    ),
    args_model=RememberArgs,
    run=_run,
    title="Remember a fact",
)
