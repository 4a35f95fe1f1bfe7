"""A tiny deterministic chat model so `make run` works with no LLM configured.

It says it is offline, routes a few obvious requests to the tools it was OFFERED, and only
to those, like a well-behaved model: a request for a tool it was not offered is answered
"I can't do that here." without the tool's name (a hidden tool stays hidden). Records
requests go to the records tools ("delete old records" asks which year first), "who is X?"
to lookup_entities, calendar questions to the calendar with the span they name ("this week"),
other questions to search_documents, whose passages it quotes with their [n] citations.
Tool results are rendered as short Markdown (result_rendering.py), refusals and a "no" in
the second person; otherwise it says what it can do. It streams word by word and reports
token usage like a real model. Every example its help gives works on the demo data
(deploy/dev/knowledge, deploy/dev/calendar.yaml).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool

from vagent_graph.attachments import shown_texts
from vagent_graph.attachments.messages import files_of, turn_file_messages
from vagent_graph.knowledge.retrieval import query_terms
from vagent_graph.memory.recall import SECTION_HEADER
from vagent_graph.models.result_rendering import period_in, render_result
from vagent_graph.models.text import text_of
from vagent_shared.memory import MEMORY_MAX_CHARS, REMEMBER_TOOL, REMEMBERED
from vagent_shared.schedules import SCHEDULE_TOOL, TASK_MAX_CHARS

OFFLINE_MODEL_NAME = "vagent-offline"
PREFIX = "(offline model) "
_DATE = r"(\d{4}(?:-\d{2}-\d{2})?)"
_DELETE = re.compile(rf"\b(delete|remove|purge)\b.*?\b(older than|before)\s+{_DATE}", re.I)
_OLDER = re.compile(rf"\b(older than|before)\s+{_DATE}", re.I)
#: "delete old records": no date, so it asks which one first (ask_user).
_DELETE_UNDATED = re.compile(r"\b(delete|remove|purge)\b.*\brecords?\b", re.I)
DELETE_WHEN = "Delete records older than which year?"
DELETE_WHEN_OPTIONS = ["2018", "2020", "2022"]
_YEAR = re.compile(r"\b(\d{4}(?:-\d{2}-\d{2})?)\b")
#: The answer to a request for a tool that was not offered: it never names the tool.
CANT = "I can't do that here."
_COUNT = re.compile(r"\b(how many|count|number of)\b.*\brecords?\b", re.I)
_LIST = re.compile(r"\b(list|show)\b.*\brecords?\b", re.I)
_WHICH_DB = re.compile(r"\b(which database|ask me)\b", re.I)
_ENTITY = re.compile(
    r"^\s*(?:who is|who's|who works on|who leads|who runs|what is connected to|what is related to)\s+"
    r"(?P<name>.+?)[\s?.!]*$",
    re.I,
)
_TICKET_NEW = re.compile(
    r"^\s*(?:please\s+)?(?:open|create|file|raise|submit)\s+(?:a|an|one)\s+(?:new\s+)?"
    r"(?:(?P<priority>low|normal|high)[- ]priority\s+)?ticket\b[\s:,-]*(?:about|for|titled|saying)?\s*"
    r"(?P<title>.*?)[\s.!]*$",
    re.I,
)
_TICKETS = re.compile(r"\b(my|open|closed)\b.*\btickets?\b", re.I)
#: The demo calendar MCP server's tools (deploy/dev, `mcp_servers: - name: calendar`).
CALENDAR_LIST, CALENDAR_CREATE = "calendar__list_events", "calendar__create_event"
_CALENDAR = re.compile(r"\b(?:what(?:'s| is)|show|list)\b.*\b(?:on |in )?my (?:calendar|agenda)\b", re.I)
_BOOK = re.compile(
    r"^\s*(?:please\s+)?book\s+(?:a\s+|an\s+)?(?P<title>.+?)\s+with\s+(?P<who>@[\w.=-]+:[\w.-]+(?:\s*(?:,|and)\s*@[\w.=-]+:[\w.-]+)*)"
    r"\s+on\s+(?P<day>\d{4}-\d{2}-\d{2})\s+at\s+(?P<time>\d{1,2}:\d{2})"
    r"(?:\s+for\s+(?P<minutes>\d{1,3})\s*min(?:utes)?)?[\s.!]*$",
    re.I,
)
#: "remember that I prefer short answers": one memory (the `remember` tool, if offered).
_REMEMBER = re.compile(r"^\s*(?:please\s+)?remember(?:\s+that)?\s*[:,]?\s+(?P<text>\S.*)$", re.I | re.S)
#: "what do you remember about me?": the memories recalled into its system prompt.
_RECALL = re.compile(r"\bwhat do you (?:remember|know) about me\b", re.I)
#: "remind me every morning at 9 to ...", "schedule every weekday at 09:00: ...": a
#: `schedule_task` call (the user confirms it), with the WHEN found by `_WHEN`.
_SCHEDULE = re.compile(
    r"^\s*(?:please\s+)?(?P<verb>remind me|schedule)\b[\s:,]*(?P<rest>.*?)[\s.!]*$", re.I | re.S
)
_CLOCK = r"(?P<h>\d{1,2})(?::(?P<m>\d{2}))?\s*(?P<ampm>am|pm)?"
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WHEN = re.compile(
    rf"\b(?:every\s+(?P<day>morning|day|weekday|{'|'.join(_DAYS)})(?:\s+at\s+{_CLOCK})?"
    r"|every\s+(?P<n>\d+)\s*(?P<unit>seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)\b"
    r"|in\s+(?P<in_n>\d+)\s*(?P<in_unit>seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)\b"
    r"|at\s+(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2})"
    r"|cron\s+(?P<cron>(?:\S+\s+){4}\S+?)(?=:|\s|$))",
    re.I,
)
_UNIT = {"s": "s", "m": "m", "h": "h", "d": "d"}
#: A scheduled reminder coming due: "Remind me to water the plants" (no time in it).
_REMINDER = re.compile(r"^\s*remind me to\s+(?P<what>\S.*?)[\s.!]*$", re.I | re.S)
_HELP = re.compile(r"\b(help|what can you do|who are you|what are you)\b", re.I)
_CONNECTED = re.compile(
    r"^\s*how (?:is|are) (?P<name>.+?) (?:connected|related|linked) to .+?[\s?.!]*$", re.I
)
_QUESTION = re.compile(
    r"\?\s*$|^\s*(what|who|where|when|why|how|which|is|are|do|does|can|should|tell me|find|search|"
    r"look up|show me|explain|summari[sz]e)\b",
    re.I,
)
#: Lines of a document the offline model quotes; a PDF's page marks are not quoted.
FILE_QUOTE_LINES = 3
_PAGE = re.compile(r"^\[page \d+\]$")
#: A passage's heading in search_documents' result (tools/documents.py `format_hits`); its
#: body runs to the next heading, blank lines included.
_PASSAGE_HEAD = re.compile(r"^\[(\d+)\] .*\(document [^()\s]+\)$", re.M)
#: How much of each passage the offline model quotes.
QUOTE_CHARS = 240
#: How much of a list or table of figures under a matching heading it quotes.
LIST_QUOTE_LINES, LIST_QUOTE_CHARS = 8, 600
_SENTENCE = re.compile(r"(?<=[.!?])[^\S\n]+")
_BULLET = re.compile(r"^\s*(?:[-*•+]|\d{1,2}[.)])\s+")
#: A line of a list or table: a bullet, a table row, or `label: figures`.
_LIST_ITEM = re.compile(r"^\s*(?:[-*•+]\s|\d{1,2}[.)]\s|\|)|^[^.!?:,]{1,40}:\s*\S*\d")
_ATTACHMENT = re.compile(r"^«attachment (\w+) begin»\n.*?\n«attachment \1 end»$", re.M | re.S)


def _iso(d: str) -> str:
    return d if len(d) == 10 else f"{d}-01-01"


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


def _tool_names(tools: Sequence[dict[str, Any]]) -> set[str]:
    return {t.get("function", {}).get("name", "") for t in tools}


def _call(name: str, args: dict[str, Any], offered: set[str]) -> AIMessage:
    """A call of `name` if it was offered; otherwise "I can't do that here.", never its name."""
    if name not in offered:
        return AIMessage(content=PREFIX + CANT + ' Say "help" to see what I can do.')
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"}],
    )


def schedule_args(verb: str, rest: str, now: datetime) -> dict[str, str] | None:
    """`schedule_task`'s arguments for "remind me every morning at 9 to X" / "schedule every
    weekday at 09:00: X" (None: no time the offline model understands, or no task). Wall-clock
    phrases become cron (read in the user's zone by the tool), "in 20 minutes" an ISO time."""
    m = _WHEN.search(rest)
    if m is None:
        return None
    task = (rest[: m.start()] + " " + rest[m.end() :]).strip(" \t\n:,;-")
    if verb.lower() == "remind me":
        task = "Remind me to " + re.sub(r"^to\s+", "", task, flags=re.I) if task else ""
    if not task:
        return None
    args = {"task": task[:TASK_MAX_CHARS]}
    if m.group("day"):
        hour, minute = int(m.group("h") or 9), int(m.group("m") or 0)
        if m.group("ampm") and m.group("ampm").lower() == "pm" and hour < 12:
            hour += 12
        elif m.group("ampm") and m.group("ampm").lower() == "am" and hour == 12:
            hour = 0
        if hour > 23 or minute > 59:
            return None
        day = m.group("day").lower()
        dow = "1-5" if day == "weekday" else str(_DAYS.index(day) + 1) if day in _DAYS else "*"
        args["cron"] = f"{minute} {hour} * * {dow}"
    elif m.group("n"):
        args["every"] = m.group("n") + _UNIT[m.group("unit")[0].lower()]
    elif m.group("in_n"):
        size = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group("in_unit")[0].lower()]
        at = now.astimezone(UTC) + timedelta(seconds=int(m.group("in_n")) * size)
        args["at"] = at.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    elif m.group("date"):
        args["at"] = f"{m.group('date')}T{m.group('time')}:00"
    else:
        args["cron"] = " ".join(m.group("cron").split())
    return args


def question_of(messages: Sequence[BaseMessage]) -> str:
    """The user's own words in the last human message (without the attachments' text)."""
    human = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    if human is None:
        return ""
    rest = _ATTACHMENT.sub("", text_of(human))
    paragraphs = [p.strip() for p in rest.split("\n\n") if p.strip()]
    own = [p for p in paragraphs if not p.startswith("Attachment") and "sent by the user" not in p]
    return own[-1] if own else ""


def _asked_with(messages: Sequence[BaseMessage], call_id: str) -> dict[str, Any]:
    """The arguments of the tool call `call_id` (what was asked, for an ask_user result)."""
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            for tc in m.tool_calls:
                if tc.get("id") == call_id:
                    return dict(tc.get("args") or {})
    return {}


def _label(tool: str) -> str:
    """A tool's name as words (`calendar__create_event` -> "create event"), for a message
    that would otherwise show the internal name."""
    return tool.rsplit("__", 1)[-1].replace("_", " ")


def after_tool(
    messages: Sequence[BaseMessage], last: ToolMessage, offered: set[str], now: datetime
) -> AIMessage:
    """What the offline model says after a tool result: passages quoted, data rendered, the
    answer to its own question acted on, a "no" or a refusal said to the person."""
    name = last.name or ""
    content = text_of(last).strip()
    question = question_of(messages)
    if name == "search_documents":
        return AIMessage(content=PREFIX + quote_passages(content, question))
    if name == REMEMBER_TOOL:  # the answer shows the 🧠 line itself (workflow/graph.py)
        done = content.startswith(REMEMBERED)
        return AIMessage(content=PREFIX + ("I'll remember that." if done else content))
    if name == "ask_user" and _asked_with(messages, last.tool_call_id).get("question") == DELETE_WHEN:
        answer = content.removeprefix("The user answered:").strip()
        if m := _YEAR.search(answer):
            return _call("delete_records", {"older_than": _iso(m.group(1))}, offered)
        return AIMessage(content=PREFIX + "I need a year, like 2020; nothing was deleted.")
    if content.startswith(("The user said no", "The user declined")):
        return AIMessage(content=PREFIX + "You said no; nothing was changed.")
    if content.startswith(CANT) or content.startswith("Access denied: the tool"):
        return AIMessage(content=PREFIX + CANT)
    if content.startswith("Access denied:"):
        return AIMessage(
            content=PREFIX + "Access denied: you may not use the system this acts on; nothing was done."
        )
    if content.startswith("The user answered:"):
        return AIMessage(content=PREFIX + "You answered:" + content.removeprefix("The user answered:"))
    if name == SCHEDULE_TOOL:  # "Scheduled task 3 ...", or why not
        return AIMessage(content=PREFIX + content.replace("The user can list", "You can list"))
    text = render_result(name, content, question, now)
    if name:  # never the internal name (`server__tool`) in what the person reads
        text = text.replace(name, _label(name))
    return AIMessage(content=PREFIX + text)


def plan_reply(
    messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]], now: datetime | None = None
) -> AIMessage:
    """The whole decision, pure: what the offline model answers to this conversation (`now`:
    what "today" and "this week" mean; the current time when None)."""
    offered = _tool_names(tools)
    now = now or datetime.now(UTC)
    last = messages[-1] if messages else HumanMessage(content="")
    if isinstance(last, ToolMessage):
        return after_tool(messages, last, offered, now)
    text = text_of(last)
    if isinstance(last, HumanMessage) and (held := turn_file_messages(messages)):
        return AIMessage(content=PREFIX + about_files(held, question_of(messages)))

    def call(name: str, args: dict[str, Any]) -> AIMessage:
        return _call(name, args, offered)

    if (m := _REMEMBER.match(text)) and REMEMBER_TOOL in offered:
        return call(REMEMBER_TOOL, {"text": m.group("text").strip()[:MEMORY_MAX_CHARS]})
    if _RECALL.search(text):
        return AIMessage(content=PREFIX + recalled_notes(messages))
    if (m := _SCHEDULE.match(text)) and (args := schedule_args(m.group("verb"), m.group("rest"), now)):
        return call(SCHEDULE_TOOL, args)
    if m := _REMINDER.match(text):
        return AIMessage(content=PREFIX + f"⏰ Reminder: {m.group('what')}.")
    if m := _DELETE.search(text):
        return call("delete_records", {"older_than": _iso(m.group(3))})
    if _DELETE_UNDATED.search(text):
        if "delete_records" in offered and "ask_user" in offered:
            return call("ask_user", {"question": DELETE_WHEN, "options": DELETE_WHEN_OPTIONS})
        if "delete_records" in offered:
            return AIMessage(
                content=PREFIX + 'Older than which year? Say, e.g., "delete records older than 2020".'
            )
        return call("delete_records", {})
    if _COUNT.search(text):
        sql = "SELECT COUNT(*) AS records FROM records"
        if m := _OLDER.search(text):
            sql += f" WHERE created_at < '{_iso(m.group(2))}'"
        return call("database_query", {"sql": sql})
    if _LIST.search(text):
        return call(
            "database_query",
            {"sql": "SELECT id, customer, amount, created_at FROM records ORDER BY created_at LIMIT 10"},
        )
    if m := _BOOK.search(text):
        return call(CALENDAR_CREATE, _booking(m))
    if _CALENDAR.search(text):
        period = period_in(text, now)
        return call(CALENDAR_LIST, period.args() if period else {})
    if m := _TICKET_NEW.search(text):
        title = m.group("title").strip().strip("\"'“”") or "Help needed"
        return call(
            "create_ticket", {"title": title[:200], "priority": (m.group("priority") or "normal").lower()}
        )
    if _TICKETS.search(text):
        status = next((w for w in ("closed", "all") if re.search(rf"\b{w}\b", text, re.I)), "open")
        return call("list_my_tickets", {"status": status})
    if _WHICH_DB.search(text):
        return call("ask_user", {"question": "Which database?", "options": ["production", "staging"]})
    if _HELP.search(text):
        return AIMessage(content=PREFIX + _help(offered))
    if (m := _CONNECTED.search(text)) and "lookup_entities" in offered:
        return call("lookup_entities", {"query": m.group("name")[:200], "depth": 2})
    if (m := _ENTITY.search(text)) and "lookup_entities" in offered:
        return call("lookup_entities", {"query": m.group("name")[:200]})
    if _QUESTION.search(text) and "search_documents" in offered:
        return call("search_documents", {"query": text.strip()[:500]})
    return AIMessage(content=PREFIX + _help(offered))


def recalled_notes(messages: Sequence[BaseMessage]) -> str:
    """What the system prompt's memory section holds (memory/recall.py), as a list."""
    system = next((text_of(m) for m in messages if isinstance(m, SystemMessage)), "")
    _, found, notes = system.partition(SECTION_HEADER)
    lines = [line for line in notes.splitlines() if line.startswith("- ")]
    if not found or not lines:
        return "I don't remember anything about you that I may use here."
    return "I remember (from earlier conversations):\n" + "\n".join(lines)


def about_files(held: Sequence[BaseMessage], question: str = "") -> str:
    """What the offline model can say about the user's files: a document's lines that answer
    the question best (its first lines when none do), an image's type and size (it cannot
    see), so `make run` shows what the model was given."""
    parts: list[str] = []
    for message in held:
        texts = iter(shown_texts(text_of(message)))
        for f in files_of(message):
            name = f"`{f.get('name', 'file')}`"
            if f.get("kind") == "image":
                size = f"{f.get('width')}×{f.get('height')} pixels, " if f.get("width") else ""
                parts.append(
                    f"{name} is an image ({f.get('mime')}, {size}{_kb(f.get('size'))}). "
                    "I'm running without a language model, so I cannot see what it shows."
                )
                continue
            lines = [ln for ln in next(texts, "").splitlines() if ln.strip() and not _PAGE.match(ln)]
            scores = [_score(ln, question) for ln in lines]
            best = scores.index(max(scores)) if scores and max(scores) > 0 else 0
            heading = best and (lines[best].lstrip().startswith("#") or _is_heading(lines[best]))
            # a matching heading is quoted with what it heads ("## Action items" and the items)
            chosen = lines[
                best : best + (1 + FILE_QUOTE_LINES if heading else 1 if best else FILE_QUOTE_LINES)
            ]
            quoted = "\n".join(f"> {ln[:200]}" for ln in chosen) or "> (no text)"
            pages = f", {f['pages']} page{'' if f['pages'] == 1 else 's'}" if f.get("pages") else ""
            says = "says" if best else "begins"
            parts.append(f"{name} ({f.get('mime')}{pages}) {says}:\n{quoted}")
    return "\n\n".join(parts)


def _kb(size: Any) -> str:
    return f"{max(1, round(size / 1024))} KB" if isinstance(size, int) else "size unknown"


def _booking(m: re.Match[str]) -> dict[str, Any]:
    """`book <title> with @a:x and @b:x on 2026-12-01 at 10:00 [for 45 minutes]` as the
    calendar's create_event arguments."""
    hour, minute = (int(x) for x in m.group("time").split(":"))
    start = datetime.fromisoformat(m.group("day")).replace(hour=hour % 24, minute=minute % 60)
    end = start + timedelta(minutes=int(m.group("minutes") or 30))
    return {
        "title": m.group("title").strip().strip("\"'“”")[:200] or "Meeting",
        "start": start.isoformat(timespec="minutes"),
        "end": end.isoformat(timespec="minutes"),
        "attendees": re.findall(r"@[\w.=-]+:[\w.-]+", m.group("who")),
    }


def _stem(word: str) -> str:
    """A word's crude stem, so "engineers" meets "engineering" and "bands" meets "band"."""
    w = word.lower()
    for suffix in ("ing", "ers", "er", "es", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 4:
            w = w[: -len(suffix)]
            break
    return w[:6]


def _score(piece: str, question: str) -> int:
    """How many of the question's words the piece has (by stem)."""
    wanted = {_stem(w) for w in query_terms(question)}
    return len(wanted & {_stem(w) for w in re.findall(r"\w+", piece)})


def _unbulleted(line: str) -> str:
    """A line without its list marker: quoted under "- " it must not read "- - Revenue"."""
    return _BULLET.sub("", line, count=1).strip()


def _is_heading(line: str) -> bool:
    """A short line that introduces what follows: no sentence end, upper case or ending in ":"."""
    line = line.strip()
    return 0 < len(line) <= 80 and line[-1] not in ".!?" and (line.isupper() or line.endswith(":"))


def _list_under(lines: list[str], i: int) -> list[str]:
    """The list or table of figures right below heading `i` (blank lines before it skipped),
    at most LIST_QUOTE_LINES lines; empty when what follows is no list."""
    j = i + 1
    while j < len(lines) and not lines[j].strip():
        j += 1
    items: list[str] = []
    while (
        j < len(lines) and lines[j].strip() and _LIST_ITEM.search(lines[j]) and len(items) < LIST_QUOTE_LINES
    ):
        items.append(_unbulleted(lines[j]))
        j += 1
    return items if len(items) >= 2 else []


@dataclass(frozen=True)
class _Piece:
    """A sentence of a passage: on which line its block starts, and whether it ends a list
    item or heading (which has no sentence end of its own)."""

    line: int
    text: str
    ends_item: bool = False


def _blocks(lines: list[str]) -> list[tuple[int, str, bool]]:
    """The passage as blocks (first line, text, is an item or heading): a list item or
    heading stays a line of its own, lines of wrapped prose become one paragraph."""
    blocks: list[tuple[int, str, bool]] = []
    prose: list[str] = []
    first = 0
    for i, line in enumerate([*lines, ""]):
        single = bool(line.strip()) and (_LIST_ITEM.search(line) is not None or _is_heading(line))
        if prose and (not line.strip() or single):
            blocks.append((first, " ".join(prose), False))
            prose = []
        if single:
            blocks.append((i, _unbulleted(line), True))
        elif line.strip():
            first = i if not prose else first
            prose.append(line.strip())
    return blocks


def _joined(pieces: list[_Piece]) -> str:
    """Pieces as running text; a list item without a sentence end is followed by ";" (unless
    what follows reads as its continuation)."""
    out = ""
    for before, piece in zip([None, *pieces], pieces, strict=False):
        if before is not None:
            item_end = before.ends_item and out[-1] not in ".!?:;," and not piece.text[:1].islower()
            out += "; " if item_end else " "
        out += piece.text
    return out


def _relevant_part(text: str, question: str, limit: int = QUOTE_CHARS) -> str:
    """The part of a passage that answers best: from its sentence or line sharing the most
    words with the question (by stem), up to about `limit` characters, cut at a sentence end.
    Under a matching heading ("ENGINEERING SALARY BANDS") the list of figures below it is
    quoted (up to LIST_QUOTE_CHARS): that is what the question asks for, not the heading."""
    lines = text.splitlines()
    pieces: list[_Piece] = []
    for line_no, block, is_item in _blocks(lines):
        sentences = [p.strip() for p in _SENTENCE.split(block) if p.strip()]
        pieces += [_Piece(line_no, p, is_item and n == len(sentences) - 1) for n, p in enumerate(sentences)]
    if not pieces:
        return ""
    scores = [_score(p.text, question) for p in pieces]
    start = scores.index(max(scores))
    best = pieces[start]
    if max(scores) > 0 and _is_heading(lines[best.line]) and (items := _list_under(lines, best.line)):
        quoted = f"{best.text.rstrip(':')}: " + _joined([_Piece(0, item, True) for item in items])
        return (
            quoted if len(quoted) <= LIST_QUOTE_CHARS else quoted[:LIST_QUOTE_CHARS].rsplit(" ", 1)[0] + " …"
        )
    chosen: list[_Piece] = []
    for piece in pieces[start:]:
        if chosen and len(_joined([*chosen, piece])) > limit:
            break
        chosen.append(piece)
    quoted = _joined(chosen)
    return quoted if len(quoted) <= limit else quoted[:limit].rsplit(" ", 1)[0] + " …"


def passages_of(result: str) -> list[tuple[str, str]]:
    """search_documents' passages as (citation number, body); a body runs to the next
    passage's heading, blank lines and all (a list below a heading stays with it)."""
    heads = list(_PASSAGE_HEAD.finditer(result))
    ends = [h.start() for h in heads[1:]] + [len(result)] * bool(heads)
    return [(h.group(1), result[h.end() : end].strip("\n")) for h, end in zip(heads, ends, strict=True)]


def quote_passages(result: str, question: str = "", most: int = 3) -> str:
    """What the offline model says about search results: for each of the first documents
    found, the best part of its passages, quoted with its citation number (it cannot reason
    about them)."""
    passages = passages_of(result)
    if not passages:
        return result.split("\n", 1)[0]
    by_document: dict[str, list[str]] = {}  # a document's passages share its number
    for n, body in passages:
        by_document.setdefault(n, []).append(body)
    lines = ["From the documents you may read:"]
    lines += [
        f"- {_relevant_part(chr(10).join(bodies), question)} [{n}]"
        for n, bodies in list(by_document.items())[:most]
    ]
    return "\n".join(lines)


def _help(offered: set[str]) -> str:
    lines = [
        "I'm running without a language model (no LLM is configured), so I only understand a few requests."
    ]
    examples = {
        "database_query": '- count or list records: "how many records are older than 2020?"',
        "delete_records": '- delete old records, after you confirm: "delete records older than 2020" '
        '(or "delete old records", and I ask which year)',
        "ask_user": '- ask you a clarifying question: "which database?"',
        REMEMBER_TOOL: '- remember something for later conversations: "remember that I prefer short '
        'answers", then "what do you remember about me?"',
        SCHEDULE_TOOL: '- schedule a task, after you confirm: "remind me every weekday at 9 to check '
        'my open tickets" (then !schedules lists it)',
        "search_documents": '- search the documents you may read: "what is the travel policy?"',
        "lookup_entities": '- look up people, teams and projects: "who is Ana Costa?"',
        "list_my_tickets": '- show your tickets in the ticket service: "what are my open tickets?"',
        "create_ticket": '- open a ticket, after you confirm: "open a ticket about the printer"',
        CALENDAR_LIST: '- show your calendar: "what is on my calendar this week?" '
        '(or "today", "tomorrow", "on 2026-11-16")',
        CALENDAR_CREATE: "- book a meeting, after you confirm: "
        '"book a design review with @bob:localhost on 2026-12-01 at 10:00"',
    }
    usable = [examples[n] for n in examples if n in offered]
    if usable:
        lines.append("With your access I can:")
        lines.extend(usable)
    else:
        lines.append("You have no tools available, so I can only chat.")
    return "\n".join(lines)


def _usage(messages: Sequence[BaseMessage], reply: AIMessage) -> dict[str, int]:
    inp = sum(len(str(m.content).split()) + 1 for m in messages)
    out = max(1, len(str(reply.content).split()) + 10 * len(reply.tool_calls))
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}


class OfflineChatModel(BaseChatModel):
    """Deterministic stand-in for an LLM; supports bind_tools and streaming."""

    model_name: str = OFFLINE_MODEL_NAME

    @property
    def _llm_type(self) -> str:
        return OFFLINE_MODEL_NAME

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:  # type: ignore[override]
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _reply(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        reply = plan_reply(messages, kwargs.get("tools") or [])
        reply.usage_metadata = _usage(messages, reply)  # type: ignore[assignment]
        reply.response_metadata = {"model_name": self.model_name, "finish_reason": "stop"}
        return reply

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages, kwargs))])

    def _chunks(self, reply: AIMessage) -> Iterator[AIMessageChunk]:
        if reply.tool_calls:
            yield AIMessageChunk(
                content="",
                tool_call_chunks=[
                    tool_call_chunk(name=tc["name"], args=_json(tc["args"]), id=tc["id"], index=i)
                    for i, tc in enumerate(reply.tool_calls)
                ],
            )
        else:
            for piece in _words(str(reply.content)):
                yield AIMessageChunk(content=piece)
        yield AIMessageChunk(
            content="",
            usage_metadata=reply.usage_metadata,
            response_metadata={"model_name": self.model_name, "finish_reason": "stop"},
            chunk_position="last",
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in self._chunks(self._reply(messages, kwargs)):
            gen = ChatGenerationChunk(message=chunk)
            if run_manager and chunk.content:
                run_manager.on_llm_new_token(str(chunk.content), chunk=gen)
            yield gen

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._chunks(self._reply(messages, kwargs)):
            gen = ChatGenerationChunk(message=chunk)
            if run_manager and chunk.content:
                await run_manager.on_llm_new_token(str(chunk.content), chunk=gen)
            yield gen


def _json(args: dict[str, Any]) -> str:
    import json

    return json.dumps(args)
