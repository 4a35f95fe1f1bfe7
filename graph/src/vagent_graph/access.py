"""Which tools may this user see and call? Pure decisions, no I/O.

Checked twice: before the LLM sees any tool (withheld tools are never named to it)
and again at invocation (the LLM may call a tool it was never offered).
"""

from __future__ import annotations

from dataclasses import dataclass

from vagent_graph.agent import AgentDescriptor
from vagent_graph.tools import Tool, ToolRegistry
from vagent_shared.access import AcContext, tool


def visible_tools(registry: ToolRegistry, agent: AgentDescriptor, ac: AcContext) -> list[Tool]:
    """Tools enabled for the agent AND granted to the user, in the descriptor's order."""
    out: list[Tool] = []
    for name in agent.tools:
        t = registry.get(name)
        if t is not None and ac.can_access(tool(name)):
            out.append(t)
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
    if name not in agent.tools:
        return InvocationDecision(False, "tool_not_enabled_for_agent")
    if not ac.can_access(tool(name)):
        return InvocationDecision(False, "tool_not_granted")
    return InvocationDecision(True, "granted", t)
