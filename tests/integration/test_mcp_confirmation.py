"""A confirmation is bound to the MCP server as well as to the tool and its arguments: after
a configuration change that points a server's name at another server, a pending "yes" never
runs the other server's tool of the same name; the user is asked again.

The workflow in-process on the real Redis checkpointer, with the scripted OpenAI-compatible
LLM over HTTP (tests/integration/test_workflow.py's Harness); the two servers' tools are
built by the graph's own build_tools, their `run` records which server would have acted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp.types import Tool as McpTool
from pydantic import BaseModel

from tests.integration.test_workflow import Harness, question
from tests.support.factories import ac, new_session
from tests.support.llm_server import ScriptedLLMServer
from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.tools import build_tools
from vagent_graph.tools import ToolContext, ToolRegistry
from vagent_graph.tools.catalogue import builtin_tools
from vagent_shared.events import HitlRequest

LISTED = [McpTool(name="merge", inputSchema={"type": "object", "properties": {"pr": {"type": "integer"}}})]


def recording(server: str, ran: list[str]) -> Any:
    def make_run(name: str) -> Any:
        async def run(args: BaseModel, ctx: ToolContext, answer: str | None) -> str:
            ran.append(f"{server}:{name}:{args.model_dump(mode='json')}")
            return f"merged on {server}"

        return run

    return make_run


async def test_a_yes_for_one_server_never_runs_another_servers_tool_of_the_same_name(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    ran: list[str] = []
    first = McpServerConfig(name="git", url="http://git-a.example/mcp", confirm="always")
    other = McpServerConfig(name="git", url="http://git-b.example/mcp", confirm="always")
    (tool_a,), _ = build_tools(first, LISTED, recording("A", ran))
    registry = ToolRegistry(builtin_tools())
    registry.register(tool_a)
    agent = load_descriptor().model_copy(update={"mcp_servers": [first]})
    user = ac("@alice:localhost", ["mcp_server:git"])
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "records.db", registry, agent) as h:
        sid = new_session().format()
        llm_server.push_tool_calls([("git__merge", {"pr": 7})])
        asked = question(await h.say(sid, "merge PR 7", user))
        assert asked.question == "Merge (git server)?\n`pr`: `7`"  # its title, never `git__merge`
        # meanwhile the operator points `git` at another server (the graph reads its list anew)
        (tool_b,), _ = build_tools(other, LISTED, recording("B", ran))
        registry.remove("git__merge")
        registry.register(tool_b)
        again = await h.answer(sid, "yes")
        assert ran == [], "a yes given for server A ran server B's tool"
        assert isinstance(question(again), HitlRequest)  # asked again, now for server B
        llm_server.push_text("Merged.")
        await h.answer(sid, "yes")
        assert ran == ["B:merge:{'pr': 7}"]  # B's tool, once, after a yes given for B
