"""The real `vagent-credentials` process over HTTP: the contract, its token, hot reload, and
that no secret ever reaches its log.

Why a subprocess: the console script, the settings from the environment, the JSON logging
and uvicorn are all part of what `make run` and the dev deployments start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from procutil import free_port

from tests.support.procs import BIN, ServiceProcess
from vagent_shared.credentials import CREDENTIALS_GET_PATH

ROOT = Path(__file__).resolve().parents[2]
DEV_POLICY = ROOT / "deploy/dev/credentials.yaml"
DOMAIN = "localhost"
ALICE, BOB, CAROL, DAVE = (f"@{n}:localhost" for n in ("alice", "bob", "carol", "dave"))


class RegistryProcess(ServiceProcess):
    """`vagent-credentials` on a free loopback port, serving `policy`."""

    def __init__(self, policy: Path, token: str = "") -> None:
        self.policy = policy
        self.port = free_port()
        env = {
            "CREDENTIALS_HOST": "127.0.0.1",
            "CREDENTIALS_PORT": str(self.port),
            "CREDENTIALS_POLICY_FILE": str(policy),
            "CREDENTIAL_REGISTRY_TOKEN": token,  # empty: no token (whatever the caller's env says)
            "LOG_LEVEL": "DEBUG",
        }
        log_path = policy.parent / f"credentials-{self.port}.log"
        super().__init__("vagent-credentials", env, log_path, f"{self.url}/health")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ask(self, user: str, resource: str = "tickets", **headers: str) -> httpx.Response:
        body = {"user_id": user, "resource_id": resource, "domain": DOMAIN}
        return httpx.post(self.url + CREDENTIALS_GET_PATH, json=body, headers=headers, timeout=5)

    def audit(self) -> list[dict[str, Any]]:
        return [r for r in self.log_records() if r.get("event") == "credential_request"]


def dev_keys() -> dict[str, str]:
    """user -> key of resource `tickets`, from the dev policy."""
    policy = yaml.safe_load(DEV_POLICY.read_text())
    users: dict[str, str] = policy["domains"][DOMAIN]["resources"]["tickets"]["users"]
    return users


def write_policy(path: Path, policy: dict[str, Any] | str) -> None:
    """Replace atomically, as editors do, so the registry never reads a half-written file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(policy if isinstance(policy, str) else yaml.safe_dump(policy))
    os.replace(tmp, path)


def start_registry(tmp_path: Path, token: str = "") -> RegistryProcess:
    policy = tmp_path / "credentials.yaml"
    shutil.copy(DEV_POLICY, policy)
    return RegistryProcess(policy, token).start()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryProcess]:
    server = start_registry(tmp_path_factory.mktemp("credentials"))
    yield server
    server.stop()


def test_alice_gets_her_own_key_with_an_expiry(registry: RegistryProcess) -> None:
    before = datetime.now(UTC)
    r = registry.ask(ALICE)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"credential_type", "credential", "expires_at"}
    assert body["credential_type"] == "api_key" and body["credential"] == dev_keys()[ALICE]
    expires = datetime.fromisoformat(body["expires_at"])
    assert expires.utcoffset() == timedelta(0)
    assert before + timedelta(seconds=3598) <= expires <= datetime.now(UTC) + timedelta(seconds=3600)
    assert r.headers["cache-control"] == "no-store"
    assert registry.ask(BOB).json()["credential"] == dev_keys()[BOB] != body["credential"]
    assert {"user_id": ALICE, "resource_id": "tickets", "domain": DOMAIN, "outcome": "issued"}.items() <= (
        registry.audit()[-2].items()
    )


@pytest.mark.parametrize(
    ("user", "resource", "status", "code"),
    [
        (CAROL, "tickets", 404, "no_credential"),
        (DAVE, "tickets", 403, "denied"),
        (ALICE, "wiki", 404, "no_credential"),
        ("@mallory:localhost", "tickets", 404, "no_credential"),
    ],
)
def test_refusals(registry: RegistryProcess, user: str, resource: str, status: int, code: str) -> None:
    r = registry.ask(user, resource)
    assert r.status_code == status and r.json()["error_code"] == code, r.text
    assert r.json()["message"]
    assert {"user_id": user, "resource_id": resource, "outcome": code, "status": status}.items() <= (
        registry.audit()[-1].items()
    )


def test_another_domain_has_no_credentials(registry: RegistryProcess) -> None:
    body = {"user_id": ALICE, "resource_id": "tickets", "domain": "acme"}
    assert httpx.post(registry.url + CREDENTIALS_GET_PATH, json=body).status_code == 404


VALID = {"user_id": ALICE, "resource_id": "tickets", "domain": DOMAIN}


@pytest.mark.parametrize(
    ("content", "content_type", "where"),
    [
        (b'{"user_id": "@alice:localhost"}', "application/json", "resource_id: Field required"),
        (b"{}", "application/json", "user_id: Field required"),
        (b"{nope", "application/json", "body: not valid JSON"),
        (b"", "application/json", "body"),
        (b"[1]", "application/json", "body: Input should be a valid dictionary"),
        (b"null", "application/json", "body"),
        (b'"@alice:localhost"', "application/json", "body"),
        (
            b'{"user_id": 5, "resource_id": "tickets", "domain": "localhost"}',
            "application/json",
            "user_id: Input should be a valid string",
        ),
        (
            b'{"user_id": "@alice:localhost", "resource_id": ["tickets"], "domain": "localhost"}',
            "application/json",
            "resource_id: Input should be a valid string",
        ),
        (
            b'{"user_id": "", "resource_id": "tickets", "domain": "localhost"}',
            "application/json",
            "user_id: String should have at least 1 character",
        ),
        (
            b'{"user_id": "@alice:localhost", "resource_id": "tickets", "domain": "localhost", "x": 1}',
            "application/json",
            "x: Extra inputs are not permitted",
        ),
        (b"user_id=@alice:localhost", "application/x-www-form-urlencoded", "body"),
        (b"\xff\xfe", "application/json", "body"),
    ],
)
def test_bad_bodies_are_422_never_500(
    registry: RegistryProcess, content: bytes, content_type: str, where: str
) -> None:
    r = httpx.post(
        registry.url + CREDENTIALS_GET_PATH, content=content, headers={"content-type": content_type}
    )
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == "invalid_request" and where in r.json()["message"], r.text


def test_the_token_is_required_when_configured(tmp_path: Path) -> None:
    token = "dev-registry-token-for-the-test"
    registry = start_registry(tmp_path, token)
    try:
        missing = registry.ask(ALICE)
        assert missing.status_code == 401 and missing.json()["error_code"] == "unauthorized"
        assert missing.headers["www-authenticate"] == "Bearer"
        for header in (f"Bearer {token}x", "Bearer", f"Basic {token}", token, f"Bearer {token[:-1]}"):
            assert registry.ask(ALICE, Authorization=header).status_code == 401, header
        ok = registry.ask(ALICE, Authorization=f"Bearer {token}")
        assert ok.status_code == 200 and ok.json()["credential"] == dev_keys()[ALICE]
        assert registry.ask(ALICE, Authorization=f"bearer {token}").status_code == 200
        # a stranger learns nothing about the body either: 401 comes first
        stranger = httpx.post(registry.url + CREDENTIALS_GET_PATH, content=b"{nope")
        assert stranger.status_code == 401
        assert httpx.get(registry.url + "/health").status_code == 200  # probes need no token
        assert token not in registry.logs()
        reasons = [r["reason"] for r in registry.log_records() if r["event"] == "credential_unauthorized"]
        assert reasons[0] == "missing_token" and "wrong_token" in reasons
    finally:
        registry.stop()


def test_policy_edits_apply_without_restart_and_invalid_ones_fail_closed(tmp_path: Path) -> None:
    registry = start_registry(tmp_path)
    secret_in_broken_line = "dev-new-secret-on-a-broken-line"
    try:
        assert registry.ask(CAROL).status_code == 404
        policy = yaml.safe_load(DEV_POLICY.read_text())
        tickets = policy["domains"][DOMAIN]["resources"]["tickets"]
        tickets["users"][CAROL] = "dev-tickets-key-carol-new"
        del tickets["users"][ALICE]
        tickets["denied"].append(BOB)
        del tickets["users"][BOB]
        del tickets["ttl_seconds"]
        write_policy(registry.policy, policy)
        carol = registry.ask(CAROL)
        assert carol.status_code == 200 and carol.json()["credential"] == "dev-tickets-key-carol-new"
        assert carol.json()["expires_at"] is None
        assert registry.ask(ALICE).status_code == 404  # revoked at once: nothing cached
        assert registry.ask(BOB).status_code == 403

        write_policy(registry.policy, f'domains: {{d: {{r: {{"@a:x": "{secret_in_broken_line}" x}}}}}}')
        broken = registry.ask(CAROL)
        assert broken.status_code == 503 and broken.json()["error_code"] == "policy_invalid"
        assert httpx.get(registry.url + "/health").status_code == 503
        tickets["type"] = "password"
        write_policy(registry.policy, policy)
        assert registry.ask(CAROL).status_code == 503
        tickets["type"] = "api_key"
        write_policy(registry.policy, policy)
        assert registry.ask(CAROL).status_code == 200

        registry.policy.unlink()
        assert registry.ask(CAROL).status_code == 503
        write_policy(registry.policy, policy)
        assert registry.ask(CAROL).status_code == 200
        logs = registry.logs()
        assert "not valid YAML" in logs and "Input should be 'api_key'" in logs
        assert secret_in_broken_line not in logs and "dev-tickets-key-carol-new" not in logs
    finally:
        registry.stop()


def test_no_secret_reaches_the_log(registry: RegistryProcess) -> None:
    keys = dev_keys()
    for user in (ALICE, BOB, "@admin:localhost", CAROL, DAVE):
        assert registry.ask(user).status_code in (200, 403, 404)
    logs = registry.logs()
    assert logs.count('"event": "credential_request"') >= 5
    for user, key in keys.items():
        assert key not in logs, f"{user}'s credential is in the registry's log"
    lines = registry.audit()
    assert all(set(r) >= {"user_id", "resource_id", "domain", "outcome", "status"} for r in lines)
    assert not any("credential" in r for r in lines)


def test_refuses_to_start_with_an_invalid_policy(tmp_path: Path) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text("domains: {d: {resources: {r: {type: password}}}}")
    env = {**os.environ, **RegistryProcess(policy).env}
    done = subprocess.run(
        [str(BIN / "vagent-credentials")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert str(policy) in done.stderr and "domains.d.resources.r.type" in done.stderr
