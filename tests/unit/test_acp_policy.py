"""The dev AccessControlProvider's policy semantics and the bot's layer-1 rule, without HTTP.

Why: the integration tests prove the wire; these pin down WHO gets WHAT, including the
cases that must grant nothing (other domains, inactive roles, unknown users).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vagent_dev.acp import SUPERUSER_GROUP, Policy, PolicyError, Reason, context_for, load_policy
from vagent_shared.access import AcContext
from vagent_shared.access_provider import agent_allowed

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "deploy/dev/acp-policy.yaml"

MULTI = """
superusers: ["@root:x"]
domains:
  acme:
    users:
      "@alice:x": [member]
      "@dave:x": [guest]
      "@erin:x": []
    roles:
      member: [agent:vagent, tool:ask_user]
      guest: [tool:ask_user]
  beta:
    users:
      "@dave:x": [admin]
      "@frank:x": [all_agents]
    roles:
      admin: ["agent:*", "tool:*"]
      all_agents: ["agent:*"]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def multi(tmp_path: Path) -> Policy:
    return load_policy(_write(tmp_path, MULTI))


def _ctx(policy: Policy, user: str, domain: str) -> AcContext:
    ac, reason = context_for(policy, user, domain)
    assert ac is not None, reason
    return ac


# --------------------------------------------------------------------------- the demo policy


def test_demo_policy_loads() -> None:
    policy = load_policy(DEMO)
    assert policy.superusers == ["@admin:localhost"]
    assert set(policy.domains["localhost"].users) == {
        "@alice:localhost",
        "@bob:localhost",
        "@carol:localhost",
    }


@pytest.mark.parametrize(
    ("user", "role", "delete"),
    [
        ("@alice:localhost", "operator", True),
        ("@bob:localhost", "analyst", False),
        ("@carol:localhost", "member", False),
    ],
)
def test_demo_users_get_their_roles(user: str, role: str, delete: bool) -> None:
    ac, reason = context_for(load_policy(DEMO), user, "localhost")
    assert reason is Reason.MEMBER and reason.status == 200
    assert ac is not None
    assert ac.user_id == user and ac.active_acl_domain == "localhost"
    assert ac.active_roles == [role] and not ac.is_superuser()
    assert agent_allowed(ac, "vagent")
    assert not agent_allowed(ac, "other-agent")
    assert ac.can_access("tool:ask_user")
    assert ac.can_access("tool:delete_records") is delete


def test_demo_unknown_user_is_404_and_other_domain_is_403() -> None:
    policy = load_policy(DEMO)
    assert context_for(policy, "@mallory:localhost", "localhost") == (None, Reason.UNKNOWN_USER)
    assert Reason.UNKNOWN_USER.status == 404
    assert context_for(policy, "@alice:localhost", "example.org") == (None, Reason.NOT_IN_DOMAIN)
    assert Reason.NOT_IN_DOMAIN.status == 403


def test_demo_superuser_is_answered_in_any_domain() -> None:
    policy = load_policy(DEMO)
    for domain in ("localhost", "nowhere.example"):
        ac, reason = context_for(policy, "@admin:localhost", domain)
        assert reason is Reason.SUPERUSER and reason.status == 200
        assert ac is not None and ac.active_acl_domain == domain
        assert ac.superuser_groups == [SUPERUSER_GROUP] and ac.is_superuser()
        assert agent_allowed(ac, "vagent") and ac.can_access("tool:delete_records")


def test_context_round_trips_the_camel_case_wire() -> None:
    """What the provider sends is exactly what the bot parses back."""
    ac = _ctx(load_policy(DEMO), "@bob:localhost", "localhost")
    wire = ac.to_wire()
    assert set(wire) == {"userId", "activeAclDomain", "activeRoles", "superuserGroups", "roles"}
    assert AcContext.model_validate(wire) == ac


# --------------------------------------------------------------------------- semantics


def test_roles_from_other_domains_are_listed_but_grant_nothing(multi: Policy) -> None:
    ac = _ctx(multi, "@dave:x", "acme")
    assert ac.active_roles == ["guest"]
    assert {g.name for g in ac.roles["beta"]} == {"admin"}  # realistic: listed...
    assert not agent_allowed(ac, "vagent")  # ...but beta's agent:* does not count in acme
    assert not ac.can_access("tool:database_query")
    assert ac.can_access("tool:ask_user")
    beta = _ctx(multi, "@dave:x", "beta")
    assert beta.active_roles == ["admin"] and agent_allowed(beta, "vagent")


def test_user_only_in_another_domain_is_403(multi: Policy) -> None:
    assert context_for(multi, "@alice:x", "beta") == (None, Reason.NOT_IN_DOMAIN)
    assert context_for(multi, "@frank:x", "acme") == (None, Reason.NOT_IN_DOMAIN)
    assert context_for(multi, "@alice:x", "unknown-domain") == (None, Reason.NOT_IN_DOMAIN)
    assert context_for(multi, "@nobody:x", "acme") == (None, Reason.UNKNOWN_USER)


def test_listed_user_without_roles_is_answered_but_not_allowed(multi: Policy) -> None:
    ac, reason = context_for(multi, "@erin:x", "acme")
    assert reason is Reason.MEMBER and ac is not None
    assert ac.active_roles == [] and not agent_allowed(ac, "vagent")


def test_superuser_not_listed_in_any_domain(multi: Policy) -> None:
    ac, reason = context_for(multi, "@root:x", "anything")
    assert reason is Reason.SUPERUSER and ac is not None
    assert ac.active_roles == [] and ac.roles == {"anything": []}
    assert agent_allowed(ac, "any-agent")


def test_wildcard_agent_grant(multi: Policy) -> None:
    ac = _ctx(multi, "@frank:x", "beta")
    assert agent_allowed(ac, "vagent") and agent_allowed(ac, "another")
    assert not ac.can_access("tool:ask_user")  # agent:* is not tool:*


def _ac(
    instances: list[str], *, active: bool = True, domain: str = "d", superuser: bool = False
) -> AcContext:
    return AcContext.model_validate(
        {
            "userId": "@u:x",
            "activeAclDomain": "d",
            "activeRoles": ["r"] if active else [],
            "superuserGroups": ["admins"] if superuser else [],
            "roles": {domain: [{"name": "r", "instances": instances}]},
        }
    )


@pytest.mark.parametrize(
    ("ac", "allowed"),
    [
        (_ac(["agent:vagent"]), True),
        (_ac(["agent:*"]), True),
        (_ac(["agent:other"]), False),
        (_ac(["tool:*", "tool:ask_user"]), False),
        (_ac([]), False),
        (_ac(["agent:vagent"], active=False), False),  # held but not active
        (_ac(["agent:vagent"], domain="elsewhere"), False),  # granted in another domain
        (_ac(["agent:*"], domain="elsewhere"), False),
        (_ac([], superuser=True), True),
        (_ac(["agent:other"], active=False, superuser=True), True),
        (_ac(["agent:vagentx"]), False),  # exact names, no prefix matching
    ],
)
def test_agent_allowed_truth_table(ac: AcContext, allowed: bool) -> None:
    assert agent_allowed(ac, "vagent") is allowed


def test_blank_superuser_group_is_not_a_superuser() -> None:
    assert not agent_allowed(
        _ac([], superuser=False).model_copy(update={"superuser_groups": [" "]}), "vagent"
    )


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('domains: {d: {users: {"@a:x": [ghost]}, roles: {member: ["agent:vagent"]}}}', "unknown role"),
        ('domains: {d: {users: {}, roles: {member: ["vagent"]}}}', "invalid instance"),
        ('domains: {d: {users: {}, roles: {member: ["robot:vagent"]}}}', "invalid instance"),
        ("domains: {d: {userz: {}}}", "userz"),
        ("superuser: ['@a:x']", "superuser"),
        ("domains: [a, b]", "domains"),
        ('domains: {d: {users: {"@a:x": member}, roles: {member: []}}}', "list"),
        ("domains: {d: {users: {", "not valid YAML"),
        ("- just\n- a list", "invalid policy"),
    ],
)
def test_invalid_policies_are_rejected_with_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(PolicyError, match=needle) as err:
        load_policy(path)
    assert str(path) in str(err.value)


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")


def test_empty_sections_are_allowed(tmp_path: Path) -> None:
    """`users:` or a role with nothing after it is YAML null: an empty map/list, not an error."""
    policy = load_policy(
        _write(tmp_path, 'superusers:\ndomains:\n  d:\n    users:\n      "@a:x":\n    roles:\n      guest:\n')
    )
    assert policy.superusers == [] and policy.domains["d"].users == {"@a:x": []}
    assert policy.domains["d"].roles == {"guest": []}
    assert load_policy(_write(tmp_path, "")) == Policy()
