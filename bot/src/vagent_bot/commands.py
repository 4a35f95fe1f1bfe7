"""The bot's own commands (`!help`, `!reset`, `!stop`, `!why`), recognised before the agent sees a message.

Parsing runs on the text routing already cleaned of prefix, mention and reply fallback.
An unknown `!word` is not an error: it is returned as None and goes to the agent like any
other message (it may be a question that happens to start with "!").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from vagent_shared.hitl import YES_NO, format_question

CommandName = Literal["help", "reset", "stop", "why"]
COMMANDS: tuple[CommandName, ...] = ("help", "reset", "stop", "why")
_BY_NAME: dict[str, CommandName] = {c: c for c in COMMANDS}

_COMMAND = re.compile(r"!(\w+)(?:\s+(.*))?", re.DOTALL)


@dataclass(frozen=True)
class Command:
    name: CommandName
    #: Anything after the command word, trimmed ("" when none).
    args: str


def parse_command(text: str) -> Command | None:
    """`!help`, `!RESET now`, ... -> Command; anything else (incl. unknown `!foo`) -> None."""
    m = _COMMAND.fullmatch(text.strip())
    if m is None:
        return None
    name = _BY_NAME.get(m.group(1).lower())
    if name is None:
        return None
    return Command(name=name, args=(m.group(2) or "").strip())


def help_text(prefix: str, agent_name: str = "vagent") -> str:
    """The `!help` answer (Markdown): how to address the bot, its commands, confirmations."""
    example = format_question("Delete 3 records older than 2020-01-01?", YES_NO)
    return f"""\
**{agent_name}** is an AI assistant: ask it questions in plain language and it answers \
here, using its tools (for example to look things up in a database) when needed.

**How to talk to {agent_name}**
- **Direct chat:** just write; every message is for {agent_name}.
- **Group room:** mention {agent_name}, reply to one of its messages, or start your message \
with `{prefix}` (e.g. `{prefix} how many records were added this week?`).
- **Threads:** in a thread {agent_name} takes part in, every message is for it. Each thread is \
a separate conversation with its own memory; the main timeline is another one.

**Commands** (in a group room after the prefix or a mention, e.g. `{prefix} !reset`)
- `!help`: show this message.
- `!reset`: forget your conversation here (this thread, or the main timeline) and start over.
- `!stop`: stop the answer {agent_name} is writing for you.
- `!why`: as a reply to one of {agent_name}'s answers (or react to it with 🔍): how that answer \
came about (steps, tools, sources, tokens, time), in its thread. Only for the person who asked.

**Confirmations**
Before doing something that changes data, {agent_name} asks first, for example:
> {example}

Answer **yes** or **no** in the same thread, or react to the question with ✅ or ❌. \
Nothing is changed until you confirm.
"""
