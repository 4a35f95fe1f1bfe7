"""The memory tests' way of speaking to the real graph service: started with a document index
of its own, spoken to over HTTP exactly as the bot speaks to it (process_message,
submit_feedback), with the scripted model stand-in behind it. Each helper returns what the
user saw or what the model was given, which is what those tests assert on."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.factories import message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import post_sse
from vagent_graph.memory.recall import SECTION_HEADER
from vagent_shared import AcContext, SessionId
from vagent_shared.events import SSEEvent, TextFinal
from vagent_shared.knowledge import Audience, AudienceMember


@contextmanager
def running_graph(
    redis_url: str, data_dir: Path, llm: ScriptedLLMServer, index_prefix: str, **env: str
) -> Iterator[GraphProcess]:
    """The graph service, with documents and entities of its own (`index_prefix` and a random
    suffix), running until the block ends. A longer start-up allowance than the default: the
    service loads the offline embedding model, slow on a busy 2-core machine."""
    index = f"{index_prefix}_{uuid.uuid4().hex[:8]}"
    g = GraphProcess(redis_url, data_dir, llm.base_url, DOCS_INDEX=index, ENTITY_GRAPH=f"{index}_kg", **env)
    g.start(timeout=120)
    try:
        yield g
    finally:
        g.stop()


def put_document(
    g: GraphProcess, admin_token: str, domain: str, doc_id: str, markdown: str, *, category: str, tags: str
) -> None:
    """`markdown` indexed as document `doc_id` of `domain` through the admin API, so that a
    memory can be derived from it (and carry its category and tags)."""
    auth = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=g.url, headers=auth, timeout=120) as c:
        r = c.put(
            f"/admin/v1/documents/{domain}/{doc_id}",
            content=markdown,
            params={"category": category, "tags": tags},
            headers={"Content-Type": "text/markdown"},
        )
    assert r.status_code in (200, 201), r.text


def print_memory_log(graph: GraphProcess, *users: AcContext) -> None:
    """What the service logged about `users`' memories (audit records) and any warning or
    error about memory; called after each test, pytest shows it for a failing test only."""
    ids = [u.user_id for u in users]
    for line in graph.logs().splitlines():
        if "memory" in line and (any(i in line for i in ids) or '"warning"' in line or '"error"' in line):
            print(line[:600])


def room(*members: AcContext) -> Audience:
    """The audience the bot sends from a group room: `members` are the readers besides the
    asker, each checked by their roles (two more room members: the asker and the bot)."""
    return Audience(
        members=[AudienceMember(user_id=m.user_id, ac_context=m) for m in members],
        member_count=len(members) + 2,
    )


def dm(who: AcContext) -> SessionId:
    """A new direct chat of `who` (a new room: the bot sends no audience)."""
    return new_session(who.user_id)


def final(events: list[SSEEvent]) -> str:
    """The answer the user saw: the last final text of a stream (there must be one)."""
    found = [e for e in events if isinstance(e, TextFinal)]
    assert found, events
    return found[-1].content


@dataclass(frozen=True)
class MemoryChat:
    """One graph service spoken to as the bot does, and the model stand-in behind it.
    `question`: what `ask` says (a plain question that calls no tool)."""

    client: httpx.AsyncClient
    graph: GraphProcess
    llm: ScriptedLLMServer
    question: str

    async def say(
        self,
        sid: SessionId,
        text: str,
        who: AcContext,
        audience: Audience | None = None,
        **more: Any,
    ) -> list[SSEEvent]:
        """`text` posted to process_message as the bot forwards it (`audience`: the other
        readers; `more`: further request fields, e.g. `audience_unchecked`)."""
        body: dict[str, Any] = {**message_body(sid, text, who), **more}
        if audience is not None:
            body["audience"] = audience.model_dump(mode="json")
        return await post_sse(self.client, "/api/v1/process_message", body, self.graph.headers)

    async def answer(self, sid: SessionId, response: str) -> list[SSEEvent]:
        """The user's reply to a question the service asked (e.g. a yes/no confirmation)."""
        body = {"session_id": sid.format(), "response": response}
        return await post_sse(self.client, "/api/v1/submit_feedback", body, self.graph.headers)

    def system(self, i: int = -1) -> str:
        """The system message the model received in request `i`."""
        first = self.llm.requests[i]["messages"][0]
        assert first["role"] == "system", first
        return str(first["content"])

    def section(self, i: int = -1) -> str:
        """The framed memory section of request `i`'s system message ("" without one)."""
        text = self.system(i)
        return text[text.index(SECTION_HEADER) :] if SECTION_HEADER in text else ""

    async def ask(self, who: AcContext, audience: Audience | None = None, **more: Any) -> str:
        """A plain question in a new conversation; the memory section the model was given."""
        self.llm.push_text("Sure.")
        await self.say(dm(who), self.question, who, audience, **more)
        return self.section()

    async def command(
        self, sid: SessionId, text: str, who: AcContext, audience: Audience | None = None, **more: Any
    ) -> str:
        """A memory command (`!remember`, `!memory`, `!forget`): answered by the graph without
        any model call; the answer the user saw."""
        calls = len(self.llm.requests)
        found = final(await self.say(sid, text, who, audience, **more))
        assert len(self.llm.requests) == calls, f"{text!r} called the model"
        return found


@asynccontextmanager
async def chat_with(
    graph: GraphProcess, llm: ScriptedLLMServer, question: str = "How should you answer me?"
) -> AsyncIterator[MemoryChat]:
    """A MemoryChat with `graph` open until the block ends."""
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as client:
        yield MemoryChat(client, graph, llm, question)
