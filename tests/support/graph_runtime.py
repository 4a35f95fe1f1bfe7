"""The graph's runtime as the service builds it (open_runtime, make_chat_model), on a
scripted LLM: for tests that drive runs in-process against real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from vagent_graph.agent import load_descriptor
from vagent_graph.llm import make_chat_model
from vagent_graph.runtime import Runtime, open_runtime
from vagent_graph.tools import default_registry
from vagent_shared.settings import GraphSettings


@asynccontextmanager
async def scripted_runtime(redis_url: str, llm_base_url: str, data_dir: Path) -> AsyncIterator[Runtime]:
    settings = GraphSettings(
        REDIS_URL=redis_url,
        RECORDS_DB_PATH=data_dir / "records.db",
        OPENAI_BASE_URL=llm_base_url,
        OPENAI_API_KEY="k",
        LLM_MODEL="m",
        GRAPH_INSECURE_DEV=True,
    )
    agent = load_descriptor(settings.AGENT_DESCRIPTOR)
    async with open_runtime(settings, agent, default_registry(), make_chat_model(settings, agent), "m") as rt:
        yield rt
