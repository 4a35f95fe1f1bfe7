"""`!remember`, `!memory` and `!forget N`, answered by the graph without the model (the bot
forwards them like any message, so every door applies the same rules). Nothing of them is
saved into the conversation: the text of a memory lives in the store only, and goes with it.
`!forget all` asks for a yes first, so it runs in the workflow (`forget_all`), as a question.

`!memory` numbers the memories this conversation may recall (in a direct chat: all of the
user's), oldest first; `!forget N` deletes the Nth of the same list, judged again now.
"""

from __future__ import annotations

from collections.abc import Sequence

from vagent_graph.memory.memories import Memories, Refused
from vagent_shared.access import AcContext, tool
from vagent_shared.knowledge import Audience
from vagent_shared.memory import (
    REMEMBER_TOOL,
    Forget,
    ListMemories,
    Malformed,
    Memory,
    MemoryCommand,
    Remember,
    remembered_line,
)
from vagent_shared.readers import Readership
from vagent_shared.session import SessionId

MEMORY_OFF = "Memory is not enabled for this agent: nothing is remembered."
NOT_GRANTED = "You may not store memories here (ask your administrator for memory access)."
FOOTER = "`!forget N` forgets one, `!forget all` all of them."


def is_direct(audience: Audience | None, unchecked: bool) -> bool:
    """A conversation nobody else reads (a DM: the bot sends no audience)."""
    return audience is None and not unchecked


def where(memory: Memory, room_id: str) -> str:
    if memory.everywhere:
        return "for every room"
    if memory.room_id == room_id:
        return "here"
    if len(memory.heard_by) <= 1:
        return "in a direct chat"
    return f"in another room ({len(memory.heard_by)} people)"


def listing(memories: Sequence[Memory], room_id: str, direct: bool) -> str:
    """The `!memory` answer (Markdown): numbered, each with its date and where it was said."""
    if not memories:
        return "You have no memories." if direct else "You have no memories that may be recalled here."
    title = "Your memories" if direct else "Your memories that may be recalled here"
    lines = [f"**{title}** ({len(memories)}):"]
    for n, m in enumerate(memories, 1):
        lines.append(f"{n}. {m.text} — {m.created_at:%-d %b %Y}, {where(m, room_id)}")
    return "\n".join([*lines, "", FOOTER])


async def answer(
    command: MemoryCommand,
    memories: Memories | None,
    ac: AcContext,
    session_id: str,
    audience: Audience | None,
    *,
    unchecked: bool = False,
) -> str:
    """The answer to a memory command other than `!forget all`."""
    if isinstance(command, Malformed):
        return command.usage
    if memories is None:
        return MEMORY_OFF
    room_id = SessionId.parse(session_id).room_id
    readership = Readership(ac, audience)
    direct = is_direct(audience, unchecked)
    if isinstance(command, Remember):
        if not ac.can_access(tool(REMEMBER_TOOL)):
            return NOT_GRANTED
        found = await memories.write(
            ac,
            session_id,
            audience,
            command.text,
            unchecked=unchecked,
            everywhere=command.everywhere,
            origin="command",
        )
        if isinstance(found, Refused):
            return f"Not remembered: {found.reason}"
        note = "\n(Recalled in any room you talk to me in.)" if command.everywhere else ""
        return f"{remembered_line(found.text)}{note}"
    here = await memories.here(readership, unchecked=unchecked, direct=direct)
    if isinstance(command, ListMemories):
        return listing(here, room_id, direct)
    assert isinstance(command, Forget) and command.number is not None
    if command.number > len(here):
        return f"There is no memory number {command.number} here; `!memory` lists them."
    chosen = here[command.number - 1]
    count = await memories.forget(ac, session_id, [chosen.id], "forget")
    return f"Forgot: {chosen.text}" if count else "That memory was already gone."
