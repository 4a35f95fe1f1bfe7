"""Pick the chat model: any OpenAI-compatible endpoint, else the offline model."""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel

from vagent_graph.agent import AgentDescriptor
from vagent_graph.offline_model import OfflineChatModel
from vagent_shared.settings import GraphSettings

DEFAULT_MODEL = "gpt-4o-mini"


def model_name(settings: GraphSettings, agent: AgentDescriptor) -> str:
    """LLM_MODEL (operations) wins over the descriptor's model."""
    return settings.LLM_MODEL or agent.model or DEFAULT_MODEL


def make_chat_model(settings: GraphSettings, agent: AgentDescriptor) -> BaseChatModel:
    """ChatOpenAI when OPENAI_BASE_URL or OPENAI_API_KEY is set (OpenAI, Ollama, vLLM,
    llama.cpp, LM Studio...), otherwise the deterministic offline model."""
    if not (settings.OPENAI_BASE_URL or settings.OPENAI_API_KEY):
        return OfflineChatModel()
    from langchain_openai import ChatOpenAI
    from openai import DefaultAsyncHttpxClient

    from vagent_graph import upstream
    from vagent_graph.openai_plain import PlainChatCompletions

    key = settings.OPENAI_API_KEY.get_secret_value() if settings.OPENAI_API_KEY else "not-needed"
    chat = ChatOpenAI(
        model=model_name(settings, agent),
        base_url=settings.OPENAI_BASE_URL,
        api_key=key,  # type: ignore[arg-type]
        temperature=agent.temperature,
        streaming=True,
        stream_usage=True,
        timeout=settings.LLM_TIMEOUT_SECONDS,
        max_retries=1,
        # The SDK's default client (env proxies honoured), plus the hook that tells a run
        # when its request has left (upstream.py). Without langchain-openai's TCP
        # keep-alive socket options: LLM_TIMEOUT_SECONDS bounds a call to a dead peer.
        http_async_client=DefaultAsyncHttpxClient(
            timeout=settings.LLM_TIMEOUT_SECONDS, event_hooks={"request": [upstream.trace_request]}
        ),
    )
    # Same client, minus the SDK's per-request walk over every message (see openai_plain).
    # Set after construction: validate_environment builds root_async_client only when no
    # async_client is given, and ChatOpenAI does not validate assignments.
    chat.async_client = PlainChatCompletions(chat.root_async_client)
    return chat
