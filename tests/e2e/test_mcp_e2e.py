"""An MCP tool end to end in Matrix: in a group room alice asks the bot to book an event; the
question (every argument shown) comes in her thread; bob's ✅ does nothing; alice's ✅ runs the
call once, with alice's own calendar key, on the real demo calendar MCP server."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from procutil import free_port

from tests.e2e.conftest import Stack, down
from tests.e2e.test_bot_e2e import group
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from tests.support.procs import ROOT, ServiceProcess, credential_registry

pytestmark = pytest.mark.e2e

CREATE = "calendar__create_event"


class Calendar:
    """The demo calendar and a Credential Registry holding alice's and bob's calendar keys,
    and a graph whose agent lists the calendar (deploy/dev/agent.yaml)."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        u = stack.users
        self.keys = {
            u.alice: f"e2e-cal-alice-{secrets.token_hex(8)}",
            u.bob: f"e2e-cal-bob-{secrets.token_hex(8)}",
        }
        (tmp / "calendar.yaml").write_text(
            yaml.safe_dump(
                {"keys": {k: who for who, k in self.keys.items()}, "events": {u.alice: [], u.bob: []}}
            )
        )
        policy = {
            "domains": {"localhost": {"resources": {"mcp:calendar": {"type": "api_key", "users": self.keys}}}}
        }
        (tmp / "credentials.yaml").write_text(yaml.safe_dump(policy))
        cal_port = free_port()
        self.url = f"http://127.0.0.1:{cal_port}"
        self.server = ServiceProcess(
            "vagent-calendar",
            {
                "CALENDAR_PORT": str(cal_port),
                "CALENDAR_SEED_FILE": str(tmp / "calendar.yaml"),
                "CALENDAR_DB_PATH": str(tmp / "calendar.db"),
            },
            tmp / "calendar.log",
            f"{self.url}/health",
        )
        self.registry = credential_registry(tmp, tmp / "credentials.yaml", log_name="registry.log")
        self.graph = GraphProcess(
            stack.redis_url,
            tmp / "graph",
            stack.llm.base_url,
            AGENT_DESCRIPTOR=str(ROOT / "deploy/dev/agent.yaml"),
            CALENDAR_MCP_URL=f"{self.url}/mcp",
            CREDENTIAL_REGISTRY_URL=self.registry.base_url,
        )

    def start(self) -> Calendar:
        self.server.start()
        self.registry.start()
        self.graph.start()
        return self

    def stop(self) -> None:
        for p in (self.graph, self.registry, self.server):
            p.stop()

    async def created(self) -> list[dict[str, object]]:
        async with httpx.AsyncClient(timeout=10) as c:
            entries = (await c.get(f"{self.url}/debug/requests")).json()["requests"]
        return [e for e in entries if e["tool"] == "create_event"]


@pytest.fixture
def calendar(stack: Stack, tmp_path: Path) -> Iterator[Calendar]:
    cal = Calendar(stack, tmp_path).start()
    try:
        yield cal
    finally:
        cal.stop()


async def test_alice_books_in_her_thread_and_only_her_reaction_runs_it_once(
    stack: Stack, calendar: Calendar, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    u = stack.users
    args = {
        "title": "Design review",
        "start": "2026-12-01T10:00",
        "end": "2026-12-01T11:00",
        "attendees": [u.bob],
    }
    with down(stack.main_bot), stack.another_bot("mcp", GRAPH_API_ENDPOINT=calendar.graph.url):
        room = await group(alice, stack, "calendar")
        root = await alice.send(room, "planning the review")
        llm.push_tool_calls([(CREATE, args)])
        await alice.send(room, "!ai book a design review with bob on 2026-12-01 at 10:00", thread_root=root)
        q = await alice.wait_for_reply(u.bot, room, lambda m: m.body.startswith("❓"))
        assert q.thread_root == root
        assert q.body.startswith("❓ Book a calendar event (calendar server), in your name? (yes/no)"), q.body
        assert CREATE not in q.body  # the internal name is for the trace, not the question
        for shown in ("Design review", "2026-12-01T10:00", "2026-12-01T11:00", u.bob):
            assert shown in q.body, shown
        assert await calendar.created() == []

        await bob.react(room, q.event_id, "✅")  # not his question
        await asyncio.sleep(2)
        assert await calendar.created() == []

        llm.push_text("Booked the design review.")
        await alice.react(room, q.event_id, "✅")
        done = await alice.wait_for_reply(u.bot, room, lambda m: m.body == "Booked the design review.")
        assert done.thread_root == root
        await alice.react(room, q.event_id, "👍")  # a second yes runs nothing
        await asyncio.sleep(2)
    created = await calendar.created()
    assert [(e["owner"], e["outcome"]) for e in created] == [(u.alice, "ok")]
    tool_msgs = [m for r in llm.requests for m in r["messages"] if m["role"] == "tool"]
    assert any("Design review" in str(m["content"]) for m in tool_msgs)
