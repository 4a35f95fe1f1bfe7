"""The shared graph client (`vagent_shared.graph_client`) and the two services' wiring of it.

What a user notices: the answer arrives whole however TCP cuts the stream, a stream that stops
before `done` becomes one short "interrupted" message (never a silent half answer), a busy
session is told apart from an expired question, and a refusal is one short message. What an
operator notices: the bot's `vagent_bot_graph_requests_total{endpoint,outcome}` and the
gateway's HTTP replies stay what they were. Against a real loopback HTTP server, since chunk
boundaries, dropped connections and read timeouts only come from real sockets.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs
from vagent_gateway.graph_client import GraphClient as GatewayGraphClient
from vagent_gateway.graph_client import GraphError as GatewayGraphError

from vagent_bot.clients.graph_client import GraphClient as BotGraphClient
from vagent_shared.access import AcContext
from vagent_shared.events import Done, ErrorEvent, Progress, SSEEvent, TextChunk, TextFinal
from vagent_shared.graph_client import (
    GraphBusy,
    GraphClient,
    GraphError,
    GraphNoPending,
    GraphRejected,
    GraphStreamBroken,
    GraphUnavailable,
)
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest

pytestmark = pytest.mark.timeout(30)

ALICE, ROOM = "@alice:example.org", "!room:example.org"
SID = f"{ROOM}:main:{ALICE}"
TOKEN = "graph-service-token-Zq81"


@dataclass
class Reply:
    """One scripted answer: the status, the body in the pieces it is written in (each flushed
    on its own, with a pause, so the client reads them apart), then maybe a hang."""

    status: int = 200
    pieces: list[bytes] = field(default_factory=list)
    hang: bool = False


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class GraphStandIn:
    """A raw HTTP/1.1 server on a free loopback port answering each request with the next
    scripted Reply; an SSE body has no length and ends when the connection closes."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.requests: list[Request] = []
        self.client_gone = asyncio.Event()  # a hanging reply's client closed its end
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(Request(method, path, headers, json.loads(raw) if raw else None))
            reply = self.replies.pop(0)
            sse = reply.status == 200 and path.startswith("/api/v1/") and "reset" not in path
            kind = "text/event-stream" if sse else "application/json"
            length = "" if sse else f"Content-Length: {sum(map(len, reply.pieces))}\r\n"
            writer.write(
                f"HTTP/1.1 {reply.status} Status\r\nContent-Type: {kind}\r\n{length}"
                "Connection: close\r\n\r\n".encode()
            )
            await writer.drain()
            for piece in reply.pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.002)
            if reply.hang:
                await reader.read()  # until the client closes its end
                self.client_gone.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.client_gone.set()
        finally:
            writer.close()
            self._tasks.discard(task)

    async def __aenter__(self) -> GraphStandIn:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


def sse(*events: SSEEvent, eol: str = "\n") -> bytes:
    """The events as the graph writes them, with a keep-alive comment in between."""
    out = [f": ping{eol}{eol}"]
    out += [f"event: {e.EVENT}{eol}data: {e.model_dump_json()}{eol}{eol}" for e in events]
    return "".join(out).encode()


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def refused(status: int, code: str = "", message: str = "", *, raw: bytes | None = None) -> Reply:
    body = json.dumps({"error_code": code, "message": message}).encode() if raw is None else raw
    return Reply(status, [body])


def message() -> ProcessMessageRequest:
    ac = AcContext.model_validate(
        {"userId": ALICE, "activeAclDomain": "example.org", "activeRoles": [], "roles": {}}
    )
    return ProcessMessageRequest(
        session_id=SID, room_id=ROOM, user_id=ALICE, message="héllo ✓", ac_context=ac
    )


ANSWER: list[SSEEvent] = [
    Progress(content="Thinking…"),
    TextChunk(content="Grüße ✓ ", chunk_index=0),
    TextChunk(content="multi\nline", chunk_index=1),
    TextFinal(content="Grüße ✓ multi\nline"),
    Done(),
]


@dataclass
class Counted:
    """The outcome hook's calls, in order."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, endpoint: str, outcome: str) -> None:
        self.calls.append((endpoint, outcome))


async def collect(stream: AsyncIterator[SSEEvent]) -> list[SSEEvent]:
    return [ev async for ev in stream]


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# ---- the shared client ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 100_000])
@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
async def test_events_arrive_whole_however_the_stream_is_cut(size: int, eol: str) -> None:
    body = sse(*ANSWER, eol=eol)
    counted = Counted()
    async with GraphStandIn(Reply(200, cut(body, size))) as graph:
        client = GraphClient(graph.url, TOKEN, on_outcome=counted)
        try:
            events = await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert events == ANSWER
    assert counted.calls == [("process_message", "ok")]


async def test_the_request_carries_the_service_token_and_the_message() -> None:
    async with GraphStandIn(Reply(200, [sse(Done())]), Reply(200, [sse(Done())])) as graph:
        client = GraphClient(graph.url + "/", TOKEN)
        try:
            await collect(client.process_message(message()))
            await collect(client.submit_feedback(FeedbackRequest(session_id=SID, response="yes")))
        finally:
            await client.aclose()
    first, second = graph.requests
    assert (first.method, first.path, second.path) == (
        "POST",
        "/api/v1/process_message",
        "/api/v1/submit_feedback",
    )
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in graph.requests)
    assert first.headers["accept"] == "text/event-stream"
    assert first.body["message"] == "héllo ✓" and second.body["response"] == "yes"


async def test_without_a_token_no_authorization_header_is_sent() -> None:
    async with GraphStandIn(Reply(200, [sse(Done())])) as graph:
        client = GraphClient(graph.url, None)
        try:
            await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert "authorization" not in graph.requests[0].headers


async def test_an_unknown_event_is_skipped_not_fatal() -> None:
    body = b"event: from_the_future\ndata: {}\n\n" + sse(TextFinal(content="hi"), Done())
    async with GraphStandIn(Reply(200, [body])) as graph:
        client = GraphClient(graph.url, TOKEN)
        try:
            with capture_logs() as logs:
                events = await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert [e.EVENT for e in events] == ["text_final", "done"]
    assert [entry["event"] for entry in logs] == ["graph_unknown_event"]


async def test_a_stream_ending_without_done_is_broken_after_the_events_it_gave() -> None:
    counted = Counted()
    async with GraphStandIn(Reply(200, [sse(TextChunk(content="half an ans", chunk_index=0))])) as graph:
        client = GraphClient(graph.url, TOKEN, on_outcome=counted)
        got: list[SSEEvent] = []
        try:
            with pytest.raises(GraphStreamBroken) as info:
                async for ev in client.process_message(message()):
                    got.append(ev)
        finally:
            await client.aclose()
    assert got == [TextChunk(content="half an ans", chunk_index=0)]
    assert info.value.user_message == "My answer was interrupted. Please try again."
    assert counted.calls == [("process_message", "broken")]


async def test_a_silent_graph_breaks_the_stream_after_the_read_timeout() -> None:
    counted = Counted()
    async with GraphStandIn(Reply(200, [sse(Progress(content="working"))], hang=True)) as graph:
        client = GraphClient(graph.url, TOKEN, read_timeout=0.3, on_outcome=counted)
        try:
            with capture_logs() as logs, pytest.raises(GraphStreamBroken):
                await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert counted.calls == [("process_message", "unreachable")]  # the bot's label, as before
    [failed] = [entry for entry in logs if entry["event"] == "graph_stream_failed"]
    assert failed["endpoint"] == "process_message" and TOKEN not in repr(logs)


async def test_a_transport_error_after_done_is_no_failure() -> None:
    counted = Counted()
    async with GraphStandIn(Reply(200, [sse(TextFinal(content="ok"), Done())], hang=True)) as graph:
        client = GraphClient(graph.url, TOKEN, read_timeout=0.3, on_outcome=counted)
        try:
            events = await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert [e.EVENT for e in events] == ["text_final", "done"]
    assert counted.calls == [("process_message", "ok")]


async def test_an_unreachable_graph_is_unavailable() -> None:
    counted = Counted()
    client = GraphClient(closed_port(), TOKEN, on_outcome=counted)
    try:
        with pytest.raises(GraphUnavailable) as info:
            await collect(client.process_message(message()))
        with pytest.raises(GraphUnavailable) as on_reset:
            await client.reset(SID)
        assert not await client.healthy()
    finally:
        await client.aclose()
    assert info.value.status is None and on_reset.value.status is None
    assert counted.calls == [("process_message", "unreachable")]  # a failed reset is not counted


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (409, "session_busy", GraphBusy),
        (409, "no_pending_question", GraphNoPending),
        (409, "stale_question", GraphNoPending),
        (409, "", GraphNoPending),
        (500, "internal_error", GraphUnavailable),
        (503, "", GraphUnavailable),
        (401, "unauthorized", GraphUnavailable),
        (403, "forbidden", GraphUnavailable),
        (400, "bad_request", GraphRejected),
        (404, "", GraphRejected),
        (413, "too_large", GraphRejected),
        (422, "invalid_request", GraphRejected),
    ],
)
async def test_each_refusal_is_its_typed_error(status: int, code: str, kind: type[GraphError]) -> None:
    counted = Counted()
    async with GraphStandIn(refused(status, code, "graph says no"), refused(status, code)) as graph:
        client = GraphClient(graph.url, TOKEN, on_outcome=counted)
        try:
            with capture_logs() as logs, pytest.raises(GraphError) as info:
                await collect(client.process_message(message()))
            with pytest.raises(GraphError) as on_reset:
                await client.reset(SID)
        finally:
            await client.aclose()
    assert type(info.value) is kind and type(on_reset.value) is kind
    assert (info.value.status, info.value.code, info.value.message) == (status, code, "graph says no")
    assert counted.calls == [("process_message", f"http_{status}"), ("reset_session", f"http_{status}")]
    refusals = [entry for entry in logs if entry["event"] == "graph_refused"]
    assert [(r["endpoint"], r["status"], r["error_code"]) for r in refusals] == [
        ("process_message", status, code)
    ]


async def test_the_user_messages_are_short_and_tell_the_cases_apart() -> None:
    shown = {
        cls: cls("x").user_message for cls in (GraphBusy, GraphNoPending, GraphUnavailable, GraphRejected)
    }
    assert shown[GraphNoPending] == "That question has expired. Please ask again."
    assert shown[GraphRejected] == "I couldn't process that message."
    assert shown[GraphUnavailable] == shown[GraphBusy] == GraphError.user_message
    assert all(len(text) < 100 for text in shown.values())


async def test_a_refusal_with_a_body_that_is_not_json_is_still_typed() -> None:
    async with GraphStandIn(refused(502, raw=b"<html>bad gateway</html>")) as graph:
        client = GraphClient(graph.url, TOKEN)
        try:
            with pytest.raises(GraphUnavailable) as info:
                await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert (info.value.status, info.value.code) == (502, "")


async def test_reset_and_health() -> None:
    async with GraphStandIn(Reply(200, [b"{}"]), Reply(200, [b"{}"]), Reply(503, [b"{}"])) as graph:
        client = GraphClient(graph.url, TOKEN)
        try:
            await client.reset(SID)
            assert await client.healthy()
            assert not await client.healthy()
        finally:
            await client.aclose()
    reset = graph.requests[0]
    assert (reset.path, reset.body) == ("/api/v1/reset_session", {"session_id": SID})
    assert reset.headers["authorization"] == f"Bearer {TOKEN}"


# ---- the bot's wiring --------------------------------------------------------------------


def bot_count(endpoint: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "vagent_bot_graph_requests_total", {"endpoint": endpoint, "outcome": outcome}
    )
    return value or 0.0


async def test_the_bot_counts_each_outcome_in_its_metric() -> None:
    before = {o: bot_count("process_message", o) for o in ("ok", "http_409", "broken")}
    replies = (Reply(200, [sse(Done())]), refused(409, "session_busy"), Reply(200, [sse()]))
    async with GraphStandIn(*replies) as graph:
        client = BotGraphClient(graph.url, TOKEN)
        try:
            await collect(client.process_message(message()))
            with pytest.raises(GraphBusy):
                await collect(client.process_message(message()))
            with pytest.raises(GraphStreamBroken):
                await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert {o: bot_count("process_message", o) - n for o, n in before.items()} == {
        "ok": 1.0,
        "http_409": 1.0,
        "broken": 1.0,
    }


# ---- the gateway's wiring ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (refused(409, "session_busy", "Busy."), (409, "session_busy", "Busy.")),
        (refused(409), (409, "conflict", "The thread is busy.")),
        (refused(422), (422, "invalid_request", "The graph refused the message.")),
        (refused(422, "message_too_long", "Too long."), (422, "message_too_long", "Too long.")),
        (refused(413, "too_large", "Too big."), (413, "too_large", "Too big.")),
        (
            refused(400, "bad_request", "No."),
            (503, "graph_unavailable", "The agent service cannot answer right now."),
        ),
        (refused(401), (503, "graph_unavailable", "The agent service cannot answer right now.")),
        (refused(500), (503, "graph_unavailable", "The agent service cannot answer right now.")),
        (
            Reply(200, [sse(TextChunk(content="x", chunk_index=0))]),
            (502, "stream_broken", "The answer was interrupted."),
        ),
    ],
)
async def test_the_gateway_replies_as_before(reply: Reply, expected: tuple[int, str, str]) -> None:
    async with GraphStandIn(reply) as graph:
        client = GatewayGraphClient(graph.url, TOKEN)
        try:
            with pytest.raises(GatewayGraphError) as info:
                await collect(client.process_message(message()))
        finally:
            await client.aclose()
    assert (info.value.status, info.value.code, info.value.message) == expected
    assert TOKEN not in str(info.value)


async def test_the_gateway_reset_replies_as_before() -> None:
    async with GraphStandIn(refused(409, "session_busy", "Busy.")) as graph:
        client = GatewayGraphClient(graph.url, TOKEN)
        try:
            with pytest.raises(GatewayGraphError) as info:
                await client.reset(SID)
        finally:
            await client.aclose()
    assert (info.value.status, info.value.code) == (409, "session_busy")
    client = GatewayGraphClient(closed_port(), TOKEN)
    try:
        with pytest.raises(GatewayGraphError) as down:
            await client.reset(SID)
        with pytest.raises(GatewayGraphError) as down_stream:
            await collect(client.process_message(message()))
    finally:
        await client.aclose()
    unreachable = (503, "graph_unavailable", "The agent service cannot be reached.")
    assert (down.value.status, down.value.code, down.value.message) == unreachable
    assert (down_stream.value.status, down_stream.value.code, down_stream.value.message) == unreachable


async def test_the_gateway_passes_events_and_closing_early_frees_the_connection() -> None:
    """A cancelled run closes its stream: the graph must see the connection go at once, or its
    run would go on for nobody."""
    async with GraphStandIn(Reply(200, [sse(ErrorEvent(error_code="e", message="m"))], hang=True)) as graph:
        client = GatewayGraphClient(graph.url, TOKEN)
        try:
            stream = client.process_message(message())
            assert await anext(stream) == ErrorEvent(error_code="e", message="m")
            await stream.aclose()
            await asyncio.wait_for(graph.client_gone.wait(), 5)
        finally:
            await client.aclose()
