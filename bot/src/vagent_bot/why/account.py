"""🔍 "Why did it answer that?": the asker's account of one turn, as the bot posts it in Matrix.

Pure: which reactions and messages ask for it, and the compact Markdown account of a stored
TurnTrace (vagent_shared.traces). The I/O (finding the trace, checking who asks, posting the
account) is `why_answers`.

The audience rule (docs/knowledge.md) holds here too, judged when the account is asked for:
the account is read by everyone in the room NOW (a DM may have gained a member since the
turn, a newcomer may have joined a group room), so it names only what they all may read
(each item's `scope`, `vagent_shared.readers`); the rest is counted, never named. Tool
arguments are never shown: the account says what happened, not with what.

Memories the turn recalled (docs/memory.md) are listed by date and place only, never by text
(the trace holds no text): the current room is "this room", any other "a direct chat" or
"another room", never by name, since the room's readers need not know the others.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from vagent_bot.conversation.commands import parse_command
from vagent_shared.readers import ResultScope
from vagent_shared.session import SessionId
from vagent_shared.traces import (
    LlmCallTrace,
    MemoryTrace,
    SourceTrace,
    ToolCallTrace,
    ToolOutcome,
    TurnOutcome,
    TurnTrace,
)

#: 🔍 and 🔎; clients may add the emoji presentation selector (U+FE0F).
WHY_KEYS: Final = frozenset({"\U0001f50d", "\U0001f50e"})
_VS16: Final = "\ufe0f"

_OUTCOMES: Final[dict[TurnOutcome, str]] = {
    "answered": "✅ answered",
    "asked": "❓ asked you a question",
    "denied": "⛔ denied",
    "failed": "⚠️ failed",
    "cancelled": "⏹️ cancelled",
    "over_budget": "🪫 over the token budget",
}
_TOOL_OUTCOMES: Final[dict[ToolOutcome, str]] = {
    "ok": "done",
    "error": "failed",
    "denied": "denied",
    "asked": "waiting for your answer",
    "declined": "declined",
    "cancelled": "cancelled",
    "refused": "refused",
}
#: Confirmation answers shown as they were given; any other answer only as "answered".
_SHOWN_ANSWERS: Final = frozenset({"yes", "no"})

#: May everyone who reads the account read what an item was derived from?
MayRead = Callable[[ResultScope], bool]


def unscoped_only(scope: ResultScope) -> bool:
    """The readers are unknown (the room's members could not be listed): only what was derived
    from nobody's documents, entities or personal data is named."""
    return scope.empty


def judged_scope(item: ToolCallTrace | SourceTrace, asker: str) -> ResultScope:
    """What decides who may be told about `item`. A file is the asker's own message in this
    room: named as the room's history shows it. An item stored without a scope (by a version
    that recorded only the turn's own judgement) counts as the asker's alone: named only while
    nobody else reads the room."""
    if item.scope is not None:
        return item.scope
    if isinstance(item, SourceTrace) and item.kind == "file":
        return ResultScope()
    return ResultScope(personal_to=asker)


def is_why_reaction(key: str) -> bool:
    """A reaction asking why: 🔍 or 🔎, with or without U+FE0F."""
    return key.strip().replace(_VS16, "") in WHY_KEYS


def is_why_command(text: str) -> bool:
    """`!why` (any case, anything after it ignored), on the text routing already cleaned of
    prefix, mention and reply fallback (so `!ai !why` in a group room is one too)."""
    command = parse_command(text)
    return command is not None and command.name == "why"


def kept_for(ttl_seconds: int) -> str:
    """How long details are kept, in words: `7 days`, `1 day`, `12 hours`."""
    days, hours = divmod(ttl_seconds, 86400)
    if days >= 1:
        return f"{days} day{'s' if days != 1 else ''}"
    hours = max(1, ttl_seconds // 3600)
    return f"{hours} hour{'s' if hours != 1 else ''}"


def expired_notice(ttl_seconds: int) -> str:
    """The reply when the turn's details are gone (or were never kept)."""
    return f"🔍 I no longer have the details of that answer (they are kept {kept_for(ttl_seconds)})."


#: The pointer to the turn exists but its trace does not yet: the graph stores the trace when
#: the request ends (the pointer outlives nothing: both expire after TRACE_TTL_SECONDS, the
#: trace last), so the answer is still being written.
IN_PROGRESS_NOTICE = "🔍 That answer is still being written: react 🔍 again once it is complete."


def duration(ms: float) -> str:
    """`320 ms`, `4.2 s`, `2 min 5 s`."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def _tokens(n: int) -> str:
    return f"{n:,}"


@dataclass(frozen=True)
class _Step:
    at: datetime
    line: str


def _llm_line(call: LlmCallTrace) -> str:
    what = "chose tools" if call.purpose == "tools" else "wrote the answer"
    parts = [f"🧠 `{call.model}` {what}"]
    if call.input_tokens is None and call.output_tokens is None:
        parts.append("tokens not reported")
    else:
        parts.append(f"{_tokens(call.input_tokens or 0)} in / {_tokens(call.output_tokens or 0)} out tokens")
    if call.first_token_ms is not None:
        parts.append(f"first token after {duration(call.first_token_ms)}")
    parts.append(duration(call.duration_ms))
    return " · ".join(parts)


def _tool_line(call: ToolCallTrace) -> str:
    if call.decision == "denied":  # never offered: its name would say it exists (vagent trace keeps it)
        return "🔧 a tool you were not offered · ⛔ not run"
    source = "built-in" if call.source == "builtin" else call.source
    parts = [f"🔧 `{call.name}` ({source})"]
    if call.confirmation_asked:
        if call.confirmation_answer is None:
            parts.append("asked for your confirmation")
        else:
            answer = call.confirmation_answer.strip().lower()
            said = f"you said **{answer}**" if answer in _SHOWN_ANSWERS else "you answered"
            after = (
                f" after {duration(call.confirmation_seconds * 1000)}"
                if call.confirmation_seconds is not None
                else ""
            )
            parts.append(f"asked first, {said}{after}")
    if call.credential_used:
        parts.append("🔑 with your credential")
    outcome = _TOOL_OUTCOMES[call.outcome]
    if call.outcome == "ok" and call.result_chars:
        outcome += f", {_tokens(call.result_chars)} characters back"
    parts.append(outcome)
    if call.duration_ms:
        parts.append(duration(call.duration_ms))
    return " · ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def day(at: datetime) -> str:
    """`3 Nov 2026` (UTC): when a memory was written, without the time of day."""
    return f"{at.day} {at:%b %Y}"


def memory_place(room_id: str, *, here: str, dm_rooms: Collection[str]) -> str:
    """Where a memory was written, as the readers of `here` may be told: only the room they
    are in is named as such; any other is "a direct chat" or "another room" (never its name
    or id), and one written outside any room (an operator's tool) is "outside Matrix"."""
    if not room_id:
        return "outside Matrix"
    if room_id == here:
        return "this room"
    return "a direct chat" if room_id in dm_rooms else "another room"


def memories_line(memories: list[MemoryTrace], *, here: str, dm_rooms: Collection[str] = ()) -> str:
    """`🧠 2 memories recalled: from 3 Nov 2026 (this room), from 1 Nov 2026 (a direct chat)`
    ("" when none): which of the asker's memories the model was given, by date and place."""
    if not memories:
        return ""
    places = [
        f"from {day(m.created_at)} ({memory_place(m.room_id, here=here, dm_rooms=dm_rooms)})"
        for m in memories
    ]
    count = "1 memory" if len(memories) == 1 else f"{len(memories)} memories"
    return f"🧠 {count} recalled: {', '.join(places)}"


def memory_rooms(trace: TurnTrace) -> set[str]:
    """The other rooms the turn's memories were written in: those `account` must be told the
    kind of (a direct chat or not), asked of the homeserver by the caller."""
    here = SessionId.parse(trace.session_id).room_id
    return {m.room_id for m in trace.memories if m.room_id and m.room_id != here}


def account(trace: TurnTrace, may_read: MayRead, *, dm_rooms: Collection[str] = ()) -> str:
    """The compact Markdown account of one turn for its asker. `may_read`: whether everyone
    reading the room NOW may read what an item was derived from (`Readership.may_read` of the
    readers at the time of asking); what they may not is counted, never named. `dm_rooms`:
    which of `memory_rooms(trace)` are direct chats."""
    tools = [t for t in trace.tool_calls if may_read(judged_scope(t, trace.user_id))]
    sources = [s for s in trace.sources if may_read(judged_scope(s, trace.user_id))]
    hidden_tools = len(trace.tool_calls) - len(tools)
    hidden_sources = len(trace.sources) - len(sources)

    head = f"🔍 **How this answer came about:** {_OUTCOMES[trace.outcome]}"
    if trace.reason and trace.outcome != "answered":
        head += f" (`{trace.reason}`)"
    head += f" in {duration(trace.total_ms)}"
    if trace.first_token_ms is not None:
        head += f", first words after {duration(trace.first_token_ms)}"
    lines = [head, ""]

    steps = sorted(
        [_Step(c.started_at, _llm_line(c)) for c in trace.llm_calls]
        + [_Step(t.started_at, _tool_line(t)) for t in tools],
        key=lambda s: s.at,
    )
    if steps:
        lines.append("**Steps**")
        lines += [f"{i}. {s.line}" for i, s in enumerate(steps, 1)]
    elif not hidden_tools:
        lines.append("No model call and no tool were needed.")
    if sources:
        lines += ["", "**Sources**"]
        for s in sources:
            title = f"{s.title} (`{s.id}`)" if s.title else f"`{s.id}`"
            lines.append(f"- {'📄' if s.kind == 'document' else '🗂️' if s.kind == 'entity' else '📎'} {title}")
    if trace.memories:
        here = SessionId.parse(trace.session_id).room_id
        lines += ["", memories_line(trace.memories, here=here, dm_rooms=dm_rooms)]
    if hidden_tools or hidden_sources:
        hidden = [_plural(n, word) for n, word in ((hidden_tools, "step"), (hidden_sources, "source")) if n]
        lines += ["", f"🔒 Withheld here: {' and '.join(hidden)} not everyone in this room may see."]

    totals = [
        f"{_tokens(trace.input_tokens)} in / {_tokens(trace.output_tokens)} out tokens",
        _plural(len(trace.llm_calls), "model call"),
        _plural(len(trace.tool_calls), "tool call"),
        duration(trace.total_ms),
    ]
    lines += ["", f"**Total:** {' · '.join(totals)}"]
    return "\n".join(lines)
