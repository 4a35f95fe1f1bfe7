"""Read a streamed answer from the model's socket once per STREAM_COALESCE_MS window, not
once per model chunk.

Why: at a hosted model's pace (a chunk every ~25 ms) every chunk is a socket read of its
own: a wake-up of the model call's task, a receive with its read timeout, anyio resuming
and pausing the transport, h11 and httpcore around it (bench/README.md, "Read pacing", for
what that costs and what this saves). Once the answer's first visible text is out, the
person gets the rest once per window anyway (AnswerStream), so nothing is gained by reading
faster: before each socket read the call waits out the window, and the read takes what the
kernel buffered meanwhile (anyio pauses reading between receives): one wake-up for several
chunks. When the kernel already holds bytes (a burst: a fast model, the end of an answer sent
at once), the read happens at once: waiting would only delay what is there. Each chunk is
still parsed, seen by LangChain, the usage meter and the stall guard, in order.

What does not change: the first text is read and sent the moment it arrives (nothing is
paced before visible text, so thinking and tool-call-only replies are read as they come); a
wait is at most one window (far below LLM_TIMEOUT_SECONDS); `!stop` cancels the wait as any
other await; a call outside a model node (embeddings, a test's bare model) is never paced.

How: the model node says, for the call it makes, how long the window is and whether visible
text went out (its listener, listener.py: a ContextVar set in the node's task, where httpcore
reads the socket). httpcore reads through a network backend (its documented extension
point); `PacedTransport` gives the model's HTTP client's connection pool one that wraps each
connection's stream (`PacedStream`). A request through a proxy uses httpx's proxy transport
and is simply not paced.
"""

# ruff: noqa: ASYNC109  (the `timeout` parameters are httpcore's network interface, not ours)
from __future__ import annotations

import asyncio
import fcntl
import ssl
import sys
import termios
import time
import typing
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

from vagent_graph.models.listener import current_listener

_UNKNOWN = object()


class PacedStream(httpcore2.AsyncNetworkStream):
    """A connection's stream whose reads, inside a paced call once visible text is out, are
    at least a window apart."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self._inner = inner
        self._last_read = 0.0
        #: The connection's socket, asked once: anyio builds its whole attribute map (and
        #: asks the kernel for the peer's address) on every `get_extra_info`.
        self._socket: Any = _UNKNOWN

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        paced = current_listener()
        if paced is None:
            return await self._inner.read(max_bytes, timeout)
        if paced.shown and paced.window > 0:
            # a window after the last read, and not before the listener sends again: what the
            # read brings then goes out at once, not held a window more
            wait = max(self._last_read + paced.window, paced.due) - time.monotonic()
            if wait > 0 and not self._bytes_waiting():  # a burst already here is read at once
                await asyncio.sleep(wait)
        data = await self._inner.read(max_bytes, timeout)
        self._last_read = time.monotonic()
        return data

    def _bytes_waiting(self) -> bool:
        """The kernel holds bytes of this connection already (FIONREAD): the model sent a
        burst (a fast or cached answer, the end of one), so waiting would only delay it."""
        if self._socket is _UNKNOWN:
            self._socket = self._inner.get_extra_info("socket")
        sock = self._socket
        if sock is None:
            return False
        try:
            count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return False
        return int.from_bytes(count, sys.byteorder, signed=True) > 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return PacedStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class PacedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's network backend, each connection's stream wrapped in a PacedStream."""

    def __init__(self, inner: httpcore2.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return PacedStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return PacedStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PacedTransport(httpx2.AsyncHTTPTransport):
    """httpx's own transport (TLS, limits, retries of connects, HTTP/1.1), its connection
    pool reading through a PacedBackend."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        pool = typing.cast(Any, self._pool)
        pool._network_backend = PacedBackend(pool._network_backend)
