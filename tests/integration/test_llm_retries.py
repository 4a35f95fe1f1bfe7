"""The service's chat model (llm.make_chat_model: ChatOpenAI whose chat.completions is
lean_openai's, on the SDK's own client): the openai SDK retries a failed request itself, as
often as LLM_MAX_RETRIES says, and its errors reach the user as short error events. Against
the scripted OpenAI-compatible server."""

from __future__ import annotations

import openai
import pytest
from langchain_core.language_models import BaseChatModel

from tests.support.llm_server import ScriptedLLMServer
from vagent_graph.agent import load_descriptor
from vagent_graph.event_stream import error_event_for
from vagent_graph.llm import make_chat_model
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
