"""The service's chat model (llm.make_chat_model: ChatOpenAI whose chat.completions is
lean_openai's, on the SDK's own client): the openai SDK retries a failed request itself, as
often as LLM_MAX_RETRIES says, and its errors reach the user as short error events. Each
attempt it sends is charged to the budgets (usage.Usage.metered, on the real Redis), and a
retry the budget cannot hold is never sent. Against the scripted OpenAI-compatible server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import yaml
from langchain_core.language_models import BaseChatModel
from redis.asyncio import Redis

from tests.support.llm_server import ScriptedLLMServer, _prompt_tokens
from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.models.llm import close_model_client, make_chat_model
from vagent_graph.models.offline_model import OfflineChatModel
from vagent_graph.observability.budgets import Budgets
from vagent_graph.observability.usage import OUTPUT_ALLOWANCE, BudgetSpent, Hold, Usage
from vagent_graph.resources import open_resources
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.turn.events import error_event_for
from vagent_shared import redis_keys
from vagent_shared.budgets import usage_day
from vagent_shared.settings import GraphSettings


def chat_model(llm_server: ScriptedLLMServer, **settings: object) -> BaseChatModel:
    config = GraphSettings(
        OPENAI_BASE_URL=llm_server.base_url,
        OPENAI_API_KEY="k",
        LLM_MODEL="m",
        **settings,  # type: ignore[arg-type]
    )
    return make_chat_model(config, load_descriptor())


def test_the_default_is_the_sdks_own_retry_count() -> None:
    assert GraphSettings().LLM_MAX_RETRIES == openai.DEFAULT_MAX_RETRIES == 2


async def test_a_failed_request_is_retried_by_the_sdk(llm_server: ScriptedLLMServer) -> None:
    llm_server.push_error(500, "flaky")
    llm_server.push_text("recovered")
    model = chat_model(llm_server, LLM_MAX_RETRIES=1)
    assert (await model.ainvoke("hi")).content == "recovered"
    assert len(llm_server.requests) == 2


@pytest.mark.parametrize(
    ("status", "sdk_error", "code"),
    [(429, openai.RateLimitError, "llm_rate_limited"), (500, openai.InternalServerError, "llm_unavailable")],
)
async def test_errors_after_the_last_retry_keep_their_type_and_read_clearly(
    llm_server: ScriptedLLMServer, status: int, sdk_error: type[openai.APIStatusError], code: str
) -> None:
    llm_server.push_error(status, "scripted")
    model = chat_model(llm_server, LLM_MAX_RETRIES=0)
    with pytest.raises(sdk_error) as caught:
        await model.ainvoke("hi")
    assert len(llm_server.requests) == 1  # no retry with LLM_MAX_RETRIES=0
    assert error_event_for(caught.value).error_code == code


# ---- each attempt is charged ---------------------------------------------------------------------

SENT = 100  # what the workflow estimates the prompt at (usage.prompt_tokens)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def someone() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"@{tag}:localhost", f"t{tag}"


async def row(redis: Redis, user: str, tenant: str) -> tuple[int, int, int]:
    """The (tenant, user) row's tokens in, out and calls today."""
    day = redis_keys.usage_day(usage_day().isoformat())
    found = await redis.hmget(day, [f"r|{tenant}|{user}|{what}" for what in ("in", "out", "calls")])
    return int(found[0] or 0), int(found[1] or 0), int(found[2] or 0)


async def test_each_attempt_the_sdk_sends_is_charged(llm_server: ScriptedLLMServer, redis: Redis) -> None:
    user, tenant = someone()
    usage = Usage(redis, Budgets(None), 60)
    llm_server.push_error(500, "flaky", retry_after=0.01)
    llm_server.push_text("recovered")
    model = chat_model(llm_server, LLM_MAX_RETRIES=1)
    hold = await usage.reserve(user, tenant, SENT + OUTPUT_ALLOWANCE)
    assert isinstance(hold, Hold)
    ai = await usage.metered(hold, "m", SENT, lambda: model.ainvoke("hi"))
    assert ai.content == "recovered"
    _refused, answered = llm_server.requests
    # the refused attempt at the prompt's estimate, the answered one as the provider reported it
    assert await row(redis, user, tenant) == (SENT + _prompt_tokens(answered), 1, 2)


async def test_a_retry_the_budget_cannot_hold_is_never_sent(
    llm_server: ScriptedLLMServer, redis: Redis, tmp_path: Path
) -> None:
    user, tenant = someone()
    (tmp_path / "budgets.yaml").write_text(yaml.safe_dump({"users": {user: {"daily_tokens": SENT * 2}}}))
    usage = Usage(redis, Budgets(tmp_path / "budgets.yaml"), 60)
    llm_server.push_error(500, "flaky", retry_after=0.01)
    llm_server.push_text("never sent")
    model = chat_model(llm_server, LLM_MAX_RETRIES=2)
    hold = await usage.reserve(user, tenant, SENT + OUTPUT_ALLOWANCE)  # nothing used yet: held
    assert isinstance(hold, Hold)
    with pytest.raises(BudgetSpent) as spent:
        await usage.metered(hold, "m", SENT, lambda: model.ainvoke("hi"))
    assert (spent.value.refusal.scope, spent.value.refusal.limit) == ("user", SENT * 2)
    assert len(llm_server.requests) == 1 and llm_server.pending == 1  # the retry stayed unsent
    assert await row(redis, user, tenant) == (SENT, 0, 1)  # the refused attempt is charged
    assert await redis.zcard(redis_keys.usage_held(f"u|{user}")) == 0  # and its holds are freed


async def test_the_services_resources_close_the_model_client(
    llm_server: ScriptedLLMServer, redis_url: str, tmp_path: Path
) -> None:
    """The model's client (an aiohttp session and its connections) ends with the service's
    resources; the offline model has none to close."""
    llm_server.push_text("hello")
    model = chat_model(llm_server)
    settings = GraphSettings(
        REDIS_URL=redis_url, RECORDS_DB_PATH=tmp_path / "records.db", GRAPH_INSECURE_DEV=True
    )
    async with open_resources(settings, load_descriptor(), default_registry(), model, "m"):
        assert (await model.ainvoke("hi")).content == "hello"
        assert not model.http_async_client.is_closed  # type: ignore[attr-defined]
    assert model.http_async_client.is_closed  # type: ignore[attr-defined]
    await close_model_client(OfflineChatModel())
