"""Nothing is held in the graph process while people think: the checkpointer's key-name memo
(unbounded in langgraph-checkpoint-redis 0.5.x) is bounded by the service (checkpointer.py), and
a session whose names were dropped from it still resumes. Real Redis, the runtime as the
service opens it, the scripted LLM. RSS itself is measured by `make bench-capacity`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from tests.support.factories import ac, new_session
from tests.support.graph_runtime import scripted_runtime
from tests.support.llm_server import ScriptedLLMServer
from vagent_graph.resources import Resources
from vagent_graph.state.checkpointer import KEY_CACHE_MAX, BoundedKeyCache
from vagent_graph.turn.events import durability_for
from vagent_graph.workflow.graph import new_turn_input, run_config


@pytest.fixture
async def runtime(redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path) -> AsyncIterator[Resources]:
    async with scripted_runtime(redis_url, llm_server.base_url, tmp_path) as rt:
        yield rt


async def run(rt: Resources, sid: str, graph_input: Any) -> None:
    async for _ in rt.graph.astream(
        graph_input, run_config(sid), stream_mode="updates", durability=durability_for(graph_input)
    ):
        pass


def test_the_memo_is_emptied_when_full_and_answers_what_was_just_stored() -> None:
    cache: BoundedKeyCache[str, str] = BoundedKeyCache(3)
    for i in range(10):
        cache[f"k{i}"] = f"v{i}"
        assert cache[f"k{i}"] == f"v{i}"  # the library reads back what it just stored
        assert len(cache) <= 3
    cache["k9"] = "again"  # a key already there never empties it
    assert cache == {"k9": "again"}


async def test_parked_sessions_leave_a_bounded_memo_and_all_resume(
    runtime: Resources, llm_server: ScriptedLLMServer
) -> None:
    memo = runtime.checkpointer._key_cache
    assert isinstance(memo, BoundedKeyCache) and memo.max_entries == KEY_CACHE_MAX
    runtime.checkpointer._key_cache = small = BoundedKeyCache[str, str](12)
    sessions = [new_session().format() for _ in range(30)]
    for sid in sessions:
        llm_server.push_tool_calls([("delete_records", {"older_than": "2030-01-01"})])
        await run(runtime, sid, new_turn_input("delete the old records", ac(superuser=True)))
        assert len(small) <= 12
    for sid in (sessions[0], sessions[-1]):  # long evicted from the memo, and the latest
        assert (await runtime.graph.aget_state(run_config(sid))).interrupts
    llm_server.push_text("Deleted.")
    await run(runtime, sessions[0], Command(resume="yes"))
    state = await runtime.graph.aget_state(run_config(sessions[0]))
    assert not state.interrupts
    assert state.values["messages"][-1].content == "Deleted."
    assert len(small) <= 12
