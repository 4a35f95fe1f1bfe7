"""Pick the chat model: any OpenAI-compatible endpoint, else the offline model."""

from __future__ import annotations

import httpx2
from langchain_core.language_models import BaseChatModel

from vagent_graph.agents.descriptor import AgentDescriptor
from vagent_graph.models.offline_model import OfflineChatModel
from vagent_graph.models.stall_guard import on_attempt
from vagent_graph.observability.usage import on_request, on_response
from vagent_shared.settings import GraphSettings

DEFAULT_MODEL = "gpt-4o-mini"


def model_name(settings: GraphSettings, agent: AgentDescriptor) -> str:
    """LLM_MODEL (operations) wins over the descriptor's model."""
    return settings.LLM_MODEL or agent.model or DEFAULT_MODEL


def metered_http_client() -> httpx2.AsyncClient:
    """The SDK's aiohttp client (its timeouts, pool limits, redirects; read_pacing.py) with
    usage.py's event hooks: every attempt the SDK sends, its retries included, is held for
    before it goes and charged once answered (docs/budgets.md). Each attempt also restarts the
    stall guard's wait for the first chunk (stall_guard.py). Outside a call they do nothing."""
    from vagent_graph.models.read_pacing import model_http_client

    hooks = {"request": [on_request, on_attempt], "response": [on_response, on_attempt]}
    return model_http_client(event_hooks=hooks)


async def close_model_client(llm: BaseChatModel) -> None:
    """Close the chat model's HTTP client (its aiohttp session and connections), once the
    process is done with it: aiohttp warns of a session collected unclosed."""
    client = getattr(llm, "http_async_client", None)  # the offline model has none
    if isinstance(client, httpx2.AsyncClient) and not client.is_closed:
        await client.aclose()


def stall_limit(llm: BaseChatModel) -> float | None:
    """How long a streamed call of `llm` may go without a chunk (stall_guard.py): its request
    timeout, LLM_TIMEOUT_SECONDS (make_chat_model); None for the offline model."""
    timeout = getattr(llm, "request_timeout", None)
    return float(timeout) if isinstance(timeout, int | float) and timeout > 0 else None


def make_chat_model(settings: GraphSettings, agent: AgentDescriptor) -> BaseChatModel:
    """ChatOpenAI when OPENAI_BASE_URL or OPENAI_API_KEY is set (OpenAI, Ollama, vLLM,
    llama.cpp, LM Studio...), otherwise the deterministic offline model."""
    if not (settings.OPENAI_BASE_URL or settings.OPENAI_API_KEY):
        return OfflineChatModel()
    from vagent_graph.models.lean_openai import PlainChatCompletions
    from vagent_graph.models.lean_stream import LeanStreamChatOpenAI

    key = settings.OPENAI_API_KEY.get_secret_value() if settings.OPENAI_API_KEY else "not-needed"
    # ChatOpenAI, noting reasoning deltas (reasoning.py), whose streamed answer reaches the
    # model node's AnswerStream as deltas and LangChain as one chunk (lean_stream.py)
    chat = LeanStreamChatOpenAI(
        model=model_name(settings, agent),
        base_url=settings.OPENAI_BASE_URL,
        api_key=key,  # type: ignore[arg-type]
        temperature=agent.temperature,
        streaming=True,
        stream_usage=True,
        timeout=settings.LLM_TIMEOUT_SECONDS,
        # No wait_for per chunk (~25% of the call's CPU): the model node's one StallGuard per
        # call ends a call silent for LLM_TIMEOUT_SECONDS instead (stall_guard.py).
        stream_chunk_timeout=None,
        # The SDK's own retries: 408/409/429/5xx and connection errors, with backoff, only
        # before a response arrives (a stream that fails midway is not retried). Each attempt
        # is held for and charged to the budgets (metered_http_client).
        max_retries=settings.LLM_MAX_RETRIES,
        http_async_client=metered_http_client(),
    )
    # The same SDK client (its request, retry and timeout machinery), minus the pydantic
    # model it builds per streamed chunk and its per-request walk over every message:
    # ~45% more conversations per core (lean_openai's docstring, bench/README.md).
    # Set after construction: validate_environment builds root_async_client only when no
    # async_client is given, and ChatOpenAI does not validate assignments.
    chat.async_client = PlainChatCompletions(chat.root_async_client)
    return chat
