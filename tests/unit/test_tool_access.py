"""Which tools may a user see and call? Decided before the LLM sees anything, and again
at invocation."""

from __future__ import annotations

from tests.support.factories import ac
from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.workflow.access import check_invocation, visible_tools

REG = default_registry()
AGENT = load_descriptor()


def names(user_ac: object) -> list[str]:
    return [t.name for t in visible_tools(REG, AGENT, user_ac)]  # type: ignore[arg-type]


def test_only_granted_tools_are_visible() -> None:
    assert names(ac(instances=["tool:database_query"])) == ["database_query"]
    assert names(ac(instances=[])) == []
    assert names(ac()) == ["database_query", "delete_records", "ask_user"]


def test_superuser_sees_every_enabled_tool() -> None:
    assert names(ac(instances=[], superuser=True)) == AGENT.tools


def test_grants_in_another_domain_or_inactive_roles_do_not_count() -> None:
    other = ac(domain="other")
    ctx = other.model_copy(update={"active_acl_domain": "acme"})
    assert names(ctx) == []
    inactive = ac().model_copy(update={"active_roles": []})
    assert names(inactive) == []


def test_tool_disabled_for_the_agent_is_hidden_even_from_superusers() -> None:
    narrow = AGENT.model_copy(update={"tools": ["database_query"]})
    assert [t.name for t in visible_tools(REG, narrow, ac(superuser=True))] == ["database_query"]
    assert (
        check_invocation("delete_records", REG, narrow, ac(superuser=True)).reason
        == "tool_not_enabled_for_agent"
    )


def test_invocation_is_checked_again() -> None:
    reader = ac(instances=["tool:database_query"])
    assert check_invocation("database_query", REG, AGENT, reader).allowed
    denied = check_invocation("delete_records", REG, AGENT, reader)
    assert not denied.allowed and denied.reason == "tool_not_granted" and denied.tool is None
    invented = check_invocation("drop_all_tables", REG, AGENT, ac(superuser=True))
    assert not invented.allowed and invented.reason == "unknown_tool"


def test_offered_schema_names_and_describes_the_tool() -> None:
    spec = REG.get("delete_records")
    assert spec is not None and spec.requires_confirmation
    schema = spec.openai_schema()
    assert schema["function"]["name"] == "delete_records"
    assert "older_than" in schema["function"]["parameters"]["properties"]
