"""A raw HTTP/1.1 server on a free loopback port whose every answer a test decides: for
external systems in the states a real one is hard to put in (slow, hanging, 5xx, malformed).
It records each request and the most requests it had in flight at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

#: (method, path, JSON body or None) -> (status, JSON-able body, or bytes sent as they are)
Respond = Callable[[str, str, Any], Awaitable[tuple[int, Any]]]
REASONS = {200: "OK", 201: "Created", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}


class HttpStandIn:
    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        #: (method, path, JSON body, lower-cased headers) of every request, in arrival order
        self.requests: list[tuple[str, str, Any, dict[str, str]]] = []
        self.in_flight = self.max_in_flight = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.url = ""

    @property
    def bodies(self) -> list[Any]:
        return [body for _, _, body, _ in self.requests]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *lines = head.split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines if ln)}
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            body = json.loads(raw) if raw else None
            self.requests.append((method, path, body, headers))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                status, answer = await self.respond(method, path, body)
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                writer.write(
                    f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                    "Connection: close\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
            finally:
                self.in_flight -= 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._handlers.discard(task)

    async def __aenter__(self) -> HttpStandIn:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._handlers):  # answers still hanging are abandoned, not awaited
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
