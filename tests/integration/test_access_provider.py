"""Layer-1 access over real HTTP: the bot's AccessProvider against the real `vagent-acp`
subprocess, and against small misbehaving providers started in-process.

Why real sockets and no HTTP mocks: fail-closed behaviour lives in the details (a
refused connection, a provider that never answers or trickles, a 500, garbage JSON, an
answer about somebody else) and only a real server produces them faithfully.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml
from procutil import free_port
from redis.asyncio import Redis

from tests.support.procs import BIN, ServiceProcess
from vagent_bot.access.provider import BotAccessProvider as AccessProvider
from vagent_bot.observability.metrics import ACCESS, ACP_ERRORS
from vagent_shared.access_provider import AccessResult
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "deploy/dev/acp-policy.yaml"
DOMAIN = "localhost"
ALICE, DAVE, ADMIN = "@alice:localhost", "@dave:localhost", "@admin:localhost"


# --------------------------------------------------------------------------- the real provider


class AcpProcess(ServiceProcess):
    """`vagent-acp` as a subprocess on a free loopback port, serving `policy`."""

    def __init__(self, policy: Path) -> None:
        self.policy = policy
        self.port = free_port()
        env = {
            "ACP_HOST": "127.0.0.1",
            "ACP_PORT": str(self.port),
            "ACP_POLICY_FILE": str(policy),
            "LOG_LEVEL": "DEBUG",
        }
        super().__init__("vagent-acp", env, policy.parent / f"acp-{self.port}.log", f"{self.url}/health")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def audit(self) -> list[dict[str, Any]]:
        """The provider's JSON audit lines (`acp_decision`)."""
        return [ln for ln in self.log_records() if ln.get("event") == "acp_decision"]


def demo_policy_with_dave() -> dict[str, Any]:
    """The demo policy plus @dave, who may answer questions but not talk to the agent."""
    policy: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    dom = policy["domains"][DOMAIN]
    dom["roles"]["guest"] = ["tool:ask_user"]
    dom["users"][DAVE] = ["guest"]
    return policy


def write_policy(path: Path, policy: dict[str, Any] | str) -> None:
    """Replace atomically, as editors do, so the provider never reads a half-written file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(policy if isinstance(policy, str) else yaml.safe_dump(policy))
    os.replace(tmp, path)


def start_acp(tmp_path: Path) -> AcpProcess:
    policy = tmp_path / "acp-policy.yaml"
    shutil.copy(DEMO, policy)
    write_policy(policy, demo_policy_with_dave())
    return AcpProcess(policy).start()


@pytest.fixture(scope="module")
def acp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AcpProcess]:
    server = start_acp(tmp_path_factory.mktemp("acp"))
    yield server
    server.stop()


@pytest.fixture
async def provider(acp: AcpProcess) -> AsyncIterator[AccessProvider]:
    p = AccessProvider(acp.url, timeout=5.0, agent_id="vagent")
    yield p
    await p.aclose()


def _count(metric: Any, label: str) -> float:
    return float(metric.labels(label)._value.get())


async def test_alice_is_allowed_with_her_context(provider: AccessProvider, acp: AcpProcess) -> None:
    before = _count(ACCESS, "granted")
    result = await provider.check(ALICE, DOMAIN)
    assert result.allowed and result.reason == "granted"
    assert result.ac is not None
    assert result.ac.user_id == ALICE and result.ac.active_acl_domain == DOMAIN
    assert result.ac.active_roles == ["operator"] and not result.ac.is_superuser()
    assert result.ac.can_access("tool:delete_records")
    assert _count(ACCESS, "granted") == before + 1
    assert {"user_id": ALICE, "domain": DOMAIN, "decision": "member", "status": 200}.items() <= (
        acp.audit()[-1].items()
    )


async def test_superuser_is_allowed_in_any_domain(provider: AccessProvider) -> None:
    result = await provider.check(ADMIN, "some-tenant.example")
    assert result == AccessResult(True, "superuser", result.ac)
    assert result.ac is not None and result.ac.is_superuser()


async def test_user_without_agent_grant_is_denied(provider: AccessProvider) -> None:
    result = await provider.check(DAVE, DOMAIN)
    assert not result.allowed and result.reason == "no_agent_grant"
    assert result.ac is not None and result.ac.active_roles == ["guest"]


async def test_a_grant_for_another_agent_does_not_count(acp: AcpProcess) -> None:
    p = AccessProvider(acp.url, timeout=5.0, agent_id="other-agent")
    try:
        assert (await p.check(ALICE, DOMAIN)).reason == "no_agent_grant"
    finally:
        await p.aclose()


@pytest.mark.parametrize(
    ("user", "domain", "decision"),
    [("@mallory:localhost", DOMAIN, "unknown_user"), (ALICE, "other.example", "not_in_domain")],
)
async def test_provider_denials(
    provider: AccessProvider, acp: AcpProcess, user: str, domain: str, decision: str
) -> None:
    result = await provider.check(user, domain)
    assert result == AccessResult(False, "provider_denied", None)
    assert acp.audit()[-1]["decision"] == decision
    assert acp.audit()[-1]["user_id"] == user and acp.audit()[-1]["domain"] == domain


async def test_acp_http_surface(acp: AcpProcess) -> None:
    """Status codes and error bodies of the contract, straight from the provider."""
    async with httpx.AsyncClient(base_url=acp.url, timeout=5) as c:
        ok = await c.post("/api/v1/authenticate", json={"user_id": ALICE, "domain": DOMAIN})
        assert ok.status_code == 200 and ok.json()["userId"] == ALICE
        assert set(ok.json()) == {"userId", "activeAclDomain", "activeRoles", "superuserGroups", "roles"}
        missing = await c.post("/api/v1/authenticate", json={"user_id": "@x:y", "domain": DOMAIN})
        assert missing.status_code == 404 and missing.json()["error_code"] == "unknown_user"
        other = await c.post("/api/v1/authenticate", json={"user_id": ALICE, "domain": "z"})
        assert other.status_code == 403 and other.json()["error_code"] == "not_in_domain"
        for bad in ({"user_id": ALICE}, {"user_id": "", "domain": DOMAIN}, [1]):
            r = await c.post("/api/v1/authenticate", json=bad)
            assert r.status_code == 422 and r.json()["error_code"] == "invalid_request", r.text
        r = await c.post(
            "/api/v1/authenticate", content=b"{nope", headers={"content-type": "application/json"}
        )
        assert r.status_code == 422
        health = await c.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "healthy"


async def test_policy_hot_reload(tmp_path: Path) -> None:
    """Edits apply on the next check: grants, revocations, and a broken file (fail closed)."""
    acp = start_acp(tmp_path)
    p = AccessProvider(acp.url, timeout=5.0, agent_id="vagent")
    try:
        assert (await p.check(DAVE, DOMAIN)).reason == "no_agent_grant"
        policy = demo_policy_with_dave()
        policy["domains"][DOMAIN]["users"][DAVE] = ["member"]
        del policy["domains"][DOMAIN]["users"][ALICE]
        write_policy(acp.policy, policy)
        dave = await p.check(DAVE, DOMAIN)
        assert dave.allowed and dave.ac is not None and dave.ac.active_roles == ["member"]
        assert (await p.check(ALICE, DOMAIN)).reason == "provider_denied"  # revoked: no cache

        write_policy(acp.policy, "domains: {localhost: {users: {'@dave:localhost': [ghost]}}}")
        assert (await p.check(DAVE, DOMAIN)) == AccessResult(False, "provider_error", None)
        async with httpx.AsyncClient(timeout=5) as c:
            assert (await c.get(acp.url + "/health")).status_code == 503
        assert "unknown role" in acp.logs()

        write_policy(acp.policy, policy)
        assert (await p.check(DAVE, DOMAIN)).allowed
        acp.policy.unlink()
        assert (await p.check(DAVE, DOMAIN)).reason == "provider_error"
        write_policy(acp.policy, policy)
        assert (await p.check(DAVE, DOMAIN)).allowed
    finally:
        await p.aclose()
        acp.stop()


def test_acp_refuses_to_start_with_an_invalid_policy(tmp_path: Path) -> None:
    policy = tmp_path / "bad.yaml"
    policy.write_text("domains: {d: {users: {'@a:x': [ghost]}}}")
    acp = AcpProcess(policy)
    done = subprocess.run(
        [str(BIN / "vagent-acp")], env={**os.environ, **acp.env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "unknown role" in done.stderr and str(policy) in done.stderr


# --------------------------------------------------------------------------- misbehaving providers

Respond = Callable[[dict[str, Any]], Awaitable[bytes]]


def http_response(
    status: int,
    body: bytes,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
    keep_alive: bool = False,
) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"HTTP/1.1 {status} Whatever\r\nContent-Type: {content_type}\r\n{extra}"
        f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


class FakeProvider:
    """A raw asyncio HTTP/1.1 server whose answer `respond` decides; records request bodies.

    With `keep_alive`, it serves requests on a connection until the client closes it, and
    `connections` counts the connections it accepted.
    """

    def __init__(self, respond: Respond, keep_alive: bool = False) -> None:
        self.respond = respond
        self.keep_alive = keep_alive
        self.connections = 0
        self.requests: list[dict[str, Any]] = []
        self.request_lines: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.request_lines.append(head.split(b"\r\n", 1)[0].decode())
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length))
                self.requests.append(body)
                writer.write(await self.respond(body))
                await writer.drain()
                if not self.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def __aenter__(self) -> FakeProvider:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._server:
            self._server.close()
            await self._server.wait_closed()


def ac_json(user: str, domain: str = DOMAIN) -> bytes:
    """A valid AcContext that would grant the agent to `user`."""
    return json.dumps(
        {
            "userId": user,
            "activeAclDomain": domain,
            "activeRoles": ["member"],
            "superuserGroups": ["superusers"],
            "roles": {domain: [{"name": "member", "instances": ["agent:vagent"]}]},
        }
    ).encode()


async def check_against(respond: Respond, acp_timeout: float = 5.0) -> tuple[AccessResult, FakeProvider]:
    async with FakeProvider(respond) as fake:
        p = AccessProvider(fake.url, timeout=acp_timeout, agent_id="vagent")
        try:
            return await p.check(ALICE, DOMAIN), fake
        finally:
            await p.aclose()


async def test_well_behaved_fake_is_asked_every_time_with_the_contract_body() -> None:
    """Sanity check of the fake itself, and proof there is no caching between checks."""

    async def ok(body: dict[str, Any]) -> bytes:
        return http_response(200, ac_json(body["user_id"]))

    async with FakeProvider(ok) as fake:
        p = AccessProvider(fake.url + "/", timeout=5.0, agent_id="vagent")
        try:
            for _ in range(3):
                assert (await p.check(ALICE, DOMAIN)).allowed
        finally:
            await p.aclose()
    assert fake.requests == [{"user_id": ALICE, "domain": DOMAIN}] * 3


@pytest.mark.parametrize(
    ("status", "kind"),
    [(500, "http_5xx"), (503, "http_5xx"), (401, "http_4xx"), (302, "http_3xx"), (201, "http_2xx")],
)
async def test_unexpected_status_fails_closed(status: int, kind: str) -> None:
    async def answer(body: dict[str, Any]) -> bytes:
        return http_response(status, ac_json(body["user_id"]))

    before = _count(ACP_ERRORS, kind)
    result, _ = await check_against(answer)
    assert result == AccessResult(False, "provider_error", None)
    assert _count(ACP_ERRORS, kind) == before + 1


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirects_are_not_followed(status: int) -> None:
    """Even to a provider that would grant: only the configured URL may answer."""

    async def ok(body: dict[str, Any]) -> bytes:
        return http_response(200, ac_json(body["user_id"]))

    async with FakeProvider(ok) as elsewhere:

        async def redirect(_: dict[str, Any]) -> bytes:
            location = elsewhere.url + "/api/v1/authenticate"
            return http_response(status, b"", headers={"Location": location})

        before = _count(ACP_ERRORS, "http_3xx")
        result, _ = await check_against(redirect)
    assert result == AccessResult(False, "provider_error", None)
    assert _count(ACP_ERRORS, "http_3xx") == before + 1
    assert elsewhere.requests == [] and elsewhere.connections == 0


async def test_connections_are_kept_alive_and_reused() -> None:
    async def ok(body: dict[str, Any]) -> bytes:
        return http_response(200, ac_json(body["user_id"]), keep_alive=True)

    async with FakeProvider(ok, keep_alive=True) as fake:
        p = AccessProvider(fake.url, timeout=5.0, agent_id="vagent")
        try:
            for _ in range(5):
                assert (await p.check(ALICE, DOMAIN)).allowed
        finally:
            await p.aclose()
    assert fake.requests == [{"user_id": ALICE, "domain": DOMAIN}] * 5
    assert fake.connections == 1


def test_construction_needs_no_event_loop() -> None:
    """The provider makes its HTTP session on first use, inside the loop (aiohttp requires one)."""
    AccessProvider("http://127.0.0.1:1", timeout=1.0, agent_id="vagent")


async def test_a_closed_provider_fails_closed(acp: AcpProcess) -> None:
    p = AccessProvider(acp.url, timeout=5.0, agent_id="vagent")
    assert (await p.check(ALICE, DOMAIN)).allowed
    await p.aclose()
    before = _count(ACP_ERRORS, "transport")
    assert await p.check(ALICE, DOMAIN) == AccessResult(False, "provider_error", None)
    assert _count(ACP_ERRORS, "transport") == before + 1


PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


async def test_the_environment_proxy_is_used_and_no_proxy_bypasses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider reachable only through the proxy: the request goes to the proxy in
    absolute form. NO_PROXY for the provider's host sends it directly."""

    async def ok(body: dict[str, Any]) -> bytes:
        return http_response(200, ac_json(body["user_id"]))

    async with FakeProvider(ok) as proxy:
        clear_proxies(monkeypatch)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        p = AccessProvider("http://acp.invalid:8090", timeout=5.0, agent_id="vagent")
        try:
            assert (await p.check(ALICE, DOMAIN)).allowed
        finally:
            await p.aclose()
        assert proxy.request_lines == ["POST http://acp.invalid:8090/api/v1/authenticate HTTP/1.1"]

        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        direct = AccessProvider(proxy.url, timeout=5.0, agent_id="vagent")
        try:
            assert (await direct.check(ALICE, DOMAIN)).allowed
        finally:
            await direct.aclose()
        assert proxy.request_lines[-1] == "POST /api/v1/authenticate HTTP/1.1"


async def test_an_injected_session_is_used_and_not_closed(acp: AcpProcess) -> None:
    sent: list[str] = []

    async def on_request_start(_: object, __: object, params: aiohttp.TraceRequestStartParams) -> None:
        sent.append(f"{params.method} {params.url}")

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_request_start)
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        p = AccessProvider(acp.url, timeout=5.0, agent_id="vagent", client=session)
        assert (await p.check(ALICE, DOMAIN)).allowed
        await p.aclose()
        assert not session.closed
        assert (await p.check(DAVE, DOMAIN)).reason == "no_agent_grant"
    assert sent == [f"POST {acp.url}/api/v1/authenticate"] * 2


async def test_provider_that_never_answers_times_out() -> None:
    async def hang(body: dict[str, Any]) -> bytes:
        await asyncio.sleep(60)
        return http_response(200, ac_json(body["user_id"]))

    before = _count(ACP_ERRORS, "timeout")
    start = time.monotonic()
    result, _ = await check_against(hang, acp_timeout=0.5)
    assert time.monotonic() - start < 10  # it returns at all, long before the provider would
    assert result == AccessResult(False, "provider_timeout", None)
    assert _count(ACP_ERRORS, "timeout") == before + 1


async def test_provider_that_trickles_its_answer_times_out() -> None:
    """Each byte arrives well within any per-read timeout; the whole call must still end."""

    handlers: set[asyncio.Task[Any]] = set()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            handlers.add(task)
        await reader.readuntil(b"\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            for byte in http_response(200, ac_json(ALICE)):
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        writer.close()

    server = await asyncio.start_server(trickle, "127.0.0.1", 0)
    p = AccessProvider(
        f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout=0.8, agent_id="vagent"
    )
    try:
        result = await p.check(ALICE, DOMAIN)
    finally:
        await p.aclose()
        server.close()
        for task in handlers:
            task.cancel()
    assert result == AccessResult(False, "provider_timeout", None)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[]",
        b"null",
        b'{"userId": "@alice:localhost"}',
        b'{"userId": "@alice:localhost", "activeAclDomain": "localhost", "roles": []}',
        b"<html>proxy error</html>",
    ],
)
async def test_garbage_answer_fails_closed(body: bytes) -> None:
    async def garbage(_: dict[str, Any]) -> bytes:
        return http_response(200, body)

    before = _count(ACP_ERRORS, "bad_answer")
    result, _ = await check_against(garbage)
    assert result == AccessResult(False, "bad_provider_answer", None)
    assert _count(ACP_ERRORS, "bad_answer") == before + 1


async def test_answer_about_another_user_fails_closed() -> None:
    """Even a superuser context is refused when it describes somebody else."""

    async def impostor(_: dict[str, Any]) -> bytes:
        return http_response(200, ac_json("@mallory:localhost"))

    before = _count(ACP_ERRORS, "user_mismatch")
    result, _ = await check_against(impostor)
    assert result == AccessResult(False, "bad_provider_answer", None)
    assert _count(ACP_ERRORS, "user_mismatch") == before + 1


async def test_closed_port_fails_closed() -> None:
    port = free_port()  # nothing listens there
    p = AccessProvider(f"http://127.0.0.1:{port}", timeout=2.0, agent_id="vagent")
    before = _count(ACP_ERRORS, "transport")
    try:
        result = await p.check(ALICE, DOMAIN)
    finally:
        await p.aclose()
    assert result == AccessResult(False, "provider_error", None)
    assert _count(ACP_ERRORS, "transport") == before + 1


async def test_denials_and_failures_are_logged(
    capsys: pytest.CaptureFixture[str], json_logs: Callable[[], None]
) -> None:
    """Audit trail: `access_denied` (WARNING) for every denial, `acp_unavailable` (ERROR) on failures."""
    json_logs()  # JSON lines on the (captured) stdout

    async def broken(_: dict[str, Any]) -> bytes:
        return http_response(500, b"{}")

    await check_against(broken)
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    events = {ln["event"]: ln for ln in lines if ln.get("logger") == "vagent_bot.access.provider"}
    unavailable, denied = events["acp_unavailable"], events["access_denied"]
    assert unavailable["level"] == "error" and unavailable["reason"] == "provider_error"
    assert unavailable["status"] == 500
    assert denied["level"] == "warning"
    assert {"user_id": ALICE, "domain": DOMAIN, "reason": "provider_error"}.items() <= denied.items()


async def test_empty_user_or_domain_is_denied_without_asking(provider: AccessProvider) -> None:
    for user, domain in (("", DOMAIN), (ALICE, "")):
        assert await provider.check(user, domain) == AccessResult(False, "provider_error", None)


# --------------------------------------------------------------------------- domain mismatch


@pytest.mark.parametrize(
    "answered_domain",
    ["other.example", "LOCALHOST", "localhost ", "*"],
    ids=["another_tenant", "case_differs", "trailing_space", "wildcard"],
)
async def test_an_answer_for_another_domain_fails_closed_and_is_audited(
    redis_url: str, capsys: pytest.CaptureFixture[str], answered_domain: str, json_logs: Callable[[], None]
) -> None:
    """A provider that answers (even a superuser with the agent grant) for a domain other than
    the room's tenant: no access, `domain_mismatch` counted once, an `access_denied` log line
    with both domains and an `access_denied` audit event naming both, in the real stream."""
    json_logs()
    stream = f"audit-mismatch-{uuid.uuid4().hex[:8]}"
    redis = Redis.from_url(redis_url)
    trail = AuditTrail("bot", redis, stream)
    trail.start()
    labels = ("domain_mismatch", "granted", "superuser", "no_agent_grant", "bad_provider_answer")
    before = {label: _count(ACCESS, label) for label in labels}
    errors_before = {kind: _count(ACP_ERRORS, kind) for kind in ("bad_answer", "user_mismatch")}

    async def elsewhere(body: dict[str, Any]) -> bytes:
        return http_response(200, ac_json(body["user_id"], domain=answered_domain))

    try:
        async with FakeProvider(elsewhere) as fake:
            p = AccessProvider(fake.url, timeout=5.0, agent_id="vagent", audit=trail)
            try:
                result = await p.check(ALICE, DOMAIN)
            finally:
                await p.aclose()
        await trail.flush()
        entries = await redis.xrange(stream)
    finally:
        await trail.aclose()
        await redis.delete(stream)
        await redis.aclose()

    assert fake.requests == [{"user_id": ALICE, "domain": DOMAIN}]
    assert result == AccessResult(False, "domain_mismatch", None)
    after = {label: _count(ACCESS, label) for label in labels}
    assert after == {**before, "domain_mismatch": before["domain_mismatch"] + 1}
    assert {kind: _count(ACP_ERRORS, kind) for kind in errors_before} == errors_before

    events = [AuditEvent.from_stream(fields or {}) for _, fields in entries or []]
    assert len(events) == 1
    event = events[0]
    assert (event.service, event.event_type, event.decision) == ("bot", "access_denied", "denied")
    assert (event.user_id, event.domain, event.resource) == (ALICE, DOMAIN, "agent:vagent")
    assert event.reason == (
        f"domain_mismatch: provider answered domain {answered_domain!r} for tenant {DOMAIN!r}"
    )

    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    access_lines = [ln for ln in lines if ln.get("logger") == "vagent_bot.access.provider"]
    assert [ln["event"] for ln in access_lines] == ["access_denied"]
    denied = access_lines[0]
    assert denied["level"] == "warning"
    assert {
        "user_id": ALICE,
        "domain": DOMAIN,
        "active_acl_domain": answered_domain,
        "reason": "domain_mismatch",
    }.items() <= denied.items()
    assert not any(ln.get("event") == "access_granted" for ln in lines)


async def test_member_context_of_another_domain_is_still_returned() -> None:
    """`context()` (other room members) is no access decision: it passes the answer on, and the
    graph lets a member of another domain read nothing. Nothing is counted as a decision."""

    async def elsewhere(body: dict[str, Any]) -> bytes:
        return http_response(200, ac_json(body["user_id"], domain="other.example"))

    before = _count(ACCESS, "domain_mismatch")
    async with FakeProvider(elsewhere) as fake:
        p = AccessProvider(fake.url, timeout=5.0, agent_id="vagent")
        try:
            ac = await p.context(DAVE, DOMAIN)
        finally:
            await p.aclose()
    assert ac is not None and ac.active_acl_domain == "other.example"
    assert _count(ACCESS, "domain_mismatch") == before
