"""A round-robin TCP proxy for tests: what a load balancer in front of several graph replicas
does, on a free 127.0.0.1 port.

Each new client connection goes to the next backend in turn; a backend that refuses the
connection is skipped (the next one is tried), so a killed replica drops out by itself.
Runs its own event loop in a thread, so sync and async tests can use it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Self

from procutil import free_port


def next_backends(backends: list[tuple[str, int]], turn: int) -> list[tuple[str, int]]:
    """The order in which connection number `turn` tries the backends."""
    k = turn % len(backends)
    return backends[k:] + backends[:k]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


class RoundRobinProxy:
    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = list(backends)
        self.port = free_port()
        self.turn = 0
        #: The backend each accepted connection went to, in order (None: none answered).
        self.routed: list[tuple[str, int] | None] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        order = next_backends(self.backends, self.turn)
        self.turn += 1
        for host, port in order:
            try:
                up_r, up_w = await asyncio.open_connection(host, port)
            except OSError:
                continue
            self.routed.append((host, port))
            await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
            for w in (up_w, client_w):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            return
        self.routed.append(None)
        client_w.close()

    def start(self) -> Self:
        self._thread.start()

        async def serve() -> asyncio.Server:
            return await asyncio.start_server(self._handle, "127.0.0.1", self.port)

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        self.stop()
