"""The answer's text coalesced (STREAM_COALESCE_MS), through the graph's real HTTP API and a
scripted model: few `text_chunk` events, the first at once, nothing lost or split, no
thinking shown, tool calls, stops and budgets as before (docs/api.md, issue 34)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from redis.asyncio import Redis

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer, TextResponse, split_text
from tests.support.records import CUTOFF, add_old_record, older
from tests.support.sse import post_sse
from vagent_graph.models.reasoning import THINKING_STATUS
from vagent_graph.observability.usage import streamed_tokens
from vagent_shared import parse_sse_event, redis_keys
from vagent_shared.budgets import usage_day
from vagent_shared.events import HitlRequest, Progress, SSEEvent, TextChunk, TextFinal, TurnStarted
from vagent_shared.traces import TurnTrace

PM = "/api/v1/process_message"
FB = "/api/v1/submit_feedback"
ADMIN = "admin-token-for-coalescing-93c1"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
#: 200 model chunks 5 ms apart (about a second of streaming).
LONG = "".join(f"w{i:03d} " for i in range(200))


@pytest.fixture(scope="module")
def graphs(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GraphProcess, GraphProcess]]:
    """The same service twice: coalescing per 40 ms, and off (0)."""
    data = tmp_path_factory.mktemp("coalescing")
    env = {"GRAPH_ADMIN_TOKEN": ADMIN}
    coalesced = GraphProcess(redis_url, data, _llm_session.base_url, STREAM_COALESCE_MS="40", **env)
    per_chunk = GraphProcess(redis_url, data, _llm_session.base_url, STREAM_COALESCE_MS="0", **env)
    try:
        with ThreadPoolExecutor(2) as starting:
            list(starting.map(lambda g: g.start(), (coalesced, per_chunk)))
        yield coalesced, per_chunk
    finally:
        coalesced.stop()
        per_chunk.stop()


@pytest.fixture
def graph(graphs: tuple[GraphProcess, GraphProcess]) -> GraphProcess:
    return graphs[0]


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=60) as c:
        yield c


async def timed_ask(
    c: httpx.AsyncClient, graph: GraphProcess, message: str = "hi", **ac_kwargs: Any
) -> list[tuple[float, SSEEvent]]:
    """The events of one turn, each with when it arrived (seconds after the request)."""
    body = message_body(new_session(), message, ac(**ac_kwargs))
    start = time.monotonic()
    out: list[tuple[float, SSEEvent]] = []
    async with aconnect_sse(c, "POST", f"{graph.url}{PM}", json=body, headers=graph.headers) as src:
        assert src.response.status_code == 200
        async for sse in src.aiter_sse():
            event = parse_sse_event(sse.event, sse.data)
            if not isinstance(event, TurnStarted):
                out.append((time.monotonic() - start, event))
    return out


def chunks_of(events: list[SSEEvent]) -> list[TextChunk]:
    return [e for e in events if isinstance(e, TextChunk)]


def final_of(events: list[SSEEvent]) -> str:
    [text] = [e.content for e in events if isinstance(e, TextFinal)]
    return text


async def test_a_long_answer_streams_in_few_events_and_the_first_text_at_once(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    pieces = split_text(LONG)
    assert len(pieces) == 200
    llm_server.push(TextResponse(LONG, delay=0.005))
    timed = await timed_ask(client, graph)
    events = [e for _, e in timed]
    chunks = chunks_of(events)
    text_times = [t for t, e in timed if isinstance(e, TextChunk)]
    final_at = next(t for t, e in timed if isinstance(e, TextFinal))
    print(f"\n200 model chunks -> {len(chunks)} text_chunk events; first at {text_times[0] * 1000:.0f} ms")
    # far fewer events than model chunks, still streamed as it comes (not one lump at the end)
    assert 2 <= len(chunks) <= 60
    # the first text is the model's first piece alone: sent as it arrived, not held for a window
    assert chunks[0].content == pieces[0]
    assert text_times[0] < final_at - 0.5  # the model was still streaming for ~1 s
    # consecutive indexes; the final text is exactly what was streamed
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert "".join(c.content for c in chunks) == final_of(events) == LONG


async def test_zero_keeps_one_event_per_model_chunk(
    client: httpx.AsyncClient, graphs: tuple[GraphProcess, GraphProcess], llm_server: ScriptedLLMServer
) -> None:
    llm_server.push(TextResponse(LONG[:250], chunks=50, delay=0.002))
    events = [e for _, e in await timed_ask(client, graphs[1])]
    chunks = chunks_of(events)
    assert [c.content for c in chunks] == split_text(LONG[:250], 50)
    assert [c.chunk_index for c in chunks] == list(range(50))
    assert final_of(events) == LONG[:250]


#: A combining accent, a ZWJ emoji sequence, a flag (two regional indicators), a skin tone.
INTL = "Cafe\u0301 👩\u200d💻 naïve 🇫🇷 👍🏽 ok"


@pytest.mark.parametrize("which", [0, 1], ids=["coalesced", "per-chunk"])
async def test_text_cut_inside_characters_arrives_whole(
    client: httpx.AsyncClient,
    graphs: tuple[GraphProcess, GraphProcess],
    llm_server: ScriptedLLMServer,
    which: int,
) -> None:
    # cut between e and its accent, inside the ZWJ sequence, between the flag's letters and
    # between the thumb and its skin tone
    cuts = (4, 7, 8, 9, 16, 17, 19, 20)
    assert [INTL[c - 1 : c + 1] for c in cuts[:1]] == ["e\u0301"]
    llm_server.push(TextResponse(INTL, split_at=cuts, delay=0.004))
    events = [e for _, e in await timed_ask(client, graphs[which])]
    streamed = "".join(c.content for c in chunks_of(events))
    assert streamed == final_of(events) == INTL
    assert "\ufffd" not in streamed
    assert streamed.encode("utf-8").decode("utf-8") == INTL  # valid UTF-8 on the wire, no lone halves


async def test_a_think_block_split_across_windows_is_never_shown(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    content = "<think>the secret plan, step by step</think>\n\nThe visible answer, in parts."
    cuts = (3, 9, 14, 20, 30, 38, 41, 44, 50, 60, 70)  # inside both tags and the block
    llm_server.push(TextResponse(content, split_at=cuts, delay=0.03))  # ~ one piece per window
    events = [e for _, e in await timed_ask(client, graph)]
    chunks = chunks_of(events)
    streamed = "".join(c.content for c in chunks)
    assert streamed == final_of(events) == "The visible answer, in parts."
    assert not any("secret" in c.content or "think" in c.content or "<" in c.content for c in chunks)
    progress = [i for i, e in enumerate(events) if isinstance(e, Progress) and e.content == THINKING_STATUS]
    assert len(progress) == 1 and progress[0] < events.index(chunks[0])  # "thinking…" once, first


async def test_a_tool_call_mid_window_sends_the_text_before_it_and_the_confirmation_works(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    db = graph.data_dir / "records.db"
    add_old_record(db)
    said = "Let me look at the old records first, then I will ask you. "
    # all in one write: the first word goes at once, the tool call arrives while the rest waits
    llm_server.push_tool_calls([("delete_records", {"older_than": CUTOFF})], content=said)
    sid = new_session()
    body = message_body(sid, "delete the old records", ac())
    asked = await post_sse(client, f"{graph.url}{PM}", body, graph.headers)
    chunks = chunks_of(asked)
    [question] = [e for e in asked if isinstance(e, HitlRequest)]
    assert "".join(c.content for c in chunks) == said  # all of it, before the question
    assert asked.index(question) > asked.index(chunks[-1])
    assert older(db) > 0  # nothing deleted before the yes
    llm_server.push_text("Deleted them.")
    answer = {"session_id": sid.format(), "response": "yes", "interrupt_id": question.interrupt_id}
    done = await post_sse(client, f"{graph.url}{FB}", answer, graph.headers)
    assert final_of(done) == "Deleted them."
    assert "".join(c.content for c in chunks_of(done)) == "Deleted them."
    assert older(db) == 0


async def counted(redis: Redis, user: str, tenant: str) -> tuple[int, int, int]:
    """The (tenant, user) usage row once its one call is recorded (a stopped run is charged
    by its own task, a moment after the client left)."""
    day = redis_keys.usage_day(usage_day().isoformat())
    fields = [f"r|{tenant}|{user}|in", f"r|{tenant}|{user}|out", f"r|{tenant}|{user}|calls"]
    for _ in range(200):
        found = [int(v or 0) for v in await redis.hmget(day, fields)]
        if found[2] >= 1:
            break
        await asyncio.sleep(0.05)
    inp, out, calls = found
    return inp, out, calls


async def trace_of(c: httpx.AsyncClient, graph: GraphProcess, turn_id: str) -> TurnTrace:
    """The turn's stored trace (stored at the end of the request, a stopped one too)."""
    for _ in range(100):
        r = await c.get(f"{graph.url}/admin/v1/traces/{turn_id}", headers=ADMIN_AUTH)
        if r.status_code == 200:
            return TurnTrace.model_validate(r.json())
        await asyncio.sleep(0.05)
    raise AssertionError(f"no trace for {turn_id}")


async def test_a_stop_mid_window_ends_the_turn_cancelled_and_charges_what_was_streamed(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    user, tenant = f"@stop{time.time_ns()}:localhost", f"t{time.time_ns()}"
    answer = "word " * 400
    llm_server.push_text(answer, delay=0.01)  # 4 or 5 words per 40 ms window
    seen, turn_id, events = "", "", 0
    body = message_body(new_session(user), "tell me a long story", ac(user, domain=tenant))
    async with aconnect_sse(client, "POST", f"{graph.url}{PM}", json=body, headers=graph.headers) as src:
        async for sse in src.aiter_sse():
            event = parse_sse_event(sse.event, sse.data)
            if isinstance(event, TurnStarted):
                turn_id = event.turn_id
            if isinstance(event, TextChunk):
                seen += event.content
                events += 1
            if events >= 3:
                break  # `!stop`: the bot closes the stream, mid-window
    assert await asyncio.to_thread(llm_server.wait_for_streams, disconnected=1, timeout=10)
    assert llm_server.completed_streams == 0
    redis = Redis.from_url(redis_url)
    try:
        inp, out, calls = await counted(redis, user, tenant)
    finally:
        await redis.aclose()
    assert calls == 1 and inp > 0
    # what the model streamed (at least what the client saw), not the whole answer
    assert streamed_tokens(len(seen)) <= out < streamed_tokens(len(answer))
    trace = await trace_of(client, graph, turn_id)
    assert trace.outcome == "cancelled"
    assert trace.first_token_ms is not None  # the first text reached the stream, and is timed


async def test_the_trace_times_the_first_token(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push(TextResponse(LONG[:100], chunks=20, delay=0.01))
    body = message_body(new_session(), "hi", ac())
    events = await post_sse(client, f"{graph.url}{PM}", body, graph.headers, keep_turn=True)
    [turn] = [e for e in events if isinstance(e, TurnStarted)]
    trace = await trace_of(client, graph, turn.turn_id)
    assert trace.outcome == "answered" and trace.first_token_ms is not None
    [call] = trace.llm_calls
    assert call.first_token_ms is not None and call.first_token_ms <= call.duration_ms
    assert trace.first_token_ms < trace.total_ms - 100  # the first text, not the end (~200 ms later)
