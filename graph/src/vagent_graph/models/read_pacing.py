"""The model's HTTP client: the OpenAI SDK's aiohttp transport, its streamed answers read
once per STREAM_COALESCE_MS window, not once per model chunk.

Why aiohttp (bench/README.md, "The seventh lever"): under httpx every chunk of a chunked
response is an event of h11's, passed up through httpcore, anyio and httpx one by one, in
pure Python. aiohttp parses the response in C as it arrives and hands over whatever is
buffered. It is the SDK's own documented client (`DefaultAioHttpClient`, `openai[aiohttp]`).

Why pacing: at a hosted model's pace (a chunk every ~25 ms) every chunk would wake the model
call's task on its own. Once the answer's first visible text is out, the person gets the
rest once per window anyway (AnswerStream), so nothing is gained by reading faster: before
each read the call waits out the window, and the read takes everything buffered meanwhile:
one wake-up for several chunks. When bytes are already here (in aiohttp's buffer or still in
the kernel: a burst, from a fast model or the end of an answer sent at once), the read
happens at once: waiting would only delay them.
Each chunk is still parsed, seen by LangChain, the usage meter and the stall guard, in order.

What does not change: the first text is read the moment it arrives (nothing is paced before
visible text, so thinking and tool-call-only replies are read as they come); a wait is at
most one window (far below LLM_TIMEOUT_SECONDS); `!stop` cancels the wait as any other
await; a call outside a model node (a test's bare model) is never paced. Requests through a
proxy (HTTP(S)_PROXY) are paced too: the pacing is in the body, not in the connection.

How: the model node says, for the call it makes, how long the window is and whether visible
text went out (its listener, listener.py: a ContextVar set in the node's task, which is the
task that reads the body). `ModelHttpClient` puts a `PacedTransport` around each transport
the SDK's client makes, which wraps each response's body in a `PacedBody`.

On an upgrade of `openai` (its vendored `httpx_aiohttp`): `tests/integration/
test_read_pacing.py` checks the pacing, the burst rule (it reads the aiohttp response the
vendored body keeps as `_aiohttp_response`; without it a burst would wait out the window)
and the errors' kinds (`PacedTransport` corrects the vendored map's), and that httpx2 still
makes its transports through `_init_transport`/`_init_proxy_transport` (`ModelHttpClient`
overrides them, as the SDK's own aiohttp client does: the proxy test). If the SDK drops its
aiohttp client, go back to httpx's transport with pacing in httpcore's network backend
(this module before 2026-11-30).
"""

from __future__ import annotations

import asyncio
import fcntl
import sys
import termios
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
from openai import DefaultAioHttpClient

from vagent_graph.models.listener import current_listener


class PacedBody(httpx2.AsyncByteStream):
    """A response body whose reads, inside a paced call once visible text is out, are at
    least a window apart."""

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self._inner = inner
        response = getattr(inner, "_aiohttp_response", None)
        #: What aiohttp has received of the body, and the connection's socket (None: not an
        #: aiohttp body: no burst rule).
        self._content: aiohttp.StreamReader | None = getattr(response, "content", None)
        connection = getattr(response, "connection", None)
        transport = connection.transport if connection is not None else None
        self._socket: Any = transport.get_extra_info("socket") if transport is not None else None
        self._taken = 0

    def _bytes_waiting(self) -> bool:
        """Bytes of the body are here already: in aiohttp's buffer (the transport never
        decompresses, so what it received is what the reads give), or still in the kernel
        (FIONREAD: the event loop has not read them yet)."""
        if self._content is not None and self._content.total_bytes > self._taken:
            return True
        if self._socket is None:
            return False
        try:
            count = fcntl.ioctl(self._socket.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return False
        return int.from_bytes(count, sys.byteorder, signed=True) > 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = self._inner.__aiter__()
        last = 0.0
        try:
            while True:
                paced = current_listener()
                if last and paced is not None and paced.shown and paced.window > 0:
                    # a window after the last read, and not before the listener sends again:
                    # what the read brings then goes out at once, not held a window more
                    wait = max(last + paced.window, paced.due) - time.monotonic()
                    if wait > 0 and not self._bytes_waiting():
                        await asyncio.sleep(wait)
                try:
                    data = await chunks.__anext__()
                except StopAsyncIteration:
                    return
                last = time.monotonic()
                self._taken += len(data)
                yield data
        finally:
            closing = getattr(chunks, "aclose", None)
            if closing is not None:
                await closing()

    async def aclose(self) -> None:
        await self._inner.aclose()


class PacedTransport(httpx2.AsyncBaseTransport):
    """One of the SDK's aiohttp transports (direct or through a proxy), each response's body
    paced, and a connection that fails without a timeout told as such (the vendored map calls
    every `ClientConnectionError` a connect timeout, so a refused or dropped connection would
    reach a person as "the model took too long")."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self.inner.handle_async_request(request)
        except httpx2.ConnectTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, TimeoutError):
                raise httpx2.ConnectError(str(exc), request=request) from cause
            raise
        if isinstance(response.stream, httpx2.AsyncByteStream):
            response.stream = PacedBody(response.stream)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class ModelHttpClient(DefaultAioHttpClient):  # type: ignore[misc, valid-type]
    """The SDK's aiohttp client (its timeouts, pool limits, redirects, and HTTP(S)_PROXY /
    NO_PROXY from the environment), every transport it makes paced. Why not `transport=`:
    httpx2 then ignores the environment's proxies. The two methods overridden are the ones the
    SDK's own aiohttp client overrides to put its transports in."""

    def _init_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return PacedTransport(super()._init_transport(*args, **kwargs))

    def _init_proxy_transport(self, *args: Any, **kwargs: Any) -> httpx2.AsyncBaseTransport:
        return PacedTransport(super()._init_proxy_transport(*args, **kwargs))


def model_http_client(**kwargs: Any) -> httpx2.AsyncClient:
    """The client the model is called through (llm.py adds the usage hooks)."""
    return ModelHttpClient(**kwargs)
