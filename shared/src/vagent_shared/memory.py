"""Memory that follows a person (docs/memory.md): the one definition of a memory, the
descriptor's `memory:` block, and the `!remember` / `!memory` / `!forget` commands. Pure.

A memory keeps who HEARD it (the asker and every reader of the conversation when it was
written) and the scope of what the model had seen in that turn (the union of its tool
results' `ResultScope`s). Recall judges both against the readers of the conversation NOW
(vagent_graph.memory.rules), so a memory cannot reach someone who was not there, or who may
not read what it was derived from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from vagent_shared.readers import ResultScope

#: The longest memory, in characters (a longer text is refused, never cut).
MEMORY_MAX_CHARS: Final = 500
#: The line an answer carries for each memory written in its turn: nothing is remembered silently.
REMEMBERED: Final = "🧠 Remembered: "
#: The tool the model writes memories with, and its one argument.
REMEMBER_TOOL: Final = "remember"

#: Why a memory was not recalled in a conversation (`memory_withheld`'s reason).
WithheldReason = Literal["not_heard", "source_not_readable"]
#: How a memory was written: by the model's `remember` call, or the user's `!remember`.
Origin = Literal["tool", "command"]


#: The characters Markdown acts on inside a line that starts with text (emphasis, code,
#: links, HTML, tables, strike-through; CommonMark lets each be escaped).
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~])")
_ESCAPED = re.compile(r"\\([\\`*_\[\]<>|~])")


def one_line(text: str) -> str:
    """A memory's text as it is stored: one line (its own line breaks could fake a heading
    or a new instruction wherever it is shown)."""
    return " ".join(text.split())


def remembered_line(text: str) -> str:
    """The 🧠 line of an answer: the memory's exact text, escaped so that the room's Markdown
    shows it character for character (a planted link or bold stays visible as typed)."""
    return REMEMBERED + _MARKDOWN.sub(r"\\\1", one_line(text))


def remembered_text(line: str) -> str:
    """What a 🧠 line says the memory is (`remembered_line` undone), for plain-text readers."""
    return _ESCAPED.sub(r"\1", line.removeprefix(REMEMBERED))


def _now() -> datetime:
    return datetime.now(UTC)


class MemoryPolicy(BaseModel):
    """The agent descriptor's `memory:` block. Disabled: no `remember` tool, no recall, no
    memory command answered, no Redis read."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    #: Memories given to the model before a turn's model call, at most.
    recall_k: int = Field(default=5, ge=0, le=50)
    #: A user's memories (in one tenant) at most: writing one more drops the oldest (audited).
    max_per_user: int = Field(default=200, ge=1, le=10_000)
    #: How long a memory is kept (Redis TTL), in days.
    ttl_days: int = Field(default=365, ge=1, le=3650)


class Memory(BaseModel):
    """One memory as stored (its text only in the store, never in a log, audit or trace)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    owner: str = Field(min_length=1)
    #: The tenant (the owner's active ACL domain when it was written).
    domain: str
    text: str = Field(min_length=1, max_length=MEMORY_MAX_CHARS)
    created_at: datetime = Field(default_factory=_now)
    #: The room it was written in ("" when not written in a room: an operator's tool).
    room_id: str = ""
    #: Who heard it: the asker and every reader of the conversation at that moment.
    heard_by: tuple[str, ...] = ()
    #: `!remember --everywhere`: the owner's consent that it may be recalled in any room
    #: (heard by everyone); what it was derived from is still judged.
    everywhere: bool = False
    #: What the model had seen in the turn it was written in (the union of its results' scopes).
    scope: ResultScope = Field(default_factory=ResultScope)
    origin: Origin = "tool"


# ---- the commands ------------------------------------------------------------------------
@dataclass(frozen=True)
class Remember:
    """`!remember [--everywhere] TEXT`."""

    text: str
    everywhere: bool = False


@dataclass(frozen=True)
class ListMemories:
    """`!memory`."""


@dataclass(frozen=True)
class Forget:
    """`!forget N` (`number`: as `!memory` numbered it here) or `!forget all` (None)."""

    number: int | None


@dataclass(frozen=True)
class Malformed:
    """A memory command that cannot be carried out as typed: `usage` says how."""

    usage: str


MemoryCommand = Remember | ListMemories | Forget | Malformed

COMMAND_WORDS: Final = ("remember", "memory", "forget")
_COMMAND = re.compile(r"!(remember|memory|memories|forget)\b(.*)", re.IGNORECASE | re.DOTALL)
_EVERYWHERE = "--everywhere"
_NUMBER = re.compile(r"[0-9]{1,9}")

REMEMBER_USAGE: Final = "Usage: `!remember TEXT` or `!remember --everywhere TEXT`."
FORGET_USAGE: Final = "Usage: `!forget N` (a number `!memory` shows) or `!forget all`."


def parse_memory_command(text: str) -> MemoryCommand | None:
    """The memory command `text` is (already stripped of the bot's prefix or mention), or
    None when it is not one."""
    m = _COMMAND.fullmatch(text.strip())
    if m is None:
        return None
    word, rest = m.group(1).lower(), m.group(2).strip()
    if rest and not m.group(2)[:1].isspace():
        return None  # `!rememberme`: not this command
    if word in ("memory", "memories"):
        return ListMemories() if not rest else Malformed("Usage: `!memory` (no arguments).")
    if word == "forget":
        if rest.lower() == "all":
            return Forget(None)
        # ASCII digits only, and few: `str.isdigit` takes `²` (int() then raises) and a
        # 5000-digit number raises too (int's digit limit): either would crash the turn
        if _NUMBER.fullmatch(rest) and int(rest) > 0:
            return Forget(int(rest))
        return Malformed(FORGET_USAGE)
    everywhere = rest.split(maxsplit=1)[0].lower() == _EVERYWHERE if rest else False
    if everywhere:
        rest = rest[len(_EVERYWHERE) :].strip()
    if not rest:
        return Malformed(REMEMBER_USAGE)
    return Remember(text=rest, everywhere=everywhere)
