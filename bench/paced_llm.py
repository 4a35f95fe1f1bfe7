#!/usr/bin/env python3
"""A lean OpenAI-compatible streaming stand-in paced like a hosted model, for bench_capacity.

Why not tests/support/llm_server.py: that one records every request, runs a watcher task
and an ``asyncio.wait_for`` per chunk inside uvicorn; at 1000 concurrent paced streams
(40 000 chunks/s) it would spend more CPU than the service it stands in front of. This
one is a raw asyncio protocol (uvloop when installed) with one timer callback per chunk and
pre-encoded chunk bodies, so the bench measures the graph, not the stand-in.

Wire format as OpenAI streams it: HTTP/1.1 keep-alive, ``Transfer-Encoding: chunked``,
``data: {json}\\n\\n`` events of ``chat.completion.chunk`` objects (id/object/created/model/
choices), tool-call deltas with ``index`` and id/type/function.name only on the first,
arguments as JSON string pieces, ``finish_reason`` "stop"/"tool_calls", a usage chunk with
``choices: []`` when ``stream_options.include_usage``, then ``data: [DONE]``.

What it answers (decided from the request, so one server serves every kind of turn):

* the last user message contains ``[quick]``: the full text answer in one write, no delay
  (history turns: realistic size, no time);
* contains ``[tool]`` and the last message is not a tool result: a ``database_query`` tool
  call, paced (first delta after TTFT, then 2 argument pieces ``chunk`` apart);
* contains ``[mcp]`` and the last message is not a tool result: a call of the MCP tool
  ``--mcp-tool`` (default ``bench__echo``) with ``{"text": <the user message>}``, paced like
  ``[tool]`` (``bench_capacity.py --mcp``; the message names its user, so the MCP server's
  record shows whose call it was);
* ``[tool]`` or ``[mcp]`` together with ``[quick]``: the same tool call at once, then the
  text at once (a history turn that ran a tool);
* contains ``[park]`` and the last message is not a tool result: a ``delete_records`` call
  (confirmation required) at once; after the tool result, a quick text;
* anything else (also after a ``[tool]`` result): the text answer, first chunk after TTFT,
  then one chunk every ``chunk`` ms, ``chunks`` chunks.

``GET /stats`` answers counters and how late the timers fired (the stand-in's own lag,
so a report can tell it apart from the service's); ``GET /stats?reset=1`` also resets them.

    python bench/paced_llm.py --ttft-ms 300 --chunk-ms 25 --chunks 120   # prints "PORT <n>"
        [--mcp-tool bench__echo]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import time
import uuid
from typing import Any

#: Argument pieces of a paced tool call after its first delta (the first delta carries the
#: name): the tool call takes TTFT + TOOL_ARG_PIECES * chunk of the model's own time.
TOOL_ARG_PIECES = 2
TOOL_SQL = "SELECT COUNT(*) AS n, SUM(amount) AS total FROM records"
PARK_DATE = "2100-01-01"
#: The tool a ``[mcp]`` turn calls: the echo tool of the MCP server named ``bench``.
MCP_TOOL = "bench__echo"
WORDS = (
    "The records database holds customers orders and amounts and this answer streams one "
    "word per chunk so that the pacing of a hosted model is reproduced closely enough for a "
    "capacity measurement of the service in front of it"
).split()


def answer_pieces(chunks: int) -> list[str]:
    """`chunks` word pieces (each with its trailing space; the last without)."""
    words = [WORDS[i % len(WORDS)] for i in range(chunks)]
    return [w + " " for w in words[:-1]] + [words[-1]]


def _enc(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _chunked(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Stats:
    """Counters and lateness of the timers (ms), reset per step by the bench."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.streams = 0
        self.completed = 0
        self.disconnected = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.first_late: list[float] = []
        self.late_sum = 0.0
        self.late_max = 0.0
        self.late_n = 0

    def late(self, ms: float, first: bool) -> None:
        self.late_sum += ms
        self.late_n += 1
        self.late_max = max(self.late_max, ms)
        if first:
            self.first_late.append(ms)

    def to_json(self) -> dict[str, Any]:
        fl = sorted(self.first_late)

        def q(p: float) -> float:
            return fl[min(len(fl) - 1, int(p * len(fl)))] if fl else 0.0

        return {
            "streams": self.streams,
            "completed": self.completed,
            "disconnected": self.disconnected,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "first_chunk_late_ms": {"p50": q(0.5), "p99": q(0.99), "max": fl[-1] if fl else 0.0},
            "chunk_late_ms": {
                "mean": self.late_sum / self.late_n if self.late_n else 0.0,
                "max": self.late_max,
            },
            "cpu_s": sum(os.times()[:2]),
        }


class Pacer:
    """Configuration and pre-encoded pieces shared by every connection."""

    def __init__(self, ttft: float, chunk: float, chunks: int, mcp_tool: str = MCP_TOOL) -> None:
        self.ttft, self.chunk, self.chunks = ttft, chunk, chunks
        self.mcp_tool = mcp_tool
        self.stats = Stats()
        self.text_parts = [_enc({"content": p}) for p in answer_pieces(chunks)]
        self.text = "".join(answer_pieces(chunks))

    def events(self, request: dict[str, Any]) -> tuple[list[bytes], bool, str]:
        """The SSE events (pre-chunked) and whether to pace them; the finish reason."""
        messages: list[dict[str, Any]] = request.get("messages") or []
        last = messages[-1] if messages else {}
        user: dict[str, Any] = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        content = user.get("content")
        text: str = content if isinstance(content, str) else json.dumps(content)
        after_tool = last.get("role") == "tool"
        head = (
            b'data: {"id":"chatcmpl-' + uuid.uuid4().hex.encode() + b'","object":"chat.completion.chunk",'
            b'"created":' + str(int(time.time())).encode() + b',"model":' + _enc(str(request.get("model")))
        )

        def chunk(delta: bytes, finish: str | None = None) -> bytes:
            fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
            return _chunked(
                head + b',"choices":[{"index":0,"delta":' + delta + b',"finish_reason":' + fin + b"}]}\n\n"
            )

        paced = True
        if not after_tool and ("[tool]" in text or "[mcp]" in text or "[park]" in text):
            name, args = ("delete_records", {"older_than": PARK_DATE})
            if "[tool]" in text:
                name, args = "database_query", {"sql": TOOL_SQL}
            elif "[mcp]" in text:
                name, args = self.mcp_tool, {"text": text}
            paced = ("[tool]" in text or "[mcp]" in text) and "[quick]" not in text
            arg = json.dumps(args)
            step = -(-len(arg) // TOOL_ARG_PIECES)
            first = {
                "index": 0,
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            body = [chunk(b'{"role":"assistant","content":null,"tool_calls":[' + _enc(first) + b"]}")]
            body += [
                chunk(
                    b'{"tool_calls":[{"index":0,"function":{"arguments":' + _enc(arg[i : i + step]) + b"}}]}"
                )
                for i in range(0, len(arg), step)
            ]
            finish, usage = "tool_calls", 12
        else:
            if "[quick]" in text or ("[park]" in text and after_tool):
                paced = False
            body = [
                chunk(b'{"role":"assistant","content":' + part[len(b'{"content":') :])
                for part in self.text_parts[:1]
            ]
            body += [chunk(part) for part in self.text_parts[1:]]
            finish, usage = "stop", self.chunks
        tail = [chunk(b"{}", finish)]
        if (request.get("stream_options") or {}).get("include_usage"):
            prompt = sum(len(str(m.get("content") or "").split()) + 1 for m in messages)
            u = {"prompt_tokens": prompt, "completion_tokens": usage, "total_tokens": prompt + usage}
            tail.append(_chunked(head + b',"choices":[],"usage":' + _enc(u) + b"}\n\n"))
        tail.append(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        body[-1] += b"".join(tail)  # the end goes with the last piece, as a real API sends it
        return body, paced, finish


RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests are answered one at a time."""

    def __init__(self, pacer: Pacer) -> None:
        self.pacer = pacer
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.busy:
            self.busy = False
            self.pacer.stats.disconnected += 1
            self.pacer.stats.in_flight -= 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._maybe_request()

    def _maybe_request(self) -> None:
        if self.busy or self.transport is None:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1")
        lines = head.split("\r\n")
        method, path = lines[0].split(" ")[:2]
        length = 0
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        self._handle(method, path, body)

    def _plain(self, status: str, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        self._maybe_request()

    def _handle(self, method: str, path: str, body: bytes) -> None:
        stats = self.pacer.stats
        if method == "GET" and path.startswith("/stats"):
            out = _enc(stats.to_json())
            if "reset=1" in path:
                stats.reset()
            self._plain("200 OK", out)
            return
        if method == "GET" and path.rstrip("/").endswith("/models"):
            self._plain("200 OK", _enc({"object": "list", "data": [{"id": "test-model", "object": "model"}]}))
            return
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            self._plain(
                "404 Not Found",
                _enc({"error": {"message": f"no route {method} {path}", "type": "not_found"}}),
            )
            return
        request = json.loads(body)
        events, paced, _ = self.pacer.events(request)
        assert self.transport is not None
        stats.streams += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        self.busy = True
        self.transport.write(RESPONSE_HEAD)
        if not paced:
            self.transport.write(b"".join(events))
            self._finish()
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        ttft, step = self.pacer.ttft, self.pacer.chunk

        def send(i: int) -> None:
            self.timer = None
            if self.transport is None:
                return
            due = start + ttft + i * step
            stats.late((loop.time() - due) * 1000, i == 0)
            self.transport.write(events[i])
            if i + 1 < len(events):
                self.timer = loop.call_at(start + ttft + (i + 1) * step, send, i + 1)
            else:
                self._finish()

        self.timer = loop.call_at(start + ttft, send, 0)

    def _finish(self) -> None:
        self.busy = False
        self.pacer.stats.completed += 1
        self.pacer.stats.in_flight -= 1
        self._maybe_request()


async def serve(host: str, port: int, pacer: Pacer) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(pacer), host, port, backlog=4096)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=300)
    p.add_argument("--chunk-ms", type=float, default=25)
    p.add_argument("--chunks", type=int, default=120)
    p.add_argument("--mcp-tool", default=MCP_TOOL, help="the tool a [mcp] turn calls")
    a = p.parse_args()
    pacer = Pacer(a.ttft_ms / 1000, a.chunk_ms / 1000, a.chunks, a.mcp_tool)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is in the dev requirements
        runner = asyncio.run
    runner(serve(a.host, a.port, pacer))


if __name__ == "__main__":
    main()
