"""Property: whatever concurrent turns of one user do on two replicas (answer, stop midway,
break off midway, be refused and retried by the SDK), the budgets count every attempt that
reached the provider, and pass the limit by less than one call's estimate.

Real parts: the real Redis (the reservation's Lua, the charging MULTI), the real `Usage`
and `Meter`, two `Usage` instances on two connections (two replicas). The provider is
hypothesis': each call drives the hooks the HTTP client and the stream drive in the service
(usage.on_request / on_response / on_chunk, as lean_openai wires them), and a stop is a
real cancellation of the turn's task, arriving while the answer streams.

What hypothesis may not do (the bound's stated assumptions, docs/budgets.md): a provider
counting more prompt tokens than the estimate, or an answer longer than OUTPUT_ALLOWANCE.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage
from redis.asyncio import Redis

from vagent_graph.observability.budgets import Budgets
from vagent_graph.observability.usage import (
    OUTPUT_ALLOWANCE,
    BudgetSpent,
    Refusal,
    Usage,
    on_chunk,
    on_request,
    on_response,
    streamed_tokens,
)
from vagent_shared import redis_keys
from vagent_shared.budgets import usage_day

REQUEST = httpx.Request("POST", "http://llm.invalid/v1/chat/completions")
Ending = Literal["answered", "stopped", "broken"]


@dataclass(frozen=True)
class CallPlan:
    """One LLM call as the provider will play it."""

    sent: int  # the prompt's estimate (messages and tool schemas)
    refused: int  # attempts answered 500 before the last one (the SDK retries them)
    chunks: tuple[int, ...]  # characters of each streamed delta
    ending: Ending
    at: int  # deltas streamed before the stop or the break
    reports: bool  # an answered stream ends with a usage block
    usage_in: int  # ... reporting these (at most the estimate: the bound's assumption)
    usage_out: int


@dataclass(frozen=True)
class Case:
    limit: int
    tenant_limit: int | None
    earlier: int  # spent before these turns, today
    turns: tuple[tuple[CallPlan, ...], ...]

    @property
    def effective(self) -> int:
        return self.limit if self.tenant_limit is None else min(self.limit, self.tenant_limit)

    @property
    def one_call(self) -> int:
        """The most one attempt is held for (and, within the assumptions, charged)."""
        return max(p.sent + OUTPUT_ALLOWANCE for turn in self.turns for p in turn)


@st.composite
def plans(draw: st.DrawFn) -> CallPlan:
    sent = draw(st.integers(10, 4000))
    chunks = tuple(draw(st.lists(st.integers(1, 200), max_size=10)))  # <= 4 x OUTPUT_ALLOWANCE chars
    return CallPlan(
        sent=sent,
        refused=draw(st.integers(0, 2)),
        chunks=chunks,
        ending=draw(st.sampled_from(["answered", "answered", "stopped", "broken"])),
        at=draw(st.integers(0, len(chunks))),
        reports=draw(st.booleans()),
        usage_in=draw(st.integers(0, sent)),
        usage_out=draw(st.integers(0, OUTPUT_ALLOWANCE)),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    limit = draw(st.integers(500, 25_000))
    return Case(
        limit=limit,
        tenant_limit=draw(st.none() | st.integers(500, 25_000)),
        earlier=draw(st.integers(0, limit + 1000)),
        turns=tuple(
            draw(st.lists(st.lists(plans(), min_size=1, max_size=3).map(tuple), min_size=1, max_size=6))
        ),
    )


async def play(plan: CallPlan, happened: list[int]) -> AIMessage:
    """The provider's side of one call; `happened` gets what each attempt that reached it
    cost (its reported usage, else the prompt plus what was streamed before it ended)."""
    for _ in range(plan.refused):
        await on_request(REQUEST)
        await on_response(httpx.Response(500, request=REQUEST))
        happened.append(plan.sent)
        await asyncio.sleep(0)
    await on_request(REQUEST)  # a retry may be refused here (BudgetSpent): not sent
    await on_response(httpx.Response(200, request=REQUEST))
    chars = 0
    for i, n in enumerate(plan.chunks):
        if plan.ending != "answered" and i == plan.at:
            break
        on_chunk({"choices": [{"index": 0, "delta": {"content": "x" * n}}]})
        chars += n
        await asyncio.sleep(0)
    if plan.ending == "answered" and plan.reports:
        on_chunk(
            {"choices": [], "usage": {"prompt_tokens": plan.usage_in, "completion_tokens": plan.usage_out}}
        )
        happened.append(plan.usage_in + plan.usage_out)
        usage = {
            "input_tokens": plan.usage_in,
            "output_tokens": plan.usage_out,
            "total_tokens": plan.usage_in + plan.usage_out,
        }
        return AIMessage(content="x" * chars, usage_metadata=usage)  # type: ignore[arg-type]
    happened.append(plan.sent + streamed_tokens(chars))
    if plan.ending == "answered":
        return AIMessage(content="x" * chars)
    if plan.ending == "broken":
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
    task = asyncio.current_task()
    assert task is not None
    task.cancel()  # `!stop` / the client went away: the run's task is cancelled mid-stream
    await asyncio.sleep(0)
    raise AssertionError("the stop did not cancel the call")


async def turn(
    usage: Usage, user: str, tenant: str, calls: tuple[CallPlan, ...], happened: list[int]
) -> None:
    """A turn as the workflow runs it: each call held for, then metered; it ends at a refusal,
    a failure or a stop."""
    try:
        for plan in calls:
            hold = await usage.reserve(user, tenant, plan.sent + OUTPUT_ALLOWANCE)
            if isinstance(hold, Refusal):
                return
            await usage.metered(hold, "m", plan.sent, functools.partial(play, plan, happened))
    except (BudgetSpent, httpx.RemoteProtocolError):
        return
    except asyncio.CancelledError:
        return


@dataclass
class Replicas:
    redis: Redis
    other: Redis
    path: Path


@pytest.fixture(scope="module")
async def replicas(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Replicas]:
    redis, other = Redis.from_url(redis_url), Redis.from_url(redis_url)
    try:
        yield Replicas(redis, other, tmp_path_factory.mktemp("budget-properties") / "budgets.yaml")
    finally:
        await redis.aclose()
        await other.aclose()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases())
async def test_concurrent_turns_stops_and_retries_stay_within_one_call_and_all_is_counted(
    replicas: Replicas, case: Case
) -> None:
    tag = uuid.uuid4().hex[:10]
    user, tenant = f"@{tag}:localhost", f"t{tag}"
    policy: dict[str, object] = {"users": {user: {"daily_tokens": case.limit}}}
    if case.tenant_limit is not None:
        policy["tenants"] = {tenant: {"daily_tokens": case.tenant_limit}}
    replicas.path.write_text(yaml.safe_dump(policy))
    budgets = Budgets(replicas.path)  # read now
    a, b = Usage(replicas.redis, budgets, 60), Usage(replicas.other, budgets, 60)
    day = redis_keys.usage_day(usage_day().isoformat())
    await replicas.redis.hset(day, mapping={f"u|{user}|in": case.earlier, f"t|{tenant}|in": case.earlier})

    happened: list[int] = []
    await asyncio.gather(
        *(turn((a, b)[i % 2], user, tenant, calls, happened) for i, calls in enumerate(case.turns)),
        return_exceptions=False,
    )

    found = await replicas.redis.hmget(
        day,
        [f"u|{user}|in", f"u|{user}|out", f"t|{tenant}|in", f"t|{tenant}|out", f"r|{tenant}|{user}|calls"],
    )
    user_used, tenant_used = int(found[0] or 0) + int(found[1] or 0), int(found[2] or 0) + int(found[3] or 0)
    assert user_used == tenant_used
    # spend that happened is never left uncounted (each attempt that reached the provider)
    assert user_used - case.earlier >= sum(happened)
    assert int(found[4] or 0) == len(happened)
    # ... and the limit is passed by less than one call's estimate
    if case.earlier >= case.effective:
        assert user_used == case.earlier and happened == []  # nothing was sent at all
    else:
        assert user_used < case.effective + case.one_call
    for key in (redis_keys.usage_held(f"u|{user}"), redis_keys.usage_held(f"t|{tenant}")):
        assert await replicas.redis.zcard(key) == 0  # no hold outlives its call
