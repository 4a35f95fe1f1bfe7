"""A scripted, OpenAI-compatible speech-to-text server for tests (`/v1/audio/transcriptions`).

Why not `vagent-stt` (the development stand-in): a test must decide each answer (a given
transcript, a slow one, an error) and see what the bot sent (model, file name, size, whether
it sent its key). Like ``llm_server.ScriptedLLMServer`` it is a real HTTP server on
``127.0.0.1`` (a free port) in a thread with its own event loop, so the bot under test,
in-process or a subprocess (``STT_BASE_URL=server.base_url``), talks to it over the wire.

Answers come from a FIFO script (``push`` / ``push_error``); when it is empty, ``error``
(a status) if set, else ``default_text``. ``delay`` (seconds) is waited before every answer.

Usage::

    with ScriptedSTTServer(api_key="stt-key") as stt:
        stt.push("what is on my calendar today?")
        ...  # the bot transcribes a voice message
        assert stt.requests[-1].filename == "voice.ogg" and stt.requests[-1].authorized
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, cast

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

__all__ = ["STTRequest", "ScriptedSTTServer"]

_STARTUP_TIMEOUT = 10.0


@dataclass(frozen=True)
class STTRequest:
    """One transcription request as the server saw it (``authorized``: the key matched, or
    the server asks for none)."""

    model: str | None
    filename: str | None
    content_type: str | None
    size: int
    data: bytes
    response_format: str | None
    language: str | None
    auth_header: bool
    authorized: bool


@dataclass(frozen=True)
class _Text:
    text: str
    delay: float


@dataclass(frozen=True)
class _Error:
    status: int
    message: str


class ScriptedSTTServer:
    """The scriptable STT stand-in. Thread-safe: script and records may be touched from any
    thread while it serves in its own."""

    def __init__(
        self,
        default_text: str = "What is on my calendar today?",
        *,
        api_key: str | None = None,
        delay: float = 0.0,
        error: int | None = None,
    ) -> None:
        """Configure without binding; ``start()`` binds a free port on 127.0.0.1."""
        self.default_text = default_text
        #: If set, requests must carry ``Authorization: Bearer <api_key>`` (else 401).
        self.api_key = api_key
        #: Seconds waited before every answer (scripted ones add their own).
        self.delay = delay
        #: If set, every unscripted request is answered with this HTTP status.
        self.error = error
        self._lock = threading.Lock()
        self._script: collections.deque[_Text | _Error] = collections.deque()
        self._requests: list[STTRequest] = []
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Start serving and return once the socket accepts connections (idempotent)."""
        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        app = Starlette(routes=[Route("/v1/audio/transcriptions", self._transcribe, methods=["POST"])])
        config = uvicorn.Config(
            cast(Any, app),
            lifespan="off",
            log_config=None,  # never reconfigure the host process's logging
            log_level=None,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=self._run, args=(server, sock), name="scripted-stt", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self._server = self._thread = None
                sock.close()
                raise RuntimeError("ScriptedSTTServer failed to start (see thread traceback)")
            time.sleep(0.005)
        return self

    @staticmethod
    def _run(server: uvicorn.Server, sock: socket.socket) -> None:
        """Thread body: a private event loop, so callers' loops are never involved."""
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
            leftovers = asyncio.all_tasks(loop)  # answers still waiting out a delay
            for task in leftovers:
                task.cancel()
            if leftovers:
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        finally:
            sock.close()
            loop.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and join the thread (answers still in a delay are dropped)."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        """Async variant that does not block the caller's event loop while starting."""
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def base_url(self) -> str:
        """What the bot's STT_BASE_URL is set to (ends in /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------- script

    def push(self, text: str, delay: float = 0.0) -> None:
        """Answer the next request with ``text`` (after ``delay`` more seconds)."""
        if delay < 0:
            raise ValueError("delay must be >= 0")
        with self._lock:
            self._script.append(_Text(text, delay))

    def push_error(self, status: int = 500, message: str = "scripted error") -> None:
        """Answer the next request with an HTTP error in OpenAI's shape."""
        with self._lock:
            self._script.append(_Error(status, message))

    @property
    def requests(self) -> list[STTRequest]:
        """Every transcription request so far, oldest first (refused ones too)."""
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        """Forget the requests and the unconsumed script (the options stay)."""
        with self._lock:
            self._requests.clear()
            self._script.clear()

    # --------------------------------------------------------------------- HTTP

    async def _transcribe(self, request: Request) -> Response:
        header = request.headers.get("authorization")
        authorized = self.api_key is None or hmac.compare_digest(
            (header or "").encode(), f"Bearer {self.api_key}".encode()
        )
        async with request.form(max_files=1) as form:
            upload = form.get("file")
            data = await upload.read() if isinstance(upload, UploadFile) else b""
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
        record = STTRequest(
            model=fields.get("model"),
            filename=upload.filename if isinstance(upload, UploadFile) else None,
            content_type=upload.content_type if isinstance(upload, UploadFile) else None,
            size=len(data),
            data=data,
            response_format=fields.get("response_format"),
            language=fields.get("language"),
            auth_header=header is not None,
            authorized=authorized,
        )
        with self._lock:
            self._requests.append(record)
            planned = self._script.popleft() if authorized and self._script else None
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        if not authorized:
            return _error(401, "Incorrect API key provided.", "invalid_api_key")
        if planned is None and self.error is not None:
            planned = _Error(self.error, "scripted error")
        if isinstance(planned, _Error):
            return _error(planned.status, planned.message)
        if not isinstance(upload, UploadFile):
            return _error(400, "You must provide a file.")
        if planned is not None and planned.delay > 0:
            await asyncio.sleep(planned.delay)
        text = planned.text if planned is not None else self.default_text
        if record.response_format == "text":
            return PlainTextResponse(text + "\n")
        return JSONResponse({"text": text})


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)
