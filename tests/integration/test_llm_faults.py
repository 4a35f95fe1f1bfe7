"""The model endpoint failing, seen over HTTP from the graph service (no Matrix): the openai
SDK's own retry policy (LLM_MAX_RETRIES) retries a refusal before the stream starts,
transparently; a stream that breaks off midway is one error event and never retried."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence

import httpx
import pytest

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import kinds, post_sse
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
