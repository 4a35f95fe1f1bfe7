"""The calendar demo's files agree with each other and with the packaged agent, without HTTP.

Why: the demo is four files that must fit together (the agent descriptor that lists the
calendar MCP server, the access policy that grants it, the Credential Registry's policy that
hands out each person's calendar key, and the calendar's seed that knows those keys), and the
demo agent must stay the packaged agent plus the calendar, or `make run` would quietly demo a
different agent than production ships.
"""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from vagent_dev.acp import context_for
from vagent_dev.acp import load_policy as load_acp_policy
from vagent_dev.calendar import CalendarDB, RequestRecord, build_mcp, load_seed
from vagent_dev.credential_registry import Outcome, lookup
from vagent_dev.credential_registry import load_policy as load_credentials_policy
from vagent_graph.agents.descriptor import DEFAULT_DESCRIPTOR, AgentDescriptor, load_descriptor
from vagent_graph.agents.mcp_config import McpConfigError, McpServerConfig
from vagent_graph.mcp.tools import build_tools
from vagent_graph.tools import ToolContext, ToolRegistry
from vagent_graph.tools.catalogue import builtin_tools
from vagent_graph.workflow.access import visible_tools
from vagent_shared.access import AcContext, mcp_server, tool
from vagent_shared.credentials import CredentialRequest

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT / "deploy/dev"
DEMO_AGENT = DEV / "agent.yaml"
ACP_POLICY = DEV / "acp-policy.yaml"
CREDENTIALS = DEV / "credentials.yaml"
CALENDAR = DEV / "calendar.yaml"
URL = "http://127.0.0.1:8093/mcp"
DOMAIN = "localhost"
#: Who the demo gives the calendar (analysts and operators), and who it does not (a member).
WITH_CALENDAR = ("@alice:localhost", "@bob:localhost")
WITHOUT_CALENDAR = "@carol:localhost"


def _packaged_text() -> str:
    return resources.files("vagent_graph.agents").joinpath(DEFAULT_DESCRIPTOR).read_text()


@pytest.fixture
def demo_agent(monkeypatch: pytest.MonkeyPatch) -> AgentDescriptor:
    monkeypatch.setenv("CALENDAR_MCP_URL", URL)
    return load_descriptor(DEMO_AGENT)


def _calendar(agent: AgentDescriptor) -> McpServerConfig:
    (server,) = agent.mcp_servers
    return server


def _ac(user: str) -> AcContext:
    ac, reason = context_for(load_acp_policy(ACP_POLICY), user, DOMAIN)
    assert ac is not None, reason
    return ac


# --------------------------------------------------------------------------- the demo agent


def test_demo_agent_is_the_packaged_agent_plus_the_calendar() -> None:
    demo = yaml.safe_load(DEMO_AGENT.read_text())
    packaged = yaml.safe_load(_packaged_text())
    assert "mcp_servers" not in packaged, "the packaged agent uses no MCP server"
    servers = demo.pop("mcp_servers")
    assert demo == packaged, "deploy/dev/agent.yaml differs from the packaged agent beyond mcp_servers"
    assert [s["name"] for s in servers] == ["calendar"]
    assert servers[0]["url"] == "${CALENDAR_MCP_URL}", "the url comes from the environment"


def test_demo_agent_loads_with_the_calendar_url(demo_agent: AgentDescriptor) -> None:
    server = _calendar(demo_agent)
    assert server.name == "calendar" and server.url == URL
    assert server.transport == "streamable_http"
    assert server.credential == "user" and server.credential_resource == "mcp:calendar"
    # the demo's own server: "what is on my calendar" just answers (README), "book ..." asks
    assert server.confirm == "auto" and server.trust_annotations
    assert demo_agent.mcp_server_names == {"calendar"}
    # everything else is what the packaged agent loads to
    assert demo_agent.model_dump(exclude={"mcp_servers"}) == load_descriptor().model_dump(
        exclude={"mcp_servers"}
    )


def test_demo_agent_without_the_calendar_url_does_not_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CALENDAR_MCP_URL", raising=False)
    with pytest.raises(McpConfigError, match="CALENDAR_MCP_URL") as err:
        load_descriptor(DEMO_AGENT)
    assert "mcp_servers[calendar]" in str(err.value)


# --------------------------------------------------------------------------- who gets the calendar


@pytest.mark.parametrize("user", WITH_CALENDAR)
def test_policy_grants_the_calendar_to_alice_and_bob(user: str, demo_agent: AgentDescriptor) -> None:
    ac = _ac(user)
    assert not ac.is_superuser()
    assert ac.can_access(mcp_server(_calendar(demo_agent).name))


def test_policy_does_not_grant_the_calendar_to_carol(demo_agent: AgentDescriptor) -> None:
    ac = _ac(WITHOUT_CALENDAR)
    assert ac.can_access("agent:vagent"), "carol may talk to the agent, only not use the calendar"
    assert not ac.can_access(mcp_server(_calendar(demo_agent).name))
    for name in ("list_events", "find_free_slot", "create_event"):
        assert not ac.can_access(tool(f"calendar__{name}"))


def _never_run(name: str) -> Any:
    async def run(args: BaseModel, ctx: ToolContext, answer: str | None) -> str:
        raise AssertionError(f"{name} must not run here")

    return run


async def test_the_demo_calendars_tools_are_offered_to_alice_and_bob_only(
    demo_agent: AgentDescriptor, tmp_path: Path
) -> None:
    """The demo calendar's own tool list, as the graph registers it, filtered per user."""
    server = build_mcp(CalendarDB(tmp_path / "calendar.db"), RequestRecord(), "127.0.0.1")
    listed = await server.list_tools()
    tools, skipped = build_tools(_calendar(demo_agent), listed, _never_run)
    assert not skipped
    registry = ToolRegistry(builtin_tools())
    for t in tools:
        registry.register(t)
    calendar = {"calendar__list_events", "calendar__find_free_slot", "calendar__create_event"}
    assert {t.name for t in tools} == calendar
    by = {t.name: t for t in tools}
    assert not by["calendar__list_events"].requires_confirmation, "reading runs directly"
    assert by["calendar__create_event"].requires_confirmation, "booking asks first"
    for user in WITH_CALENDAR:
        offered = {t.name for t in visible_tools(registry, demo_agent, _ac(user))}
        assert calendar <= offered, user
    offered = {t.name for t in visible_tools(registry, demo_agent, _ac(WITHOUT_CALENDAR))}
    assert not calendar & offered, "carol must never be offered the calendar"


# --------------------------------------------------------------------------- each person's own key


def test_registry_calendar_keys_are_the_calendars_keys(demo_agent: AgentDescriptor) -> None:
    """Every calendar key the registry hands out opens that same person's calendar, and the
    calendar knows no key the registry never issues."""
    resource = _calendar(demo_agent).credential_resource
    policy = load_credentials_policy(CREDENTIALS)
    issued = policy.domains[DOMAIN].resources[resource].users
    known = load_seed(CALENDAR).keys
    assert set(issued) == set(WITH_CALENDAR)
    assert {owner: key for key, owner in known.items()} == issued
    assert len(set(issued.values())) == len(issued), "every person needs their own key"
    now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    carol = lookup(
        policy, CredentialRequest(user_id=WITHOUT_CALENDAR, resource_id=resource, domain=DOMAIN), now
    )
    assert carol.outcome is Outcome.NO_CREDENTIAL
