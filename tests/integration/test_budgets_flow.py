"""Token usage and budgets through two real graph replicas on one real Redis, a real
BUDGETS_FILE and the scripted LLM (docs/budgets.md).

Concurrent turns of one user on both replicas pass the limit by at most one turn's usage;
over budget no request reaches the LLM and the user reads why (audited `budget_exceeded`);
the 80% notice comes once; edits of the file apply without a restart and a broken edit keeps
the last good policy, logging where it is broken; a pending confirmation can still be
answered "no"; `vagent usage` and `/admin/v1/usage` show the tokens the provider reported.

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
from redis.asyncio import Redis

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import JSON, PlannedResponse, ScriptedLLMServer, TextResponse, _prompt_tokens
from tests.support.records import CUTOFF, older
from tests.support.sse import post_sse
from vagent_shared import SessionId, redis_keys
from vagent_shared.audit import AuditEvent
from vagent_shared.budgets import UsageRow, usage_day
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"
ADMIN = "test-admin-token-budgets"
LIMIT = 100_000
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
            for name, limit in {"conc": LIMIT, "broke": 0, "note": LIMIT, "deny": LIMIT}.items()
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
    first = final(await world.ask(world.a, user, tenant))
    assert first == "OK\n\nℹ️ You have used 80% of today's token budget."
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


# ---- helpers -----------------------------------------------------------------------------------


def vagent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "vagent"), "usage", *args], env=env, capture_output=True, text=True, timeout=30
    )

