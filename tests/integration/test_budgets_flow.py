"""Token usage and budgets through two real graph replicas on one real Redis, a real
BUDGETS_FILE and the scripted LLM (docs/budgets.md).

Concurrent turns of one user on both replicas pass the limit by at most one turn's usage;
over budget no request reaches the LLM and the user reads why (audited `budget_exceeded`);
the 80% notice comes once; edits of the file apply without a restart and a broken edit keeps
the last good policy, logging where it is broken; a pending confirmation can still be
answered "no"; `vagent usage` and `/admin/v1/usage` show the tokens the provider reported.

What is charged (each fails on a version that counted only answers the provider reported):
an answer stopped midway (`!stop`, the client gone) is charged what was streamed; a retry,
the SDK's or the user's after a stream broke off, is charged as one more call; a retry the
budget cannot hold is not sent; a turn offering big tool schemas holds budget for them, so a
concurrent turn the budget cannot hold beside it is refused (in-process: the graph's own
resources with a registry holding such a tool).

Each test has users (and tenants) of its own in the one policy file. "Earlier usage today"
is set straight into the day's counters where a test needs a user near their limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from httpx_sse import aconnect_sse
from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from tests.support.factories import ALL_TOOLS, ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import JSON, PlannedResponse, ScriptedLLMServer, TextResponse, _prompt_tokens
from tests.support.records import CUTOFF, older
from tests.support.sse import post_sse
from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.models.llm import make_chat_model
from vagent_graph.observability.usage import OUTPUT_ALLOWANCE, schema_tokens, streamed_tokens
from vagent_graph.resources import Resources, open_resources
from vagent_graph.tools import Tool, ToolContext
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.turn.events import stream_run
from vagent_graph.workflow.graph import new_turn_input, run_config
from vagent_shared import SessionId, parse_sse_event, redis_keys
from vagent_shared.audit import AuditEvent
from vagent_shared.budgets import UsageRow, usage_day
from vagent_shared.events import Done, ErrorEvent, HitlRequest, SSEEvent, TextChunk, TextFinal
from vagent_shared.settings import GraphSettings

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"
ADMIN = "test-admin-token-budgets"
LIMIT = 100_000
#: A budget with room for one call (any call is held for more than its answer's allowance),
#: not for a retry beside it.
TIGHT = OUTPUT_ALLOWANCE + 1
BIN = Path(sys.executable).parent


@dataclass
class World:
    a: GraphProcess
    b: GraphProcess
    redis: Redis
    path: Path
    tag: str
    stream: str
    policy: dict[str, Any]

    def user(self, name: str) -> str:
        return f"@{self.tag}{name}:localhost"

    def tenant(self, name: str) -> str:
        return f"{self.tag}{name}"

    def write(self, text: str | None = None) -> None:
        self.path.write_text(text if text is not None else yaml.safe_dump(self.policy))

    async def ask(
        self,
        graph: GraphProcess,
        user: str,
        tenant: str,
        text: str = "how are you today?",
        sid: SessionId | None = None,
    ) -> list[SSEEvent]:
        async with httpx.AsyncClient(base_url=graph.url, timeout=60) as c:
            body = message_body(sid or new_session(user), text, ac(user, domain=tenant))
            return await post_sse(c, PM, body, graph.headers)

    async def used(self, user: str) -> int:
        day = redis_keys.usage_day(usage_day().isoformat())
        found = await self.redis.hmget(day, [f"u|{user}|in", f"u|{user}|out"])
        return sum(int(v or 0) for v in found)

    async def counted(self, user: str, tenant: str, calls: int) -> tuple[int, int, int]:
        """The (tenant, user) row's tokens in and out and calls, once `calls` are recorded (a
        stopped run is charged by its own task, a moment after the client left)."""
        return await counted(self.redis, user, tenant, calls)

    async def spend(self, user: str, tokens: int) -> None:
        """Earlier usage today (as the counters would hold it)."""
        await self.redis.hincrby(redis_keys.usage_day(usage_day().isoformat()), f"u|{user}|in", tokens)

    async def audited(self, event_type: str) -> list[AuditEvent]:
        entries = await self.redis.xrange(self.stream) or []
        events = [AuditEvent.model_validate_json((fields or {})[b"event"]) for _, fields in entries]
        return [e for e in events if e.event_type == event_type]


def final(events: list[SSEEvent]) -> str:
    [text] = [e.content for e in events if isinstance(e, TextFinal)]
    return text


@pytest.fixture(scope="module")
def _world_sync(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GraphProcess, GraphProcess, Path, str, str, dict[str, Any]]]:
    tag = uuid.uuid4().hex[:8]
    data = tmp_path_factory.mktemp("budgets")
    path = data / "budgets.yaml"
    policy: dict[str, Any] = {
        "tenants": {f"{tag}broke": {"daily_tokens": 0}},
        "users": {
            f"@{tag}{name}:localhost": {"daily_tokens": limit}
            for name, limit in {
                "conc": LIMIT,
                "broke": 0,
                "note": LIMIT,
                "deny": LIMIT,
                "tight": TIGHT,
            }.items()
        },
    }
    path.write_text(yaml.safe_dump(policy))
    stream = f"test:audit:{tag}"
    env = {"BUDGETS_FILE": str(path), "GRAPH_ADMIN_TOKEN": ADMIN, "AUDIT_STREAM": stream}
    a = GraphProcess(redis_url, data, _llm_session.base_url, **env)
    b = GraphProcess(redis_url, data, _llm_session.base_url, **env)
    try:
        with ThreadPoolExecutor(2) as starting:  # both at once: half the wait
            list(starting.map(lambda g: g.start(), (a, b)))
        yield a, b, path, tag, stream, policy
    finally:
        a.stop()
        b.stop()


@pytest.fixture
async def world(
    _world_sync: tuple[GraphProcess, GraphProcess, Path, str, str, dict[str, Any]], redis_url: str
) -> AsyncIterator[World]:
    a, b, path, tag, stream, policy = _world_sync
    redis = Redis.from_url(redis_url)
    try:
        yield World(a, b, redis, path, tag, stream, policy)
    finally:
        await redis.aclose()


def slow_answer(request: JSON) -> PlannedResponse:
    return TextResponse("Fine, thank you.", delay=0.15)  # long enough for the turns to overlap


async def test_concurrent_turns_on_two_replicas_pass_the_limit_by_at_most_one_turn(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("conc"), world.tenant("conc")
    llm_server.set_default(slow_answer)
    assert final(await world.ask(world.a, user, tenant)) == "Fine, thank you."
    turn = await world.used(user)  # what one such turn costs, as the provider reported it
    assert turn > 0
    # earlier today: half a turn left before the limit
    await world.spend(user, LIMIT - turn // 2 - turn)

    answered = refused = 0
    for _ in range(3):  # bursts of 4 turns, 2 on each replica, until all are refused
        burst = await asyncio.gather(*(world.ask(g, user, tenant) for g in (world.a, world.b) * 2))
        texts = [final(events) for events in burst]
        answered += sum(t.startswith("Fine, thank you.") for t in texts)
        refused += sum(t.startswith("You have used today's token budget (100,000 tokens)") for t in texts)
        assert answered + refused == 4 * (_ + 1), texts
        if all(t.startswith("You have used") for t in texts):
            break
    total = await world.used(user)
    print(
        f"\nconcurrent turns: one turn {turn} tokens, {answered} answered, {refused} refused, "
        f"{total - LIMIT} over the limit"
    )
    # without the reservation the whole first burst would run: 4 turns for half a turn left
    assert LIMIT <= total <= LIMIT + turn
    assert answered >= 1 and refused >= 4
    assert len(llm_server.requests) == 1 + answered  # a refused turn never reached the LLM


async def test_over_budget_no_request_reaches_the_llm_and_the_user_is_told(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    broke, member = world.user("broke"), world.user("member")
    own = await world.ask(world.a, broke, world.tenant("ok"))
    assert final(own) == "You have used today's token budget (0 tokens). It resets at midnight UTC."
    # the stream's end says so (a scheduled run over budget is recorded as skipped, not ran)
    assert [e.outcome for e in own if isinstance(e, Done)] == ["over_budget"]
    tenants = await world.ask(world.b, member, world.tenant("broke"))  # an unlimited user, a spent tenant
    assert (
        final(tenants)
        == "Your organisation has used today's token budget (0 tokens). It resets at midnight UTC."
    )
    assert llm_server.requests == []

    await asyncio.sleep(0.3)  # the audit trail writes in the background
    refusals = {(e.user_id, e.resource, e.decision, e.domain) for e in await world.audited("budget_exceeded")}
    assert (broke, "budget:user", "denied", world.tenant("ok")) in refusals
    assert (member, "budget:tenant", "denied", world.tenant("broke")) in refusals


async def test_the_80_percent_notice_comes_once_a_day(world: World, llm_server: ScriptedLLMServer) -> None:
    user, tenant = world.user("note"), world.tenant("note")
    await world.spend(user, int(LIMIT * 0.8) - 5)  # just under 80%
    answered = await world.ask(world.a, user, tenant)
    assert final(answered) == "OK\n\nℹ️ You have used 80% of today's token budget."
    assert [e.outcome for e in answered if isinstance(e, Done)] == [None]
    second = final(await world.ask(world.b, user, tenant))  # the other replica knows it was said
    assert second == "OK"
    assert len(llm_server.requests) == 2


async def test_no_to_a_pending_confirmation_still_works_over_budget(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("deny"), world.tenant("deny")
    db = world.a.data_dir / "records.db"
    old = older(db)
    llm_server.push_tool_calls([("delete_records", {"older_than": CUTOFF})])
    sid = new_session(user)
    asked = await world.ask(world.a, user, tenant, "delete the old records", sid)
    [question] = [e for e in asked if isinstance(e, HitlRequest)]
    await world.spend(user, LIMIT)  # meanwhile the budget is spent

    body = {"session_id": sid.format(), "response": "no", "interrupt_id": question.interrupt_id}
    async with httpx.AsyncClient(base_url=world.b.url, timeout=60) as c:
        answer = await post_sse(c, FB, body, world.b.headers)
    assert final(answer) == (
        "I had to stop before finishing: you have used today's token budget (100,000 tokens). "
        "It resets at midnight UTC."
    )
    assert len(llm_server.requests) == 1  # only the call that chose the tool
    assert older(db) == old  # nothing was deleted


async def test_edits_apply_without_a_restart_and_a_broken_file_keeps_the_last_good(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("edit"), world.tenant("edit")
    assert final(await world.ask(world.a, user, tenant)) == "OK"
    world.policy["users"][user] = {"daily_tokens": 0}
    world.write()
    await asyncio.sleep(1.1)  # each replica looks at the file at most once a second
    for g in (world.a, world.b):
        assert final(await world.ask(g, user, tenant)).startswith("You have used today's token budget (0 ")

    try:
        world.write(yaml.safe_dump(world.policy) + "tenants: {acme: [\n")  # a YAML syntax error
        await asyncio.sleep(1.1)
        for g in (world.a, world.b):
            assert final(await world.ask(g, user, tenant)).startswith("You have used today's token budget")
            [problem] = [r for r in g.log_records() if r.get("event") == "budgets_file_invalid"]
            assert problem["budgets_file"] == str(world.path) and problem["kept"] == "the last good policy"
            assert problem["problem"].startswith("not valid YAML: line ")
            assert ", column " in problem["problem"] and problem["level"] == "warning"
    finally:
        del world.policy["users"][user]
        world.write()
    assert len(llm_server.requests) == 1


async def test_vagent_usage_and_the_admin_api_show_the_reported_tokens(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("count"), world.tenant("count")
    await world.ask(world.a, user, tenant)
    await world.ask(world.b, user, tenant)
    assert len(llm_server.requests) == 2
    expected_in = sum(_prompt_tokens(r) for r in llm_server.requests)  # what the stand-in reported
    env = {**os.environ, "REDIS_URL": world.a.env["REDIS_URL"]}

    proc = vagent(env, "--user", user, "--since", "7d", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = [UsageRow.model_validate_json(line) for line in proc.stdout.splitlines()]
    assert (row.day, row.tenant, row.user_id) == (usage_day(), tenant, user)
    assert (row.input_tokens, row.output_tokens, row.llm_calls) == (expected_in, 2, 2)  # "OK": 1 token each
    assert json.loads(proc.stdout)["total_tokens"] == expected_in + 2

    table = vagent(env, "--tenant", tenant)
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["DAY", "(UTC)", "TENANT", "USER"] and len(lines) == 3
    assert lines[1].split()[1:3] == [tenant, "*"] and lines[2].split()[1:3] == [tenant, user]
    assert lines[2].split()[-2:] == [f"{expected_in + 2:,}", "2"]

    async with httpx.AsyncClient(base_url=world.a.url, timeout=30) as c:
        r = await c.get(
            "/admin/v1/usage",
            params={"user": user, "since": "7d"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert r.status_code == 200, r.text
        assert [UsageRow.model_validate(x) for x in r.json()] == [row]
        assert (await c.get("/admin/v1/usage", headers=world.a.headers)).status_code == 401  # the bot's token
        bad = await c.get(
            "/admin/v1/usage", params={"since": "soon"}, headers={"Authorization": f"Bearer {ADMIN}"}
        )
        assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_since"
        metrics = (await c.get("/metrics")).text
    assert f'tenant="{tenant}"' in metrics and "vagent_graph_tenant_tokens_total" in metrics
    assert user not in metrics  # no per-user label


# ---- what is charged: stops, failures, retries, tool schemas ------------------------------------


async def test_a_stopped_answer_is_charged_what_was_streamed(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("stop"), world.tenant("stop")
    answer = "word " * 200
    llm_server.push_text(answer, delay=0.05)
    seen = ""
    async with httpx.AsyncClient(base_url=world.a.url, timeout=60) as c:
        body = message_body(new_session(user), "tell me a long story", ac(user, domain=tenant))
        async with aconnect_sse(c, "POST", PM, json=body, headers=world.a.headers) as src:
            async for sse in src.aiter_sse():
                event = parse_sse_event(sse.event, sse.data)
                if isinstance(event, TextChunk):
                    seen += event.content
                if len(seen) >= 20:
                    break  # `!stop`: the bot closes the stream (so does a client that goes away)
    assert await asyncio.to_thread(llm_server.wait_for_streams, disconnected=1, timeout=10)
    assert llm_server.completed_streams == 0  # no usage block ever came

    inp, out, calls = await world.counted(user, tenant, 1)
    [request] = llm_server.requests
    assert calls == 1
    # what was streamed (at least what the client saw), not the whole answer, and not 0
    assert streamed_tokens(len(seen)) <= out < streamed_tokens(len(answer))
    assert inp > schema_tokens(request["tools"])  # the prompt sent, the offered tools' schemas included


async def test_a_retry_after_a_stream_broken_midway_is_charged_twice(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("broken"), world.tenant("broken")
    llm_server.push_broken_stream("Part of an answer that breaks off", chunks_before=2, how="drop")
    failed = await world.ask(world.a, user, tenant)
    assert [e.error_code for e in failed if isinstance(e, ErrorEvent)] == ["llm_unavailable"]
    assert final(await world.ask(world.b, user, tenant)) == "OK"  # the user asks again

    inp, out, calls = await world.counted(user, tenant, 2)
    first, second = llm_server.requests
    assert calls == 2
    assert out == streamed_tokens(len("Part of ")) + 1  # the two deltas that came, then "OK"
    # the broken attempt's prompt (estimated, with the tools' schemas), then the one reported
    assert inp > schema_tokens(first["tools"]) + _prompt_tokens(second)


async def test_a_retry_the_budget_cannot_hold_is_not_sent(
    world: World, llm_server: ScriptedLLMServer
) -> None:
    user, tenant = world.user("tight"), world.tenant("tight")
    llm_server.push_error(500, "overloaded", retry_after=0.01)  # the SDK would retry it at once
    events = await world.ask(world.a, user, tenant)
    assert (
        final(events) == f"You have used today's token budget ({TIGHT:,} tokens). It resets at midnight UTC."
    )
    assert len(llm_server.requests) == 1  # the retry was never sent

    inp, out, calls = await world.counted(user, tenant, 1)
    assert (
        calls == 1 and out == 0 and inp > schema_tokens(llm_server.requests[0]["tools"])
    )  # the refused attempt
    await asyncio.sleep(0.3)  # the audit trail writes in the background
    [refusal] = [e for e in await world.audited("budget_exceeded") if e.user_id == user]
    assert refusal.reason == "user budget spent: no retry was made" and refusal.resource == "budget:user"


class FormArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


async def _fill(args: FormArgs, ctx: ToolContext, plan: str | None) -> str:
    return "filled"


def form_tool(fields: int) -> Tool:
    """A tool with a schema as big as an MCP server's can be (its own JSON schema)."""
    properties = {
        f"field_{i}": {"type": "string", "description": f"Field {i} of the form, as printed on it."}
        for i in range(fields)
    }
    return Tool(
        name="fill_big_form",
        description="Fill in the big form.",
        args_model=FormArgs,
        run=_fill,
        parameters={"type": "object", "properties": properties},
    )


async def test_a_turn_offering_big_tool_schemas_holds_them_so_a_concurrent_turn_is_refused(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    user, tenant = f"@{tag}form:localhost", f"{tag}form"
    tool = form_tool(800)
    limit = schema_tokens([tool.openai_schema()])  # room for two turns without it, one with it
    assert limit > 15_000
    (tmp_path / "budgets.yaml").write_text(yaml.safe_dump({"users": {user: {"daily_tokens": limit}}}))
    settings = GraphSettings(
        REDIS_URL=redis_url,
        RECORDS_DB_PATH=tmp_path / "records.db",
        OPENAI_BASE_URL=llm_server.base_url,
        OPENAI_API_KEY="k",
        LLM_MODEL="m",
        GRAPH_INSECURE_DEV=True,
        BUDGETS_FILE=tmp_path / "budgets.yaml",
    )
    agent = load_descriptor()
    agent = agent.model_copy(update={"tools": [*agent.tools, tool.name]})
    registry = default_registry()
    registry.register(tool)
    who = ac(user, [*ALL_TOOLS, f"tool:{tool.name}"], domain=tenant)
    llm_server.push_text("Here is the form, filled in.", delay=0.1)

    async def turn(rt: Resources) -> list[SSEEvent]:
        graph_input = new_turn_input("fill in the form", who)
        return [
            e async for e in stream_run(rt.graph, graph_input, run_config(new_session(user).format()), 30)
        ]

    async with open_resources(settings, agent, registry, make_chat_model(settings, agent), "m") as rt:
        first = asyncio.create_task(turn(rt))
        for _ in range(3000):  # until its call is under way (held for, then sent)
            if llm_server.requests:
                break
            await asyncio.sleep(0.01)
        second = await turn(rt)
        assert (
            final(second)
            == f"You have used today's token budget ({limit:,} tokens). It resets at midnight UTC."
        )
        assert final(await first) == "Here is the form, filled in."
    assert len(llm_server.requests) == 1
    assert tool.name in llm_server.offered_tool_names(0)


# ---- helpers -----------------------------------------------------------------------------------


async def counted(redis: Redis, user: str, tenant: str, calls: int) -> tuple[int, int, int]:
    """The (tenant, user) row's (in, out, calls) once `calls` are recorded, or as they are
    after a while (what a version that never records them leaves)."""
    day = redis_keys.usage_day(usage_day().isoformat())
    fields = [f"r|{tenant}|{user}|in", f"r|{tenant}|{user}|out", f"r|{tenant}|{user}|calls"]
    for _ in range(200):
        found = [int(v or 0) for v in await redis.hmget(day, fields)]
        if found[2] >= calls:
            break
        await asyncio.sleep(0.05)
    return found[0], found[1], found[2]


def vagent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "vagent"), "usage", *args], env=env, capture_output=True, text=True, timeout=30
    )
