"""A tiny deterministic chat model so `make run` works with no LLM configured.

It says it is offline, routes a few obvious requests to the tools it was OFFERED
(so access filtering stays visible): records requests to the records tools, "who is X?"
to lookup_entities, other questions to search_documents, whose passages it quotes with
their [n] citations. It summarises tool results, and otherwise says what it can do. It
streams word by word and reports token usage like a real model.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool

from vagent_graph.attachments import shown_texts
from vagent_graph.event_stream import text_of
from vagent_graph.file_messages import files_of, turn_file_messages
from vagent_graph.knowledge.retrieval import query_terms

OFFLINE_MODEL_NAME = "vagent-offline"
PREFIX = "(offline model) "
_DATE = r"(\d{4}(?:-\d{2}-\d{2})?)"
_DELETE = re.compile(rf"\b(delete|remove|purge)\b.*?\b(older than|before)\s+{_DATE}", re.I)
_OLDER = re.compile(rf"\b(older than|before)\s+{_DATE}", re.I)
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
_CALENDAR = re.compile(
    r"\b(?:what(?:'s| is)|show|list)\b.*\b(?:on )?my calendar\b"
    r"(?:.*?\b(?:on|for)\s+(?P<day>\d{4}-\d{2}-\d{2}))?",
    re.I,
)
_BOOK = re.compile(
    r"^\s*(?:please\s+)?book\s+(?:a\s+|an\s+)?(?P<title>.+?)\s+with\s+(?P<who>@[\w.=-]+:[\w.-]+(?:\s*(?:,|and)\s*@[\w.=-]+:[\w.-]+)*)"
    r"\s+on\s+(?P<day>\d{4}-\d{2}-\d{2})\s+at\s+(?P<time>\d{1,2}:\d{2})"
    r"(?:\s+for\s+(?P<minutes>\d{1,3})\s*min(?:utes)?)?[\s.!]*$",
    re.I,
)
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
_PASSAGE = re.compile(r"^\[(\d+)\] .*\n((?:.+\n?)+)", re.M)
#: How much of each passage the offline model quotes.
QUOTE_CHARS = 240
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _iso(d: str) -> str:
    return d if len(d) == 10 else f"{d}-01-01"


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


def _tool_names(tools: Sequence[dict[str, Any]]) -> set[str]:
    return {t.get("function", {}).get("name", "") for t in tools}


def plan_reply(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> AIMessage:
    """The whole decision, pure: what the offline model answers to this conversation."""
    offered = _tool_names(tools)
    last = messages[-1] if messages else HumanMessage(content="")
    if isinstance(last, ToolMessage):
        if last.name == "search_documents":
            question = next((str(m.content) for m in reversed(messages) if isinstance(m, HumanMessage)), "")
            return AIMessage(content=PREFIX + quote_passages(str(last.content), question))
        return AIMessage(content=PREFIX + str(last.content))
    text = text_of(last)
    if isinstance(last, HumanMessage) and (held := turn_file_messages(messages)):
        return AIMessage(content=PREFIX + about_files(held))

    def call(name: str, args: dict[str, Any]) -> AIMessage:
        if name not in offered:
            return AIMessage(content=PREFIX + f"I can't do that: you don't have access to `{name}`.")
        return AIMessage(
            content="",
            tool_calls=[
                {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"}
            ],
        )

    if m := _DELETE.search(text):
        return call("delete_records", {"older_than": _iso(m.group(3))})
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
    if m := _CALENDAR.search(text):
        day = m.group("day")
        return call(CALENDAR_LIST, {"start": f"{day}T00:00:00", "end": f"{day}T23:59:59"} if day else {})
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


def about_files(held: Sequence[BaseMessage]) -> str:
    """What the offline model can say about the user's files: a document's first lines, an
    image's type and size (it cannot see), so `make run` shows what the model was given."""
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
            quoted = "\n".join(f"> {ln[:200]}" for ln in lines[:FILE_QUOTE_LINES]) or "> (no text)"
            pages = f", {f['pages']} page{'' if f['pages'] == 1 else 's'}" if f.get("pages") else ""
            parts.append(f"{name} ({f.get('mime')}{pages}) begins:\n{quoted}")
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


def _relevant_part(text: str, question: str, limit: int = QUOTE_CHARS) -> str:
    """The part of a passage that answers best: from its sentence or line sharing the most
    words with the question, up to about `limit` characters, cut at a sentence end."""
    pieces = [p.strip() for p in _SENTENCE.split(text) if p.strip()]
    if not pieces:
        return ""
    words = set(query_terms(question))
    scores = [len(words & {w.lower() for w in re.findall(r"\w+", p)}) for p in pieces]
    start = scores.index(max(scores))
    quoted = ""
    for piece in pieces[start:]:
        if quoted and len(quoted) + len(piece) + 1 > limit:
            break
        quoted = f"{quoted} {piece}".strip()
    return quoted if len(quoted) <= limit else quoted[:limit].rsplit(" ", 1)[0] + " …"


def quote_passages(result: str, question: str = "", most: int = 3) -> str:
    """What the offline model says about search results: for each of the first documents
    found, the best part of its passages, quoted with its citation number (it cannot reason
    about them)."""
    passages = _PASSAGE.findall(result)
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
        "delete_records": '- delete old records, after you confirm: "delete records older than 2020"',
        "ask_user": '- ask you a clarifying question: "which database?"',
        "search_documents": '- search the documents you may read: "what is the travel policy?"',
        "lookup_entities": '- look up people, teams and projects: "who is Dana Lee?"',
        "list_my_tickets": '- show your tickets in the ticket service: "what are my open tickets?"',
        "create_ticket": '- open a ticket, after you confirm: "open a ticket about the printer"',
        CALENDAR_LIST: '- show your calendar: "what is on my calendar on 2026-12-01?"',
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
