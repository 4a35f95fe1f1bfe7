"""One trace across both services: alice writes to the bot in Matrix; the bot (its trace
starting at the Matrix event) and a graph both export to a real OTLP receiver, and the
receiver holds ONE trace with the bot's root span, the access check, the graph request, the
graph's server span and its model call, each the child of the one before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, down
from tests.e2e.test_bot_e2e import dm_with_bot
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from tests.support.otlp_receiver import OtlpReceiver, SpanRecord

pytestmark = pytest.mark.e2e

OTEL = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
def traced_graph(stack: Stack, receiver: OtlpReceiver, tmp_path: Path) -> Iterator[GraphProcess]:
    graph = GraphProcess(
        stack.redis_url,
        tmp_path / "graph",
        stack.llm.base_url,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        **OTEL,
    )
    graph.data_dir.mkdir(parents=True, exist_ok=True)
    graph.start()
    try:
        yield graph
    finally:
        graph.stop()


def parent_of(spans: list[SpanRecord], span: SpanRecord) -> SpanRecord:
    return next(s for s in spans if s.span_id == span.parent_id)


async def test_a_matrix_message_is_one_trace_from_the_bot_into_the_graph(
    stack: Stack,
    alice: HumanClient,
    llm: ScriptedLLMServer,
    receiver: OtlpReceiver,
    traced_graph: GraphProcess,
) -> None:
    env = {**OTEL, "GRAPH_API_ENDPOINT": traced_graph.url, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    with down(stack.main_bot), stack.another_bot("bot", **env) as bot:  # the main bot's store
        room = await dm_with_bot(alice, stack)
        llm.push_text("Traced answer.")
        asked = await alice.send(room, "where does this answer come from?")
        await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == "Traced answer.")

        def whole(spans: list[SpanRecord]) -> bool:
            roots = [
                s
                for s in spans
                if s.name == "matrix message" and s.attributes.get("messaging.message.id") == asked
            ]
            if not roots:
                return False
            names = {s.name for s in spans if s.trace_id == roots[0].trace_id}
            return {"access check", "POST /api/v1/process_message", "chat test-model"} <= names

        spans = receiver.wait_for(whole)
        root = next(
            s for s in spans if s.name == "matrix message" and s.attributes["messaging.message.id"] == asked
        )
        trace = [s for s in spans if s.trace_id == root.trace_id]
        assert root.parent_id == "" and root.service == "vagent-bot"
        assert root.attributes["messaging.destination.name"] == room
        access = next(s for s in trace if s.name == "access check")
        assert access.parent_id == root.span_id
        server = next(s for s in trace if s.name == "POST /api/v1/process_message")
        assert server.service == "vagent-graph"
        request = parent_of(trace, server)  # the bot's aiohttp request carried the traceparent
        assert (request.service, request.kind, request.parent_id) == ("vagent-bot", 3, root.span_id)
        chat = next(s for s in trace if s.name == "chat test-model")
        run = parent_of(trace, chat)
        assert run.name == "invoke_agent vagent" and run.parent_id == server.span_id
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
        # no message text on any span (OTEL_CAPTURE_CONTENT is off)
        assert not any("where does this answer" in s.raw or "Traced answer" in s.raw for s in trace)
        assert root.trace_id in bot.logs()  # the bot's log lines of the turn carry its trace id
