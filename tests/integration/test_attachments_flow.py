"""Files in a turn through the real graph service (a process, real HTTP and Redis, a scripted
OpenAI-compatible LLM, an MCP server process): what the model is given, what the user is
told, what is kept, and what never gets through (reasoning, hostile files)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
import yaml

from tests.support.factories import ac, message_body, new_session
from tests.support.files import corrupt_pdf, docx_with_text, pdf_with_text, png, zip_bomb_docx
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.mcp_server import McpTestServer, tool
from tests.support.procs import BIN
from tests.support.sse import kinds, post_sse
from vagent_shared import SessionId
from vagent_shared.events import ImageOut, Progress, SSEEvent, TextChunk, TextFinal

PM = "/api/v1/process_message"
MAX_BYTES = 2 * 1024 * 1024
REPORT = ["Quarterly report Q3", "Revenue grew 12% to 4.2 million.", "Churn fell to 3%."]
PICTURE = png(640, 480)


class Stack:
    def __init__(self, graph: GraphProcess) -> None:
        self.graph = graph

    async def send(
        self, sid: SessionId, text: str, files: Sequence[tuple[str, bytes]] = (), **extra: Any
    ) -> list[SSEEvent]:
        async with httpx.AsyncClient(base_url=self.graph.url, timeout=60) as c:
            return await post_sse(c, PM, self.body(sid, text, files, **extra), self.graph.headers)

    async def raw(self, body: dict[str, Any] | bytes) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.graph.url, timeout=60) as c:
            if isinstance(body, bytes):
                headers = {**self.graph.headers, "Content-Type": "application/json"}
                return await c.post(PM, content=body, headers=headers)
            return await c.post(PM, json=body, headers=self.graph.headers)

    @staticmethod
    def body(
        sid: SessionId, text: str, files: Sequence[tuple[str, bytes]] = (), **extra: Any
    ) -> dict[str, Any]:
        body = message_body(sid, text, ac(sid.user_id, ["mcp_server:pics"]))
        body["attachments"] = [
            {"name": name, "data": base64.b64encode(data).decode(), "declared_type": "application/pdf"}
            for name, data in files
        ]
        return {**body, **extra}


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, _llm_session: ScriptedLLMServer
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("attachments")
    tools = [
        tool("chart", "image", params={"text": "string"}, data=base64.b64encode(PICTURE).decode()),
        tool(
            "fake_chart",
            "image",
            params={"text": "string"},
            data=base64.b64encode(b"MZ\x90 no image").decode(),
        ),
    ]
    with McpTestServer({"name": "pics", "tools": tools}, tmp) as mcp:
        agent = tmp / "agent.yaml"
        agent.write_text(
            yaml.safe_dump(
                {
                    "id": "vagent",
                    "name": "vagent",
                    "system_prompt": "You help.",
                    "tools": [],
                    "mcp_servers": [{"name": "pics", "url": mcp.url, "confirm": "never"}],
                }
            )
        )
        graph = GraphProcess(
            redis_url,
            tmp,
            _llm_session.base_url,
            AGENT_DESCRIPTOR=str(agent),
            LLM_VISION="true",
            ATTACHMENT_MAX_BYTES=str(MAX_BYTES),
            ATTACHMENT_MAX_PER_TURN="2",
            ATTACHMENT_MAX_TOKENS="2000",
        ).start()
        try:
            yield Stack(graph)
        finally:
            graph.stop()


def user_texts(request: dict[str, Any]) -> list[str]:
    """The text of every user message the model was sent (content parts joined)."""
    out = []
    for m in request["messages"]:
        if m["role"] != "user":
            continue
        content = m["content"]
        out.append(content if isinstance(content, str) else " ".join(p.get("text", "") for p in content))
    return out


def final(events: list[SSEEvent]) -> str:
    texts = [e.content for e in events if isinstance(e, TextFinal)]
    assert len(texts) == 1, events
    return texts[0]


async def test_a_pdf_with_a_question_reaches_the_model_as_the_users_file_and_stays_for_the_next_turn(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_text("Revenue grew 12%.")
    events = await stack.send(sid, "summarise this", [("report.pdf", pdf_with_text(REPORT))])
    assert Progress(content="Reading report.pdf…") in events
    assert final(events) == "Revenue grew 12%.\n\n📎 From your attachment: `report.pdf`"
    last = user_texts(llm_server.requests[-1])[-1]
    assert "report.pdf" in last and "Revenue grew 12% to 4.2 million." in last and "summarise this" in last
    llm_server.push_text("Churn fell.")
    await stack.send(sid, "and churn?")
    assert any("Churn fell to 3%." in t for t in user_texts(llm_server.requests[-1]))  # history keeps it


async def test_a_file_alone_is_kept_for_the_next_question_without_the_model(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session(f"@forgetful-{uuid.uuid4().hex[:6]}:localhost")
    events = await stack.send(sid, "", [("notes.docx", docx_with_text(["Meeting notes", "Ship on Friday."]))])
    assert final(events) == "Got notes.docx — what should I do with it?"
    assert llm_server.requests == []
    llm_server.push_text("Ship on Friday.")
    await stack.send(sid, "when do we ship?")
    texts = user_texts(llm_server.requests[-1])
    assert any("Ship on Friday." in t for t in texts) and texts[-1] == "when do we ship?"
    elsewhere = SessionId(room_id=new_session().room_id, user_id=sid.user_id)
    llm_server.push_text("Which file?")
    await stack.send(elsewhere, "when do we ship?")  # another room never sees it
    assert not any("Ship on Friday." in t for t in user_texts(llm_server.requests[-1]))
    forget = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "vagent"), "admin", "forget", sid.user_id],
        env={**os.environ, "REDIS_URL": stack.graph.env["REDIS_URL"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert forget.returncode == 0, forget.stderr
    llm_server.push_text("Which file?")
    await stack.send(sid, "when do we ship?")  # gone with the user's sessions
    assert not any("Ship on Friday." in t for t in user_texts(llm_server.requests[-1]))


async def test_an_image_reaches_a_vision_model_as_an_image_part(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("A chart.")
    await stack.send(new_session(), "what is this?", [("screenshot.png", png(3000, 1000))])
    parts = llm_server.image_parts()
    assert len(parts) == 1 and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    sent = base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])
    assert sent.startswith(b"\x89PNG") and len(sent) < 3000 * 1000  # scaled down first
    assert "screenshot.png" in user_texts(llm_server.requests[-1])[-1]


async def test_each_bad_file_gets_one_clear_reply_and_nothing_else_is_affected(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    cases = {
        "broken.pdf": (corrupt_pdf(), "broken.pdf"),
        "bomb.docx": (zip_bomb_docx(), "zip bomb"),
        "tool.pdf": (b"\x7fELF\x02\x01\x01" + bytes(200), "tool.pdf"),
        "big.pdf": (b"%PDF-1.4\n" + bytes(MAX_BYTES), "limit"),
    }
    for name, (data, said) in cases.items():
        reply = final(await stack.send(sid, "read this", [(name, data)]))
        assert reply.startswith(f"⚠️ I could not use {name}: ") and said in reply, reply
    assert llm_server.requests == []  # none of it reached the model
    too_many = stack.body(sid, "x", [("a.txt", b"a"), ("b.txt", b"b"), ("c.txt", b"c")])
    r = await stack.raw(too_many)
    assert r.status_code == 422 and r.json()["error_code"] == "too_many_attachments"
    r = await stack.raw(
        stack.body(sid, "x", [("a.txt", b"a")]) | {"attachments": [{"name": "a", "data": "%%%"}]}
    )
    assert r.status_code == 422
    huge = stack.body(sid, "x", [("a.txt", b"a" * (MAX_BYTES * 4))])
    r = await stack.raw(httpx_json(huge))
    assert r.status_code == 413 and r.json()["error_code"] == "request_too_large"
    llm_server.push_text("Still here.")
    assert final(await stack.send(sid, "hello")) == "Still here."  # the session goes on


def httpx_json(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body).encode()


async def test_reasoning_never_reaches_the_stream_nor_the_history(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    thought = "<think>The user is alice; her password is hunter2.</think>\n\nHello Alice."
    llm_server.push_text(thought, split_at=[3, 9, 20, 48, 55, 57])
    events = await stack.send(sid, "hi")
    streamed = "".join(e.content for e in events if isinstance(e, TextChunk))
    assert Progress(content="thinking…") in events
    assert streamed == "Hello Alice." and final(events) == "Hello Alice."
    llm_server.push_reasoning("Let me think about hunter2 first.", "Second answer.")
    events = await stack.send(sid, "again")
    assert "hunter2" not in str([e.model_dump() for e in events]) and final(events) == "Second answer."
    llm_server.push_text("Third.")
    await stack.send(sid, "once more")
    assert "hunter2" not in str(llm_server.requests[-1]["messages"])  # the history has none of it


async def test_a_tool_image_follows_the_answer_and_a_fake_one_is_not_shown(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_tool_calls([("pics__chart", {"text": "sales"})])
    llm_server.push_text("Here is the chart.")
    events = await stack.send(sid, "draw the sales chart")
    assert kinds(events)[-3:] == ["text_final", "image", "done"]
    image = next(e for e in events if isinstance(e, ImageOut))
    assert base64.b64decode(image.data) == PICTURE and (image.width, image.height) == (640, 480)
    told = [m["content"] for m in llm_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert "shown to the user in the room" in told[-1]
    llm_server.push_tool_calls([("pics__fake_chart", {"text": "sales"})])
    llm_server.push_text("No chart.")
    events = await stack.send(sid, "draw it again")
    assert "image" not in kinds(events)
    told = [m["content"] for m in llm_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert "not shown" in told[-1]
