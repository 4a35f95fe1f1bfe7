"""The bot's own commands (`!help`, `!reset`, `!stop`, `!why`, and the schedule commands
`!schedule`, `!schedules`, `!unschedule`, `!timezone`: `schedule_commands`), recognised before
the agent sees a message.

Parsing runs on the text routing already cleaned of prefix, mention and reply fallback.
An unknown `!word` is not an error: it is returned as None and goes to the agent like any
other message (it may be a question that happens to start with "!"). So do the memory
commands `!remember`, `!memory` and `!forget` (vagent_shared.memory): the graph answers them,
because it holds the memories and knows who may recall which; `!help` only describes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from vagent_shared.hitl import YES_NO, format_question

CommandName = Literal["help", "reset", "stop", "why", "schedule", "schedules", "unschedule", "timezone"]
COMMANDS: tuple[CommandName, ...] = (
    "help",
    "reset",
    "stop",
    "why",
    "schedule",
    "schedules",
    "unschedule",
    "timezone",
)
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


def help_text(prefix: str, agent_name: str = "vagent", default_tz: str = "UTC") -> str:
    """The `!help` answer (Markdown): how to address the bot, its commands, confirmations.
    `default_tz`: SCHEDULE_DEFAULT_TZ, the zone of a user who set none."""
    example = format_question("Delete 3 records older than 2020-01-01?", YES_NO)
    return f"""\
**{agent_name}** is an AI assistant: ask it questions in plain language and it answers \
here, using its tools (for example to look things up in a database) when needed.

**How to talk to {agent_name}**
- **Direct chat:** just write; every message is for {agent_name}.
- **Group room:** mention {agent_name}, reply to one of its messages, or start your message \
with `{prefix}` (e.g. `{prefix} how many records were added this week?`).
- **Threads:** in a thread {agent_name} takes part in, every message is for it. Each thread is \
a separate conversation with its own history; the main timeline is another one.

**Commands** (in a group room after the prefix or a mention, e.g. `{prefix} !reset`)
- `!help`: show this message.
- `!reset`: forget your conversation here (this thread, or the main timeline) and start over. \
It does **not** forget your memories (see Memory below): `!forget` does.
- `!stop`: stop the answer {agent_name} is writing for you.
- `!why`: as a reply to one of {agent_name}'s answers (or react to it with 🔍): how that answer \
came about (steps, tools, sources, tokens, time), in its thread. Only for the person who asked.

**Memory** (if {agent_name} has it: what it remembers about you, across conversations)
- `!remember TEXT`: remember this (e.g. `!remember I prefer short answers`). It is recalled \
only where everyone reading was there when you said it; `!remember --everywhere TEXT` lets \
it be recalled in any room, so use it only for what anyone may know.
- `!memory`: list your memories that may be recalled here (in a direct chat: all of them), \
numbered, with when and where each was written.
- `!forget N`: forget memory number N of that list; `!forget all`: forget all your memories \
(asks first).

When {agent_name} remembers something on its own, its answer says so in a line starting with \
🧠 Remembered, so nothing is remembered silently.

**Scheduled tasks** (run later as you, with your access checked again at every run; the \
answer is posted here, below a line starting with ⏰ Scheduled)
- `!schedule WHEN: TASK`: for example `!schedule in 20m: remind me to call Bob`, \
`!schedule at 2026-12-01 14:00: …`, `!schedule every 2h: …`, \
`!schedule every weekday at 09:00: list my open tickets` or `!schedule cron 0 9 * * 1-5: …`. \
The answer gives the task's number and its next run.
- `!schedules`: your scheduled tasks here (in a direct chat: all of them), numbered, with \
their next run and last result.
- `!unschedule N`: delete task N; `!schedule pause N` / `!schedule resume N`: pause or resume it.
- `!timezone Europe/Oslo`: the time zone your times are in (given and shown); `!timezone` \
alone shows yours ({default_tz} until you set one).

**Confirmations**
Before doing something that changes data, {agent_name} asks first, for example:
> {example}

Answer **yes** or **no** in the same thread, or react to the question with ✅ or ❌. \
Nothing is changed until you confirm.
"""
