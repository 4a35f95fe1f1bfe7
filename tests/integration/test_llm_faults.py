"""The model endpoint failing, seen over HTTP from the graph service (no Matrix): the openai
SDK's own retry policy (LLM_MAX_RETRIES) retries a refusal before the stream starts,
transparently; a stream that breaks off midway is one error event and never retried."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import kinds, post_sse
from vagent_graph.observability.usage import streamed_tokens
from vagent_shared import redis_keys
from vagent_shared.budgets import usage_day
from vagent_shared.events import ErrorEvent, SSEEvent, TextChunk, TextFinal

PM = "/api/v1/process_message"
pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    with GraphProcess(
        redis_url, tmp_path_factory.mktemp("graph-llm-faults"), _llm_session.base_url, LLM_MAX_RETRIES="2"
    ) as g:
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as c:
        yield c


def text_of(events: Sequence[SSEEvent]) -> str:
    finals = [e.content for e in events if isinstance(e, TextFinal)]
    return finals[-1] if finals else "".join(e.content for e in events if isinstance(e, TextChunk))


async def test_a_429_before_the_stream_is_retried_by_the_sdk_after_retry_after(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_error(429, "slow down", retry_after=1)
    llm_server.push_text("Answer after the rate limit.")
    started = time.monotonic()
    events = await post_sse(client, PM, message_body(new_session(), "hi", ac(superuser=True)), graph.headers)
    assert time.monotonic() - started >= 1  # Retry-After was honoured
    assert len(llm_server.requests) == 2  # the refused request, then its retry
    assert not [e for e in events if isinstance(e, ErrorEvent)]
    assert text_of(events) == "Answer after the rate limit."


async def test_500s_beyond_the_retries_are_one_error_event(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    for _ in range(3):  # the request and LLM_MAX_RETRIES=2 retries
        llm_server.push_error(500, "boom: internal details")
    events = await post_sse(client, PM, message_body(new_session(), "hi", ac(superuser=True)), graph.headers)
    assert len(llm_server.requests) == 3
    assert kinds(events) == ["error", "done"]
    error = events[0]
    assert isinstance(error, ErrorEvent) and error.error_code == "llm_unavailable"
    assert "boom" not in error.message


@pytest.mark.parametrize(("how", "code"), [("garbage", "internal_error"), ("drop", "llm_unavailable")])
async def test_a_stream_broken_midway_is_one_error_event_and_not_retried(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, how: str, code: str
) -> None:
    llm_server.push_broken_stream("Half an answer that never ends", chunks_before=3, how=how)  # type: ignore[arg-type]
    session = new_session()
    events = await post_sse(client, PM, message_body(session, "hi", ac(superuser=True)), graph.headers)
    assert len(llm_server.requests) == 1  # chunks had arrived: no retry
    *streamed, error, done = events  # what had come, then one error
    assert kinds(streamed) == ["text_chunk"] * len(streamed) and done.EVENT == "done"
    assert text_of(streamed) == "Half an answer "
    assert isinstance(error, ErrorEvent) and error.error_code == code
    assert "Traceback" not in error.message and "chatcmpl" not in error.message and len(error.message) < 100
    # the session stays usable: the next message is answered normally
    llm_server.push_text("Fine again.")
    again = await post_sse(client, PM, message_body(session, "again?", ac(superuser=True)), graph.headers)
    assert text_of(again) == "Fine again." and "error" not in kinds(again)


# ---- a model that stalls: one watchdog per call (stall_guard.py), limit LLM_TIMEOUT_SECONDS ----

STALL_LIMIT = 2.0
RUN_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def stalling_graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    with GraphProcess(
        redis_url,
        tmp_path_factory.mktemp("graph-llm-stall"),
        _llm_session.base_url,
        LLM_TIMEOUT_SECONDS=str(STALL_LIMIT),
        RUN_TIMEOUT_SECONDS=str(RUN_TIMEOUT),
    ) as g:
        yield g


async def charged(redis_url: str, user: str, tenant: str) -> tuple[int, int, int]:
    """The (tenant, user) row's tokens in and out and calls today, once a call is recorded
    (the charge is written by its own task, a moment after the turn ended)."""
    day = redis_keys.usage_day(usage_day().isoformat())
    fields = [f"r|{tenant}|{user}|{what}" for what in ("in", "out", "calls")]
    client = Redis.from_url(redis_url)
    try:
        for _ in range(100):
            found = [int(v or 0) for v in await client.hmget(day, fields)]
            if found[2]:
                break
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()
    return found[0], found[1], found[2]


async def test_a_model_sending_only_keep_alives_ends_the_turn_with_a_timeout(
    stalling_graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    user, tenant = f"@stall{tag}:localhost", f"stall{tag}"
    llm_server.push_stalled_stream("First words, then nothing but keep-alives", chunks_before=2)
    session = new_session(user)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=stalling_graph.url, timeout=RUN_TIMEOUT) as c:
        body = message_body(session, "hi", ac(user, superuser=True, domain=tenant))
        events = await post_sse(c, PM, body, stalling_graph.headers)
        elapsed = time.monotonic() - started
        # ended by the silence of chunks (the keep-alives kept the HTTP read timeout quiet),
        # long before the run's own timeout
        assert STALL_LIMIT <= elapsed < STALL_LIMIT + 5 < RUN_TIMEOUT
        *streamed, error, done = events
        assert text_of(streamed) == "First words, " and done.EVENT == "done"
        assert isinstance(error, ErrorEvent) and error.error_code == "timeout"
        assert error.message == "The answer took too long and was stopped."
        assert len(llm_server.requests) == 1  # chunks had come: never retried
        # the model's connection is closed, not left open with its keep-alives
        assert await asyncio.to_thread(llm_server.wait_for_streams, disconnected=1, timeout=10)
        # what was streamed is charged
        inp, out, calls = await charged(redis_url, user, tenant)
        assert calls == 1 and inp > 0 and out == streamed_tokens(len("First words, "))
        # and the session stays usable
        llm_server.push_text("Fine again.")
        again = await post_sse(
            c, PM, message_body(session, "again?", ac(user, domain=tenant)), stalling_graph.headers
        )
    assert text_of(again) == "Fine again." and "error" not in kinds(again)


async def test_a_slow_but_steady_model_is_never_stopped(
    stalling_graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    answer = "one two three four five six seven eight"
    llm_server.push_text(answer, delay=0.5)  # 8 chunks, 0.5 s apart: 4 s, twice the limit
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=stalling_graph.url, timeout=RUN_TIMEOUT) as c:
        events = await post_sse(
            c, PM, message_body(new_session(), "count", ac(superuser=True)), stalling_graph.headers
        )
    assert time.monotonic() - started >= 4 * 0.9
    assert "error" not in kinds(events) and text_of(events) == answer
