"""A scripted, OpenAI-compatible chat-completions server for tests and benchmarks.

Why: the bot and graph services talk to an LLM through ``langchain_openai`` / the
``openai`` SDK. Faking the SDK in-process would not exercise the real wire format, SSE
parsing, tool-call assembly, retries or client disconnects, and it cannot serve a
subprocess. This module runs a real HTTP server on ``127.0.0.1`` (random free port) in a
background thread with its own event loop, so synchronous fixtures, async tests,
benchmark scripts and child processes (via ``OPENAI_BASE_URL=server.base_url``) can all
use it.

Answers come from a FIFO script (``push_text`` / ``push_reasoning`` / ``push_tool_calls`` /
``push_error``); when the script is empty a default responder answers. The initial default
answers the plain text ``"OK"`` for every request, so un-scripted calls are deterministic and
cheap. ``image_parts`` shows what a vision model was sent.

Usage::

    with ScriptedLLMServer() as server:
        server.push_text("Hello there, world")
        llm = ChatOpenAI(model="test-model", base_url=server.base_url, api_key="test")
        ...
        assert server.requests[-1]["messages"][-1]["content"] == "hi"
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self, TypeAlias, cast

import uvicorn

__all__ = [
    "BrokenStream",
    "DefaultResponder",
    "ErrorResponse",
    "PlannedResponse",
    "ReasoningResponse",
    "ScriptedLLMServer",
    "StalledStream",
    "TextResponse",
    "ToolCallResponse",
    "ok_responder",
    "split_at",
    "split_text",
]

JSON: TypeAlias = dict[str, Any]
Message: TypeAlias = dict[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]

_WORDS = re.compile(r"\S+\s*|\s+")
_SSE_DONE = b"data: [DONE]\n\n"
#: An SSE comment: bytes on the wire, no event (the SDK's parser drops it).
_SSE_KEEPALIVE = b": keep-alive\n\n"
_STARTUP_TIMEOUT = 10.0


def split_text(content: str, chunks: int | None = None) -> list[str]:
    """Split ``content`` into stream pieces whose concatenation is exactly ``content``.

    Why: tests assert that what the client reassembles equals what was scripted, so no
    whitespace may be lost. ``chunks=None`` splits per word (each word keeps its trailing
    whitespace); an int splits into that many roughly equal character runs (fewer if the
    text is shorter than ``chunks``).
    """
    if not content:
        return []
    if chunks is None:
        return _WORDS.findall(content)
    if chunks < 1:
        raise ValueError("chunks must be >= 1")
    size = math.ceil(len(content) / chunks)
    return [content[i : i + size] for i in range(0, len(content), size)]


def split_at(content: str, offsets: Sequence[int]) -> list[str]:
    """Split ``content`` at the given character offsets (each 0 < offset < len, ascending).

    Why: a test can cut a stream exactly where a client must cope with it, e.g. inside
    ``<think>`` (``split_at("<think>x</think>y", [3, 10])`` -> ``["<th", "ink>x</", "think>y"]``).
    """
    cuts = list(offsets)
    if any(not 0 < c < len(content) for c in cuts) or cuts != sorted(set(cuts)):
        raise ValueError(f"split offsets must ascend strictly inside 1..{len(content) - 1}: {cuts}")
    bounds = [0, *cuts, len(content)]
    return [content[a:b] for a, b in itertools.pairwise(bounds)]


def _pieces(content: str, chunks: int | None, offsets: Sequence[int] | None) -> list[str]:
    return split_at(content, offsets) if offsets is not None else split_text(content, chunks)


@dataclass(frozen=True)
class TextResponse:
    """A plain assistant text answer, streamed in ``chunks`` pieces ``delay`` s apart, or cut
    at the character offsets ``split_at`` (which wins over ``chunks``)."""

    content: str
    chunks: int | None = None
    delay: float = 0.0
    split_at: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        """Reject bad values at push time rather than inside the server thread."""
        if self.chunks is not None and self.chunks < 1:
            raise ValueError("chunks must be >= 1")
        if self.delay < 0:
            raise ValueError("delay must be >= 0")
        if self.split_at is not None:
            split_at(self.content, self.split_at)  # raises on bad offsets


@dataclass(frozen=True)
class ReasoningResponse:
    """A reasoning model's answer, as vLLM and DeepSeek stream it: ``reasoning`` first, as
    ``delta.reasoning_content`` pieces, then ``content`` as ``delta.content`` pieces (each
    split like ``TextResponse``: per word, or in ``chunks`` pieces). Not streamed, the message
    carries both fields."""

    reasoning: str
    content: str
    chunks: int | None = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        """Reject bad values at push time rather than inside the server thread."""
        if not self.reasoning:
            raise ValueError("reasoning must not be empty (use TextResponse)")
        if self.chunks is not None and self.chunks < 1:
            raise ValueError("chunks must be >= 1")
        if self.delay < 0:
            raise ValueError("delay must be >= 0")


@dataclass(frozen=True)
class ToolCallResponse:
    """One assistant turn with one or more tool calls (``(name, arguments)`` pairs).

    ``content`` is optional text streamed before the calls; ``delay`` (seconds) is
    applied before each streamed content/argument piece, like ``TextResponse.delay``.
    """

    calls: list[tuple[str, dict[str, Any]]]
    content: str = ""
    delay: float = 0.0

    def __post_init__(self) -> None:
        """Reject an empty call list, which real APIs never return as a tool turn."""
        if not self.calls:
            raise ValueError("ToolCallResponse needs at least one call")
        if self.delay < 0:
            raise ValueError("delay must be >= 0")


@dataclass(frozen=True)
class ErrorResponse:
    """An HTTP error in OpenAI's error shape, to test client error handling.

    Note that the openai SDK retries 408/409/429/5xx (``max_retries``, default 2), and
    each retry consumes the next planned response.
    """

    status: int = 500
    message: str = "scripted error"
    type: str = "server_error"
    #: Sent as the ``Retry-After`` header (seconds) when set; the SDK waits that long to retry.
    retry_after: float | None = None


@dataclass(frozen=True)
class BrokenStream:
    """A streamed text answer that fails after ``chunks_before`` of its word pieces: with a
    ``data:`` line that is not JSON (``how="garbage"``), or by dropping the connection in the
    middle of the response (``how="drop"``). Either way no ``[DONE]`` is sent."""

    content: str
    chunks_before: int = 2
    how: Literal["garbage", "drop"] = "garbage"


@dataclass(frozen=True)
class StalledStream:
    """A streamed text answer that stalls after ``chunks_before`` of its word pieces: the
    connection stays open and only SSE keep-alive comments (``: keep-alive``) follow, every
    ``keepalive`` seconds, until the client goes away or the server stops (at most
    ``for_seconds``). A client's read timeout never fires (bytes keep coming); only a
    timeout on the silence of *chunks* ends it."""

    content: str
    chunks_before: int = 1
    keepalive: float = 0.2
    for_seconds: float = 120.0

    def __post_init__(self) -> None:
        """Reject bad values at push time rather than inside the server thread."""
        if self.chunks_before < 0:
            raise ValueError("chunks_before must be >= 0")
        if self.keepalive <= 0:
            raise ValueError("keepalive must be > 0")


@dataclass
class _ClientWatch:
    """While a streamed answer is sent: `wake` is set once the client leaves (`gone`) or the
    server stops (ScriptedLLMServer._watching)."""

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False


class _DropConnection(Exception):
    """Raised inside the ASGI app to make uvicorn abort the response mid-body."""


PlannedResponse: TypeAlias = (
    TextResponse | ReasoningResponse | ToolCallResponse | ErrorResponse | BrokenStream | StalledStream
)
DefaultResponder: TypeAlias = Callable[[JSON], PlannedResponse]


#: Dimensions of the stand-in embeddings (not the offline model's 384: a model change is visible).
EMBEDDING_DIMS = 64


def hashed_embedding(text: str, dims: int = EMBEDDING_DIMS) -> list[float]:
    """Each lower-cased word adds 1 to a dimension picked by a stable hash of the word."""
    import hashlib

    vector = [0.0] * dims
    for word in re.findall(r"\w+", text.lower()):
        vector[int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big") % dims] += 1.0
    if not any(vector):
        vector[0] = 1.0
    return vector


def ok_responder(request: JSON) -> PlannedResponse:
    """Initial default responder: always the text ``"OK"`` (trivial and deterministic)."""
    return TextResponse("OK")


def _words(value: Any) -> int:
    """Count whitespace-separated words in a message content (str or content parts)."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(part.get("text", "")) for part in value if isinstance(part, dict))
    return 0


def _prompt_tokens(request: JSON) -> int:
    """Rough prompt token count: words of every message plus one per message."""
    messages = request.get("messages") or []
    return sum(1 + _words(m.get("content")) for m in messages if isinstance(m, dict))


def _dumps(obj: Any) -> bytes:
    """Compact JSON encoding, used for every response body and SSE event."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _sse(obj: Any) -> bytes:
    """Encode one server-sent event line the way OpenAI does."""
    return b"data: " + _dumps(obj) + b"\n\n"


def _split_arguments(arguments: str) -> list[str]:
    """Split a JSON argument string into >= 2 pieces so clients must reassemble it."""
    pieces = max(2, math.ceil(len(arguments) / 16))
    return split_text(arguments, pieces) if len(arguments) >= 2 else [arguments, ""]


@dataclass
class _Rendered:
    """A planned response turned into wire-level parts for one request."""

    content_pieces: list[str]
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # id, name, args
    delay: float = 0.0
    reasoning_pieces: list[str] = field(default_factory=list)

    @property
    def content(self) -> str:
        """Full assistant text."""
        return "".join(self.content_pieces)

    @property
    def reasoning(self) -> str:
        """Full reasoning text ("" for a model that does not reason)."""
        return "".join(self.reasoning_pieces)

    @property
    def finish_reason(self) -> str:
        """``tool_calls`` when the turn calls tools, else ``stop``."""
        return "tool_calls" if self.tool_calls else "stop"

    def completion_tokens(self) -> int:
        """Rough completion token count: answer words plus argument words, at least 1."""
        count = len(self.content.split()) + len(self.reasoning.split())
        for _id, name, args in self.tool_calls:
            count += 1 + len(name.split()) + len(args.split())
        return max(1, count)


def _render(planned: TextResponse | ReasoningResponse | ToolCallResponse) -> _Rendered:
    """Turn a planned response into concrete pieces, generating tool-call ids."""
    if isinstance(planned, TextResponse):
        return _Rendered(_pieces(planned.content, planned.chunks, planned.split_at), delay=planned.delay)
    if isinstance(planned, ReasoningResponse):
        return _Rendered(
            split_text(planned.content, planned.chunks),
            delay=planned.delay,
            reasoning_pieces=split_text(planned.reasoning, planned.chunks),
        )
    calls = [
        (f"call_{uuid.uuid4().hex[:24]}", name, json.dumps(args, ensure_ascii=False))
        for name, args in planned.calls
    ]
    return _Rendered(split_text(planned.content), calls, planned.delay)


class ScriptedLLMServer:
    """OpenAI-compatible ``/v1/chat/completions`` + ``/v1/models`` stand-in.

    Thread-safe: script, recorded requests and counters may be touched from any thread
    while the server runs in its own thread and event loop.
    """

    def __init__(
        self,
        models: Sequence[str] = ("test-model",),
        graceful_shutdown_timeout: int = 1,
        keep_alive: bool = False,
    ) -> None:
        """Configure without binding; ``start()`` binds a free port on 127.0.0.1.

        ``keep_alive=False`` (default) answers ``Connection: close``. Why: langchain_openai
        caches one httpx client per base URL for the whole process, so a pooled
        connection opened under one pytest event loop would be reused (and fail with
        "Event loop is closed") under the next. A new localhost connection per request
        costs well under a millisecond; pass ``True`` to measure with pooling.
        """
        self._models = list(models)
        self._conn_headers: list[tuple[bytes, bytes]] = [] if keep_alive else [(b"connection", b"close")]
        self._graceful_timeout = graceful_shutdown_timeout
        self._lock = threading.Lock()
        self._counted = threading.Condition(self._lock)  # notified on every stream end
        self._script: collections.deque[PlannedResponse] = collections.deque()
        self._requests: list[JSON] = []
        self._default: DefaultResponder = ok_responder
        self._disconnected = 0
        self._completed = 0
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Server-loop-only state: wake-up events of running slow streams, set on stop().
        self._wakers: set[asyncio.Event] = set()
        self._stopping = False
        #: Bodies of `/v1/embeddings` requests; set `embeddings_fail` to answer them 503.
        self.embedding_requests: list[JSON] = []
        self.embeddings_fail = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Start serving and return once the socket accepts connections (idempotent)."""
        if self._thread is not None:
            return self
        # IPPROTO_TCP (not 0) so asyncio sets TCP_NODELAY on accepted connections; without it
        # a keep-alive client waits ~40 ms for each answer (Nagle + delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            cast(Any, self._asgi),
            interface="asgi3",  # a bound method would be mistaken for ASGI2
            lifespan="off",
            log_config=None,  # never reconfigure the host process's logging
            log_level=None,
            timeout_graceful_shutdown=self._graceful_timeout,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._stopping = False
        thread = threading.Thread(
            target=self._run,
            args=(server, sock),
            name="scripted-llm-server",
            daemon=True,
        )
        self._thread = thread
        thread.start()
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self._thread = None
                self._server = None
                sock.close()
                raise RuntimeError("ScriptedLLMServer failed to start (see thread traceback)")
            time.sleep(0.005)
        return self

    def _run(self, server: uvicorn.Server, sock: socket.socket) -> None:
        """Thread body: a private event loop so callers' loops are never involved."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        finally:
            try:
                # uvicorn may leave cancelled handlers behind after its graceful timeout;
                # let them unwind so sockets close and no "Task was destroyed" warnings.
                leftovers = asyncio.all_tasks(loop)
                for task in leftovers:
                    task.cancel()
                if leftovers:
                    loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                self._loop = None
                sock.close()
                loop.close()

    def _abort_streams(self) -> None:
        """Runs in the server loop: end slow streams now instead of waiting them out."""
        self._stopping = True
        for waker in self._wakers:
            waker.set()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and join the thread; running slow streams end at once.

        Streams cut short by ``stop()`` end without ``[DONE]`` and count as neither
        completed nor disconnected.
        """
        server, thread, loop = self._server, self._thread, self._loop
        if server is None or thread is None:
            return
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(self._abort_streams)
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        """Start on entry so ``with ScriptedLLMServer() as s:`` is ready to use."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop on exit, even when the body failed."""
        self.stop()

    async def __aenter__(self) -> Self:
        """Async variant that does not block the caller's event loop while starting."""
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Async variant of ``__exit__``."""
        await asyncio.to_thread(self.stop)

    @property
    def port(self) -> int:
        """The bound TCP port (only valid after ``start()``)."""
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL, e.g. for ``ChatOpenAI(base_url=...)`` or ``OPENAI_BASE_URL``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------- script

    def push(self, *responses: PlannedResponse) -> None:
        """Append planned responses to the FIFO script."""
        with self._lock:
            self._script.extend(responses)

    def push_text(
        self,
        content: str,
        chunks: int | None = None,
        delay: float = 0.0,
        split_at: Sequence[int] | None = None,
    ) -> None:
        """Script a text answer; streamed per word (or in ``chunks`` pieces, or cut at the
        character offsets ``split_at``, e.g. inside a ``<think>`` tag) ``delay`` s apart."""
        self.push(TextResponse(content, chunks, delay, None if split_at is None else tuple(split_at)))

    def push_reasoning(
        self, reasoning: str, content: str, chunks: int | None = None, delay: float = 0.0
    ) -> None:
        """Script a reasoning model's answer: ``reasoning`` streamed as ``reasoning_content``
        deltas, then ``content`` as ``content`` deltas (vLLM, DeepSeek)."""
        self.push(ReasoningResponse(reasoning, content, chunks, delay))

    def push_tool_calls(self, calls: list[tuple[str, dict[str, Any]]], content: str = "") -> None:
        """Script one assistant turn calling the given ``(name, arguments)`` tools."""
        self.push(ToolCallResponse(list(calls), content))

    def push_error(
        self, status: int = 500, message: str = "scripted error", retry_after: float | None = None
    ) -> None:
        """Script an HTTP error answer (mind the SDK's automatic retries); 429 is a rate limit."""
        kind = "rate_limit_exceeded" if status == 429 else "server_error"
        self.push(ErrorResponse(status, message, kind, retry_after))

    def push_broken_stream(
        self, content: str, chunks_before: int = 2, how: Literal["garbage", "drop"] = "garbage"
    ) -> None:
        """Script a stream that breaks off after ``chunks_before`` pieces of ``content``."""
        self.push(BrokenStream(content, chunks_before, how))

    def push_stalled_stream(
        self, content: str, chunks_before: int = 1, keepalive: float = 0.2, for_seconds: float = 120.0
    ) -> None:
        """Script a stream that sends ``chunks_before`` pieces of ``content``, then only
        keep-alive comments every ``keepalive`` s (see ``StalledStream``)."""
        self.push(StalledStream(content, chunks_before, keepalive, for_seconds))

    def set_default(self, fn: DefaultResponder | None) -> None:
        """Set the responder used when the script is empty; ``None`` restores ``"OK"``."""
        with self._lock:
            self._default = fn if fn is not None else ok_responder

    @property
    def pending(self) -> int:
        """Number of scripted responses not consumed yet."""
        with self._lock:
            return len(self._script)

    def clear(self) -> None:
        """Reset between tests: recorded requests, unconsumed script, stream counters and
        the default responder (back to ``"OK"``)."""
        with self._lock:
            self._requests.clear()
            self._script.clear()
            self._disconnected = 0
            self._completed = 0
            self._default = ok_responder
            self.embedding_requests.clear()
            self.embeddings_fail = False

    # ---------------------------------------------------------------- inspection

    @property
    def requests(self) -> list[JSON]:
        """Copy of every parsed ``/chat/completions`` request body, oldest first."""
        with self._lock:
            return list(self._requests)

    def offered_tool_names(self, i: int = -1) -> list[str]:
        """Function names in request ``i``'s ``tools`` (empty if it offered none)."""
        with self._lock:
            request = self._requests[i]
        names: list[str] = []
        for tool in request.get("tools") or []:
            fn = tool.get("function") if isinstance(tool, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if isinstance(name, str):
                names.append(name)
        return names

    def image_parts(self, i: int = -1) -> list[JSON]:
        """The ``image_url`` content parts of every user message of request ``i``, in order
        (empty when it sent no image): what a vision model was shown."""
        with self._lock:
            request = self._requests[i]
        parts: list[JSON] = []
        for message in request.get("messages") or []:
            if not isinstance(message, dict) or message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, list):
                parts += [p for p in content if isinstance(p, dict) and p.get("type") == "image_url"]
        return parts

    @property
    def disconnected_streams(self) -> int:
        """Streams whose client went away before ``data: [DONE]`` was sent."""
        with self._lock:
            return self._disconnected

    @property
    def completed_streams(self) -> int:
        """Streams that sent ``data: [DONE]``."""
        with self._lock:
            return self._completed

    def wait_for_streams(
        self,
        disconnected: int | None = None,
        completed: int | None = None,
        timeout: float = 5.0,
    ) -> bool:
        """Block until the counters reach at least the given values; False on timeout.

        Why: a disconnect is only noticed server-side a moment after the client leaves,
        so tests wait for it instead of sleeping. From async code use
        ``await asyncio.to_thread(server.wait_for_streams, disconnected=1)``.
        """

        def reached() -> bool:
            return (disconnected is None or self._disconnected >= disconnected) and (
                completed is None or self._completed >= completed
            )

        with self._counted:
            return self._counted.wait_for(reached, timeout)

    # --------------------------------------------------------------------- ASGI

    def _next_planned(self, request: JSON) -> PlannedResponse:
        """Record the request and pop the next planned response (or ask the default)."""
        with self._lock:
            self._requests.append(request)
            if self._script:
                return self._script.popleft()
            default = self._default
        return default(request)

    async def _asgi(self, scope: Message, receive: Receive, send: Send) -> None:
        """Minimal ASGI router: raw ASGI keeps per-request overhead and hidden tasks low."""
        if scope["type"] != "http":
            return
        method: str = scope["method"]
        path: str = scope["path"].rstrip("/")
        path = path.removeprefix("/v1")
        if method == "POST" and path == "/chat/completions":
            await self._chat(receive, send)
        elif method == "POST" and path == "/embeddings":
            await self._embeddings(receive, send)
        elif method == "GET" and path == "/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in self._models]
            await self._json(send, 200, {"object": "list", "data": data})
        elif method == "GET" and path.startswith("/models/"):
            model = path[len("/models/") :]
            await self._json(
                send,
                200,
                {"id": model, "object": "model", "created": 0, "owned_by": "scripted"},
            )
        else:
            await self._error_json(send, 404, f"no route for {method} {scope['path']}", "not_found")

    async def _embeddings(self, receive: Receive, send: Send) -> None:
        """`/v1/embeddings`: a deterministic bag of hashed words in EMBEDDING_DIMS dimensions,
        so texts sharing words are similar (a stand-in for an embeddings endpoint)."""
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        request = json.loads(body)
        with self._lock:
            self.embedding_requests.append(request)
            failing = self.embeddings_fail
        if failing:
            await self._error_json(send, 503, "embeddings unavailable", "server_error")
            return
        texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
        data = [
            {"object": "embedding", "index": i, "embedding": hashed_embedding(str(t), EMBEDDING_DIMS)}
            for i, t in enumerate(texts)
        ]
        usage = {
            "prompt_tokens": sum(_words(t) for t in texts),
            "total_tokens": sum(_words(t) for t in texts),
        }
        await self._json(
            send, 200, {"object": "list", "data": data, "model": request.get("model"), "usage": usage}
        )

    async def _json(
        self, send: Send, status: int, body: Any, extra_headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """Send a complete JSON response."""
        payload = _dumps(body)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            *self._conn_headers,
            *(extra_headers or []),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _error_json(
        self,
        send: Send,
        status: int,
        message: str,
        kind: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Send an error in the shape the openai SDK parses."""
        await self._json(
            send,
            status,
            {"error": {"message": message, "type": kind, "param": None, "code": None}},
            headers,
        )

    async def _broken_stream(self, send: Send, request: JSON, planned: BrokenStream) -> None:
        """Stream the first pieces of an answer, then a non-JSON data line or an aborted body."""
        model = str(request.get("model") or (self._models[0] if self._models else "test-model"))
        head, pieces, _tail = self._events(request, _render(TextResponse(planned.content)), model, False)
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), *self._conn_headers]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for event in head + pieces[: planned.chunks_before]:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        self._count(completed=False)
        if planned.how == "drop":
            raise _DropConnection("scripted: connection dropped mid-stream")
        await send({"type": "http.response.body", "body": b'data: {"id": "chatcmpl-broken", "cho\n\n'})

    async def _stalled_stream(
        self, receive: Receive, send: Send, request: JSON, planned: StalledStream
    ) -> None:
        """Stream the first pieces of an answer, then keep-alive comments only until the client
        leaves (counted as disconnected), the server stops or ``for_seconds`` pass."""
        model = str(request.get("model") or (self._models[0] if self._models else "test-model"))
        head, pieces, _tail = self._events(request, _render(TextResponse(planned.content)), model, False)
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), *self._conn_headers]
        deadline = time.monotonic() + planned.for_seconds
        async with self._watching(receive) as watch:
            try:
                with contextlib.suppress(OSError):
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    for event in head + pieces[: planned.chunks_before]:
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    while not watch.wake.is_set() and time.monotonic() < deadline:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(watch.wake.wait(), planned.keepalive)
                        if not watch.wake.is_set():
                            await send(
                                {"type": "http.response.body", "body": _SSE_KEEPALIVE, "more_body": True}
                            )
                    if not watch.gone:  # out of time, or the server stops: end the body quietly
                        await send({"type": "http.response.body", "body": b""})
            finally:
                if watch.gone or not self._stopping:
                    self._count(completed=False)

    @contextlib.asynccontextmanager
    async def _watching(self, receive: Receive) -> AsyncIterator[_ClientWatch]:
        """A watch on the client for the block: uvicorn answers receive() with
        http.disconnect once the socket closes (and silently drops later sends), so that is
        the reliable signal; a server that stops wakes every watch too."""
        watch = _ClientWatch()

        async def watcher() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            watch.gone = True
            watch.wake.set()

        task = asyncio.create_task(watcher())
        self._wakers.add(watch.wake)
        if self._stopping:
            watch.wake.set()
        try:
            yield watch
        finally:
            task.cancel()
            self._wakers.discard(watch.wake)

    async def _chat(self, receive: Receive, send: Send) -> None:
        """Handle one chat completion: record, pick the planned answer, reply."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise TypeError("body must be a JSON object")
        except (ValueError, TypeError) as exc:
            await self._error_json(send, 400, f"invalid JSON body: {exc}", "invalid_request_error")
            return
        # A raising default responder propagates: uvicorn logs it and answers 500.
        planned = self._next_planned(request)
        if isinstance(planned, ErrorResponse):
            extra = (
                [] if planned.retry_after is None else [(b"retry-after", f"{planned.retry_after:g}".encode())]
            )
            await self._error_json(send, planned.status, planned.message, planned.type, extra)
            return
        if isinstance(planned, BrokenStream):
            await self._broken_stream(send, request, planned)
            return
        if isinstance(planned, StalledStream):
            await self._stalled_stream(receive, send, request, planned)
            return
        rendered = _render(planned)
        model = str(request.get("model") or (self._models[0] if self._models else "test-model"))
        if request.get("stream"):
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            await self._stream(receive, send, request, rendered, model, include_usage)
        else:
            await self._json(send, 200, self._completion(request, rendered, model))

    @staticmethod
    def _usage(request: JSON, rendered: _Rendered) -> JSON:
        """Rough usage block (words, not real tokens)."""
        prompt, completion = _prompt_tokens(request), rendered.completion_tokens()
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _completion(self, request: JSON, rendered: _Rendered, model: str) -> JSON:
        """Build a non-streaming ``chat.completion`` object."""
        message: JSON = {
            "role": "assistant",
            "content": rendered.content,
            "refusal": None,
        }
        if rendered.reasoning_pieces:
            message["reasoning_content"] = rendered.reasoning
        if rendered.tool_calls:
            message["content"] = rendered.content or None
            message["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for cid, name, args in rendered.tool_calls
            ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": rendered.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self._usage(request, rendered),
        }

    def _events(
        self, request: JSON, rendered: _Rendered, model: str, include_usage: bool
    ) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """Encode the SSE stream as (head, delayed pieces, tail) event lists."""
        base: JSON = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

        def chunk(delta: JSON, finish_reason: str | None = None) -> bytes:
            return _sse(
                {
                    **base,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                }
            )

        head = [chunk({"role": "assistant", "content": ""})]
        pieces = [chunk({"reasoning_content": piece}) for piece in rendered.reasoning_pieces]
        pieces += [chunk({"content": piece}) for piece in rendered.content_pieces]
        for index, (cid, name, args) in enumerate(rendered.tool_calls):
            first = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            pieces.append(chunk({"tool_calls": [first]}))
            pieces.extend(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
                for part in _split_arguments(args)
            )
        tail = [chunk({}, rendered.finish_reason)]
        if include_usage:
            tail.append(_sse({**base, "choices": [], "usage": self._usage(request, rendered)}))
        tail.append(_SSE_DONE)
        return head, pieces, tail

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        request: JSON,
        rendered: _Rendered,
        model: str,
        include_usage: bool,
    ) -> None:
        """Send an SSE answer; with a delay, watch for the client going away between chunks.

        Counters are bumped *before* the final write so a client that has just read
        ``[DONE]`` always sees ``completed_streams`` already updated.
        """
        head, pieces, tail = self._events(request, rendered, model, include_usage)
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            *self._conn_headers,
        ]
        if rendered.delay <= 0:
            # Fast path for benchmarks: one write, no timers, no watcher task.
            payload = b"".join(head + pieces + tail)
            headers.append((b"content-length", str(len(payload)).encode()))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            self._count(completed=True)
            await send({"type": "http.response.body", "body": payload})
            return

        counted = False
        async with self._watching(receive) as watch:
            try:
                # Other ASGI servers raise OSError on send to a closed socket: same as "gone".
                with contextlib.suppress(OSError):
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    for event in head:
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    for event in pieces:
                        with contextlib.suppress(TimeoutError):  # the delay; wake ends it early
                            await asyncio.wait_for(watch.wake.wait(), rendered.delay)
                        if watch.wake.is_set():
                            break
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                    if not watch.wake.is_set():
                        counted = True
                        self._count(completed=True)
                        await send({"type": "http.response.body", "body": b"".join(tail)})
                    elif not watch.gone:  # server stopping: end the response quietly
                        await send({"type": "http.response.body", "body": b""})
            finally:
                if not counted and (watch.gone or not self._stopping):
                    self._count(completed=False)

    def _count(self, completed: bool) -> None:
        """Bump the completed or disconnected stream counter."""
        with self._counted:
            if completed:
                self._completed += 1
            else:
                self._disconnected += 1
            self._counted.notify_all()
