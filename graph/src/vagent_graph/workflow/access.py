"""Which tools may this user see and call? Pure decisions, no I/O.

Checked twice: before the LLM sees any tool (withheld tools are never named to it)
and again at invocation (the LLM may call a tool it was never offered).
"""

from __future__ import annotations

from dataclasses import dataclass

from vagent_graph.agents.descriptor import AgentDescriptor
from vagent_graph.tools import Tool, ToolRegistry
from vagent_shared.access import AcContext, tool
from vagent_shared.memory import REMEMBER_TOOL


def enabled(agent: AgentDescriptor, t: Tool) -> bool:
    """The agent uses a built-in tool it names in `tools:` (`remember` only while its
    `memory:` is enabled), and every tool of an MCP server it lists in `mcp_servers:`."""
    if t.server is None:
        return t.name in agent.tools and (t.name != REMEMBER_TOOL or agent.memory.enabled)
    return t.server in agent.mcp_server_names


def granted(ac: AcContext, t: Tool) -> bool:
    """`tool:<name>`, or one of the tool's other grants (`mcp_server:<server>`)."""
    return ac.can_access(tool(t.name)) or any(ac.can_access(g) for g in t.grants)


def visible_tools(registry: ToolRegistry, agent: AgentDescriptor, ac: AcContext) -> list[Tool]:
    """Tools enabled for the agent AND granted to the user: the built-in ones in the
    descriptor's order, then the MCP servers' tools in the registry's."""
    out: list[Tool] = []
    for name in agent.tools:
        t = registry.get(name)
        if t is not None and t.server is None and enabled(agent, t) and granted(ac, t):
            out.append(t)
    out += [t for t in registry if t.server is not None and enabled(agent, t) and granted(ac, t)]
    return out


@dataclass(frozen=True)
class InvocationDecision:
    allowed: bool
    reason: str
    tool: Tool | None = None


def check_invocation(
    name: str, registry: ToolRegistry, agent: AgentDescriptor, ac: AcContext
) -> InvocationDecision:
    """May this call run? Unknown, disabled and ungranted tools are all refused."""
    t = registry.get(name)
    if t is None:
        return InvocationDecision(False, "unknown_tool")
    if not enabled(agent, t):
        return InvocationDecision(False, "tool_not_enabled_for_agent")
    if not granted(ac, t):
        return InvocationDecision(False, "tool_not_granted")
    return InvocationDecision(True, "granted", t)
