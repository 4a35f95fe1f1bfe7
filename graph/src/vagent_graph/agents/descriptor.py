"""The agent descriptor: what the agent is, in a YAML file instead of code."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from vagent_graph.agents.mcp_config import McpServerConfig, load_servers
from vagent_shared.memory import MemoryPolicy

DEFAULT_DESCRIPTOR = "vagent.yaml"


class HitlPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: How long the human has to answer; sent to the bot in every hitl_request.
    timeout_seconds: int = Field(default=3600, gt=0)
    #: Tools that need a yes/no confirmation in addition to those whose metadata says so.
    confirm_tools: list[str] = Field(default_factory=list)


class HistoryPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Messages kept in the session's checkpoint (older turns are dropped).
    max_messages: int = Field(default=40, ge=4)
    #: Rough token budget of the history sent to the LLM with each call.
    max_context_tokens: int = Field(default=6000, ge=200)


class AgentDescriptor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    description: str = ""
    system_prompt: str = Field(min_length=1)
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_turns: int = Field(default=8, ge=1, le=50)
    tools: list[str] = Field(default_factory=list)
    hitl: HitlPolicy = Field(default_factory=HitlPolicy)
    history: HistoryPolicy = Field(default_factory=HistoryPolicy)
    #: MCP servers whose tools the agent uses (mcp/config.py); `tools:` names built-ins only.
    mcp_servers: list[McpServerConfig] = Field(default_factory=list)
    #: Memory that follows the person (docs/memory.md); off unless enabled here.
    memory: MemoryPolicy = Field(default_factory=MemoryPolicy)

    @property
    def mcp_server_names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.mcp_servers)

    def needs_confirmation(self, tool_name: str, tool_requires: bool) -> bool:
        return tool_requires or tool_name in self.hitl.confirm_tools


def load_descriptor(path: Path | None = None) -> AgentDescriptor:
    """Load the descriptor at `path`, or the packaged default."""
    if path is None:
        text = resources.files("vagent_graph.agents").joinpath(DEFAULT_DESCRIPTOR).read_text()
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"agent descriptor {path or DEFAULT_DESCRIPTOR} is not a mapping")
    if "mcp_servers" in data:  # ${VAR} expanded here, and only here (a prompt may hold "${")
        data["mcp_servers"] = load_servers(data["mcp_servers"])
    return AgentDescriptor.model_validate(data)
