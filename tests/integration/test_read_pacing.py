"""A model's streamed answer is read from its socket once per window once its first visible
text is out (models/read_pacing.py), over real sockets and the SDK's aiohttp transport: chunks come
in bursts a window apart, the first at once, every byte in order; nothing is paced outside a
paced call, before the first visible text, or in another task's call on the same client."""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import httpx2
import pytest

from vagent_graph.models.listener import listening
from vagent_graph.models.read_pacing import model_http_client

#: 40 pieces, 20 ms apart: about 0.8 s of streaming.
PIECES = [f"data: piece-{i:02d}\n\n".encode() for i in range(40)]
GAP = 0.02
#: The server closes the connection after each answer, and says so (a client may not reuse it).
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: close\r\n\r\n"
)
WINDOW = 0.1


@dataclass
class Answer:
    """What the model node's AnswerStream tells the reads: the window, and whether visible
    text went out (here: once the first piece was read, unless `shows_text` is False)."""

    window: float
    shows_text: bool = True
    pieces_seen: int = 0
    #: When the listener sends next (time.monotonic()); 0.0: no send pending.
    due: float = 0.0

    @property
    def shown(self) -> bool:
        return self.shows_text and self.pieces_seen > 0


async def serve(gap: float, request_lines: list[bytes] | None = None) -> AsyncGenerator[str, None]:
    """A plain HTTP/1.1 server streaming PIECES as chunked transfer, `gap` apart (0: the
    first piece, then all the others in one write, as a fast model or a cache sends)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        if request_lines is not None:
            request_lines.append(line)
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        writer.write(HEAD)
        for i, piece in enumerate(PIECES):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            if gap or i == 0:
                await writer.drain()
                await asyncio.sleep(gap)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"


@pytest.fixture
async def model_url() -> AsyncIterator[str]:
    async for url in serve(GAP):
        yield url


@pytest.fixture
async def burst_url() -> AsyncIterator[str]:
    async for url in serve(0.0):
        yield url


async def read_all(client: httpx2.AsyncClient, url: str, answer: Answer | None) -> tuple[bytes, list[float]]:
    """The body, and when each of its pieces came (seconds after the response started)."""
    body, times = b"", []
    with listening(answer):  # type: ignore[arg-type]  # only window, shown and due are read
        async with client.stream("POST", url, json={"stream": True}) as response:
            start = time.monotonic()
            async for raw in response.aiter_raw():
                body += raw
                times.append(time.monotonic() - start)
                if answer is not None:
                    answer.pieces_seen += 1
    return body, times


def bursts(times: list[float]) -> int:
    """How many times the reader waited for the socket: pieces read together arrive within
    a few milliseconds of each other."""
    return 1 + sum(b - a > 0.01 for a, b in itertools.pairwise(times))


@pytest.fixture
async def client() -> AsyncIterator[httpx2.AsyncClient]:
    async with model_http_client(timeout=30) as c:
        yield c


async def test_after_the_first_text_the_socket_is_read_once_per_window(
    client: httpx2.AsyncClient, model_url: str
) -> None:
    unpaced, plain_times = await read_all(client, model_url, None)
    paced, times = await read_all(client, model_url, Answer(WINDOW))
    print(f"\n{len(PIECES)} pieces: {bursts(plain_times)} reads unpaced, {bursts(times)} paced")
    assert paced == unpaced == b"".join(PIECES)  # every byte, in order
    assert bursts(plain_times) >= len(PIECES) / 2  # unpaced: about a read per piece
    assert bursts(times) <= times[-1] / WINDOW + 2  # paced: a read per window, several pieces each
    assert times[0] < 0.05  # the first piece is read as it comes: not held for a window


async def test_nothing_is_paced_before_visible_text_or_outside_a_paced_call(
    client: httpx2.AsyncClient, model_url: str
) -> None:
    """Thinking or a tool call's arguments (no visible text), and any call the model node
    does not pace: every piece is read as it comes."""
    for answer in (Answer(WINDOW, shows_text=False), Answer(0.0), None):
        body, times = await read_all(client, model_url, answer)
        assert body == b"".join(PIECES)
        assert bursts(times) >= len(PIECES) / 2, answer


async def test_a_paced_call_does_not_pace_another_tasks_call_on_the_same_client(
    client: httpx2.AsyncClient, model_url: str
) -> None:
    (_, paced), (_, plain) = await asyncio.gather(
        read_all(client, model_url, Answer(WINDOW)), read_all(client, model_url, None)
    )
    assert bursts(paced) <= paced[-1] / WINDOW + 2
    assert bursts(plain) >= len(PIECES) / 2


async def test_a_burst_already_in_the_kernel_is_read_at_once(
    client: httpx2.AsyncClient, burst_url: str
) -> None:
    """A fast model (or the end of an answer sent at once): the bytes are there, so the read
    does not wait out the window (which would only delay the answer's end)."""
    body, times = await read_all(client, burst_url, Answer(window=2.0))
    assert body == b"".join(PIECES)
    assert times[-1] < 1.0  # not one 2-second window later


async def test_a_read_waits_until_the_listener_sends_again(
    client: httpx2.AsyncClient, model_url: str
) -> None:
    """The listener's next send is later than a window after the last read: the read waits for
    it (what it brings then goes out at once, not held a window more)."""
    answer = Answer(WINDOW, due=time.monotonic() + 0.5)
    body, times = await read_all(client, model_url, answer)
    assert body == b"".join(PIECES)
    assert times[0] < 0.05  # nothing shown yet: the first piece is read as it comes
    assert times[1] >= 0.4  # then nothing before the listener's due time, not a window later


async def test_a_paced_wait_is_cancelled_at_once(client: httpx2.AsyncClient, model_url: str) -> None:
    """`!stop` cancels the model call: a read waiting out its window does not hold it up."""
    answer = Answer(window=30.0)
    task = asyncio.create_task(read_all(client, model_url, answer))
    await asyncio.sleep(0.3)  # the first piece came (20 ms) and the next read waits out its window
    assert answer.pieces_seen >= 1
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 1.0


async def failure(client: httpx2.AsyncClient, port: int) -> httpx2.HTTPError:
    """What asking a model on `port` raised: never a timeout (the SDK would then tell a person
    the model took too long, and retry it as one)."""
    with pytest.raises(httpx2.HTTPError) as raised:
        await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"stream": True})
    assert not isinstance(raised.value, httpx2.TimeoutException), raised.value
    return raised.value


async def test_a_refused_connection_is_a_connection_error_not_a_timeout(client: httpx2.AsyncClient) -> None:
    """The vendored aiohttp transport calls every failed connection a connect timeout."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert isinstance(await failure(client, port), httpx2.ConnectError)


async def test_a_model_that_hangs_up_without_answering_is_a_connection_error(
    client: httpx2.AsyncClient,
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        assert isinstance(await failure(client, port), httpx2.TransportError)


async def test_the_model_is_reached_through_the_environments_proxy_and_read_paced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP(S)_PROXY is honoured (an organisation's egress proxy), and an answer through it
    is paced as any other."""
    seen: list[bytes] = []
    proxy = serve(GAP, seen)
    url = await anext(proxy)
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, url.removesuffix("/v1/chat/completions"))
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with model_http_client(timeout=30) as via_proxy:
        body, times = await read_all(via_proxy, "http://model.invalid/v1/chat/completions", Answer(WINDOW))
    await proxy.aclose()
    assert seen == [b"POST http://model.invalid/v1/chat/completions HTTP/1.1\r\n"]
    assert body == b"".join(PIECES)
    assert bursts(times) <= times[-1] / WINDOW + 2
