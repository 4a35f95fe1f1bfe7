"""A raw HTTP/1.1 server on a free loopback port whose every answer a test decides: for
external systems in the states a real one is hard to put in (slow, 5xx, malformed)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

#: (method, path, JSON body or None) -> (status, JSON-able body)
Respond = Callable[[str, str, Any], Awaitable[tuple[int, Any]]]
REASONS = {200: "OK", 201: "Created", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}


class HttpStandIn:
    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[tuple[str, str, Any, dict[str, str]]] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            body = json.loads(raw) if raw else None
            self.requests.append((method, path, body, headers))
            status, answer = await self.respond(method, path, body)
            data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            writer.write(
                f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> HttpStandIn:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
