"""The development Credential Registry's policy and the demo ticket service's seed, without HTTP.

Why: a typo in either file must fail loudly at load time (never grant a credential by
accident, never quote a secret in the error), the k8s dev overlay must serve the same files
as `make run`, and the keys the registry hands out must be the keys the ticket service knows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from vagent_dev.credential_registry import (
    Outcome,
    Policy,
    PolicyError,
    load_policy,
    lookup,
    secret_problem,
)
from vagent_dev.tickets import SeedError, load_seed
from vagent_shared.credentials import CredentialRequest

ROOT = Path(__file__).resolve().parents[2]
CREDENTIALS = ROOT / "deploy/dev/credentials.yaml"
TICKETS = ROOT / "deploy/dev/tickets.yaml"
OVERLAY = ROOT / "k8s/overlays/dev"
NOW = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
SECRET = "s3cr3t-value-that-must-not-leak"


def _ask(policy: Policy, user: str, resource: str = "tickets", domain: str = "localhost") -> Any:
    return lookup(policy, CredentialRequest(user_id=user, resource_id=resource, domain=domain), NOW)


def _write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _resource(tmp_path: Path, body: dict[str, Any]) -> Path:
    """A policy with one resource `r` in domain `d`."""
    return _write(tmp_path, yaml.safe_dump({"domains": {"d": {"resources": {"r": body}}}}))


# --------------------------------------------------------------------------- the dev files


@pytest.mark.parametrize("name", ["credentials.yaml", "tickets.yaml"])
def test_k8s_dev_overlay_copies_are_identical(name: str) -> None:
    assert (OVERLAY / name).read_bytes() == (ROOT / "deploy/dev" / name).read_bytes(), (
        f"k8s/overlays/dev/{name} must be a byte-identical copy of deploy/dev/{name}"
    )


def test_dev_policy_answers_the_demo_people() -> None:
    policy = load_policy(CREDENTIALS)
    alice = _ask(policy, "@alice:localhost")
    assert alice.outcome is Outcome.ISSUED and alice.credential is not None
    assert alice.credential.credential_type == "api_key"
    assert alice.credential.expires_at == NOW.replace(microsecond=0) + timedelta(hours=1)
    assert "dev-tickets-key" not in repr(alice.credential), "the secret is a SecretStr"
    assert _ask(policy, "@carol:localhost") == (Outcome.NO_CREDENTIAL, None)
    assert _ask(policy, "@dave:localhost") == (Outcome.DENIED, None)
    assert _ask(policy, "@alice:localhost", resource="wiki").outcome is Outcome.NO_CREDENTIAL
    assert _ask(policy, "@alice:localhost", domain="acme").outcome is Outcome.NO_CREDENTIAL
    assert Outcome.DENIED.status == 403 and Outcome.NO_CREDENTIAL.status == 404


def _ticket_keys() -> dict[str, str]:
    """user -> key of resource `tickets` in every domain of credentials.yaml."""
    policy = load_policy(CREDENTIALS)
    keys: dict[str, str] = {}
    for domain in policy.domains.values():
        resource = domain.resources.get("tickets")
        keys.update(resource.users if resource else {})
    return keys


def test_registry_keys_and_ticket_keys_agree() -> None:
    """Every key the registry hands out opens that same person's tickets, and only those."""
    issued = _ticket_keys()
    known = load_seed(TICKETS).keys
    assert {"@alice:localhost", "@bob:localhost", "@admin:localhost"} <= set(issued)
    for user, key in issued.items():
        assert known.get(key) == user, f"{user}'s key in credentials.yaml is not theirs in tickets.yaml"
    assert {v: k for k, v in known.items()} == issued, "tickets.yaml holds keys the registry never issues"
    assert len(set(issued.values())) == len(issued), "every person needs their own key"


def test_dev_seed_gives_alice_and_bob_different_open_tickets() -> None:
    seed = load_seed(TICKETS)

    def open_titles(user: str) -> set[str]:
        return {t.title for t in seed.tickets if t.owner == user and t.status == "open"}

    alice, bob = open_titles("@alice:localhost"), open_titles("@bob:localhost")
    assert "VPN drops every hour" in alice and "Grafana dashboard shows no data" in bob
    assert alice and bob and not alice & bob
    assert any(t.status == "closed" for t in seed.tickets if t.owner == "@alice:localhost")


# --------------------------------------------------------------------------- policy validation


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"type": "password", "users": {}}, "Input should be 'api_key', 'bearer_token'"),
        ({"users": {}}, "type: Field required"),
        ({"type": "api_key", "ttl_seconds": "3600"}, "ttl_seconds: Input should be a valid integer"),
        ({"type": "api_key", "ttl_seconds": 0}, "ttl_seconds: Input should be greater than 0"),
        ({"type": "api_key", "ttl_seconds": True}, "ttl_seconds: Input should be a valid integer"),
        ({"type": "api_key", "users": {"@a:x": 123}}, "users.@a:x: Input should be a valid string"),
        ({"type": "api_key", "users": {"@a:x": ""}}, "users.@a:x: String should have at least 1"),
        ({"type": "api_key", "users": ["@a:x"]}, "users: Input should be a valid dictionary"),
        ({"type": "api_key", "denied": "@a:x"}, "denied: Input should be a valid list"),
        ({"type": "api_key", "owner": "@a:x"}, "owner: Extra inputs are not permitted"),
        ({"type": "api_key", "users": {"alice": SECRET}}, "entry 1 of users is not a Matrix user id"),
        ({"type": "api_key", "denied": ["@a:x", "dave"]}, "entry 2 of denied is not a Matrix user id"),
        ({"type": "api_key", "users": {"@a:x": SECRET}, "denied": ["@a:x"]}, "both in users and in denied"),
        ({"type": "api_key", "users": {"@a:x": f"{SECRET} x"}}, "api_key credentials must not contain"),
        ({"type": "bearer_token", "users": {"@a:x": f"{SECRET}\n"}}, "must not contain whitespace"),
        ({"type": "basic_auth", "users": {"@a:x": SECRET}}, "must be 'username:password'"),
        ({"type": "basic_auth", "users": {"@a:x": f":{SECRET}"}}, "must be 'username:password'"),
        ({"type": "jwt", "users": {"@a:x": SECRET}}, "three base64url parts"),
    ],
)
def test_invalid_resources_fail_with_a_clear_message(
    tmp_path: Path, body: dict[str, Any], expected: str
) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy(_resource(tmp_path, body))
    assert expected in str(err.value)
    assert str(tmp_path) in str(err.value)
    assert SECRET not in str(err.value), "an error message quoted a secret"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("domains: [localhost]", "domains: Input should be a valid dictionary"),
        ("domains: {d: {users: {}}}", "domains.d.users: Extra inputs are not permitted"),
        ("superusers: []", "superusers: Extra inputs are not permitted"),
        ("- 1\n- 2", "policy: Input should be a valid dictionary"),
        (f'domains: {{d: {{resources: {{r: {{users: {{"@a:x": "{SECRET}" "x"}}}}}}}}}}', "not valid YAML"),
        (f"domains:\n  d:\n   resources: {SECRET}\n  bad", "not valid YAML: line"),
    ],
)
def test_invalid_files_fail_with_a_clear_message(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy(_write(tmp_path, text))
    assert expected in str(err.value)
    assert SECRET not in str(err.value), "PyYAML's snippet of the broken line must not be shown"


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "absent.yaml")


def test_all_five_credential_types_are_issued(tmp_path: Path) -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
    secrets = {
        "api_key": "k-123",
        "bearer_token": "tok.en-123",
        "basic_auth": "alice:pa ss:word",
        "jwt": jwt,
        "custom": "anything at all\nmulti-line",
    }
    resources = {kind: {"type": kind, "users": {"@a:x": value}} for kind, value in secrets.items()}
    path = _write(tmp_path, yaml.safe_dump({"domains": {"d": {"resources": resources}}}))
    policy = load_policy(path)
    for kind, value in secrets.items():
        found = _ask(policy, "@a:x", resource=kind, domain="d")
        assert found.outcome is Outcome.ISSUED and found.credential is not None
        assert found.credential.to_wire() == {
            "credential_type": kind,
            "credential": value,
            "expires_at": None,
        }


def test_secret_problem_per_type() -> None:
    assert secret_problem("custom", " ") is None
    assert secret_problem("basic_auth", "u:") is None  # an empty password is the system's business
    assert secret_problem("jwt", "a.b.") is None  # unsecured JWTs have an empty signature
    assert secret_problem("jwt", "a.b") is not None
    assert secret_problem("api_key", "a\tb") is not None


def test_empty_sections_are_empty_not_errors(tmp_path: Path) -> None:
    policy = load_policy(
        _write(tmp_path, "domains:\n  d:\n    resources:\n      r: {type: custom, users:}\n")
    )
    assert _ask(policy, "@a:x", resource="r", domain="d") == (Outcome.NO_CREDENTIAL, None)
    assert load_policy(_write(tmp_path, "")).domains == {}


# --------------------------------------------------------------------------- seed validation


KEY = "dev-key-that-must-not-leak-1234"


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ({"keys": {KEY: "@a:x"}, "tickets": [{"owner": "@b:x", "title": "t"}]}, "'@b:x'], who hold no key"),
        ({"keys": {"short": "@a:x"}}, "keys: String should have at least 16 characters"),
        ({"keys": {KEY: 7}}, "keys: Input should be a valid string"),
        ({"keys": {KEY: "@a:x"}, "tickets": [{"owner": "@a:x", "title": ""}]}, "tickets.0.title"),
        (
            {"keys": {KEY: "@a:x"}, "tickets": [{"owner": "@a:x", "title": "t", "priority": "urgent"}]},
            "tickets.0.priority: Input should be 'low', 'normal' or 'high'",
        ),
        ({"tickets": []}, "keys: Field required"),
        ({"keys": {KEY: "@a:x"}, "extra": 1}, "extra: Extra inputs are not permitted"),
    ],
)
def test_invalid_seed_files_fail_without_quoting_keys(
    tmp_path: Path, seed: dict[str, Any], expected: str
) -> None:
    with pytest.raises(SeedError) as err:
        load_seed(_write(tmp_path, yaml.safe_dump(seed), "tickets.yaml"))
    assert expected in str(err.value)
    assert KEY not in str(err.value)
