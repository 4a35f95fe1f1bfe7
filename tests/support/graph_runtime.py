"""The graph's resources as the service opens them (open_resources, make_chat_model), on a
scripted LLM: for tests that drive runs in-process against real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.models.llm import make_chat_model
from vagent_graph.resources import Resources, open_resources
from vagent_graph.tools.catalogue import default_registry
from vagent_shared.settings import GraphSettings


@asynccontextmanager
async def scripted_runtime(redis_url: str, llm_base_url: str, data_dir: Path) -> AsyncIterator[Resources]:
    settings = GraphSettings(
        REDIS_URL=redis_url,
        RECORDS_DB_PATH=data_dir / "records.db",
        OPENAI_BASE_URL=llm_base_url,
        OPENAI_API_KEY="k",
        LLM_MODEL="m",
        GRAPH_INSECURE_DEV=True,
    )
    agent = load_descriptor(settings.AGENT_DESCRIPTOR)
    async with open_resources(
        settings, agent, default_registry(), make_chat_model(settings, agent), "m"
    ) as rt:
        yield rt
