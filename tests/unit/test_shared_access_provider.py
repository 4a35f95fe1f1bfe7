"""The shared AccessControlProvider client (`vagent_shared.access_provider`) as the gateway will
use it: without the bot, its metrics hooks are the only way a service counts decisions, provider
failures and latency, and `UNAVAILABLE_REASONS` is how it tells "the provider is down" (503)
from "this person may not" (403). Against a real local HTTP server (tests/support/http_standin.py),
since refused connections, timeouts and garbage answers only come from real sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from procutil import free_port

from tests.support.http_standin import HttpStandIn
from vagent_shared.access_provider import (
    AUTHENTICATE_PATH,
    BAD_PROVIDER_ANSWER,
    DOMAIN_MISMATCH,
    GRANTED,
    NO_AGENT_GRANT,
    PROVIDER_DENIED,
    PROVIDER_ERROR,
    PROVIDER_TIMEOUT,
    SUPERUSER,
    UNAVAILABLE_REASONS,
    AccessProvider,
    AccessResult,
    ProviderMetrics,
)

pytestmark = pytest.mark.timeout(30)

ALICE, DOMAIN = "@alice:example.org", "example.org"
Answer = tuple[int, Any]


@dataclass
class Recorded:
    """What the hooks were called with, in order."""

    decisions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def metrics(self) -> ProviderMetrics:
        return ProviderMetrics(
            decision=self.decisions.append, error=self.errors.append, seconds=self.seconds.append
        )


def ac(user: str = ALICE, domain: str = DOMAIN, instances: list[str] | None = None, **extra: Any) -> Any:
    """An AcContext as the provider sends it; by default one that grants the agent."""
    return {
        "userId": user,
        "activeAclDomain": domain,
        "activeRoles": ["member"],
        "superuserGroups": [],
        "roles": {
            domain: [{"name": "member", "instances": ["agent:vagent"] if instances is None else instances}]
        },
        **extra,
    }


def answering(status: int, body: Any) -> Callable[[str, str, Any], Awaitable[Answer]]:
    async def respond(method: str, path: str, _: Any) -> Answer:
        return status, body

    return respond


async def hang(method: str, path: str, _: Any) -> Answer:
    await asyncio.sleep(30)  # cancelled when the stand-in closes
    return 200, ac()


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


async def check_with(
    respond: Callable[[str, str, Any], Awaitable[Answer]], rec: Recorded, acp_timeout: float = 5.0
) -> tuple[AccessResult, HttpStandIn]:
    async with HttpStandIn(respond) as acp:
        p = AccessProvider(acp.url, acp_timeout, "vagent", metrics=rec.metrics())
        try:
            return await p.check(ALICE, DOMAIN), acp
        finally:
            await p.aclose()


# --------------------------------------------------------------------------- metrics hooks


async def test_a_grant_is_one_decision_and_one_timed_call_and_no_error(recorded: Recorded) -> None:
    result, acp = await check_with(answering(200, ac()), recorded)
    assert result.allowed and result.reason == GRANTED and result.ac is not None
    assert recorded.decisions == [GRANTED]
    assert recorded.errors == []
    assert len(recorded.seconds) == 1 and 0 <= recorded.seconds[0] < 5
    assert [(m, p, b) for m, p, b, _ in acp.requests] == [
        ("POST", AUTHENTICATE_PATH, {"user_id": ALICE, "domain": DOMAIN})
    ]


async def test_a_hanging_provider_is_timed_for_as_long_as_it_was_waited_for(recorded: Recorded) -> None:
    result, _ = await check_with(hang, recorded, acp_timeout=0.3)
    assert result == AccessResult(False, PROVIDER_TIMEOUT, None)
    assert recorded.errors == ["timeout"]
    assert recorded.decisions == [PROVIDER_TIMEOUT]
    (took,) = recorded.seconds
    assert 0.25 <= took < 3  # the whole call was bounded by the timeout


@pytest.mark.parametrize(
    ("respond", "reason", "kind"),
    [
        (answering(500, {"detail": "boom"}), PROVIDER_ERROR, "http_5xx"),
        (answering(200, b"<html>not json</html>"), BAD_PROVIDER_ANSWER, "bad_answer"),
        (answering(200, ac(user="@mallory:example.org")), BAD_PROVIDER_ANSWER, "user_mismatch"),
    ],
    ids=["http_500", "garbage", "answer_about_someone_else"],
)
async def test_each_provider_failure_calls_the_error_hook_with_its_kind(
    recorded: Recorded, respond: Callable[[str, str, Any], Awaitable[Answer]], reason: str, kind: str
) -> None:
    result, _ = await check_with(respond, recorded)
    assert result == AccessResult(False, reason, None)
    assert recorded.errors == [kind]
    assert recorded.decisions == [reason]
    assert len(recorded.seconds) == 1


async def test_a_refused_connection_is_a_transport_error(recorded: Recorded) -> None:
    p = AccessProvider(f"http://127.0.0.1:{free_port()}", 2.0, "vagent", metrics=recorded.metrics())
    try:
        result = await p.check(ALICE, DOMAIN)
    finally:
        await p.aclose()
    assert result == AccessResult(False, PROVIDER_ERROR, None)
    assert (recorded.decisions, recorded.errors, len(recorded.seconds)) == (
        [PROVIDER_ERROR],
        ["transport"],
        1,
    )


async def test_a_refusal_by_the_provider_is_a_decision_not_an_error(recorded: Recorded) -> None:
    result, _ = await check_with(answering(403, {"detail": "unknown user"}), recorded)
    assert result == AccessResult(False, PROVIDER_DENIED, None)
    assert recorded.decisions == [PROVIDER_DENIED] and recorded.errors == []


async def test_context_counts_provider_failures_but_makes_no_decision(recorded: Recorded) -> None:
    """Looking up a room member is no access decision: only the provider's health is counted."""
    async with HttpStandIn(answering(502, b"bad gateway")) as acp:
        p = AccessProvider(acp.url, 5.0, "vagent", metrics=recorded.metrics())
        try:
            assert await p.context(ALICE, DOMAIN) is None
        finally:
            await p.aclose()
    assert recorded.decisions == [] and recorded.errors == ["http_5xx"] and len(recorded.seconds) == 1


async def test_without_metrics_nothing_is_required() -> None:
    async with HttpStandIn(answering(200, ac())) as acp:
        p = AccessProvider(acp.url, 5.0, "vagent")
        try:
            assert (await p.check(ALICE, DOMAIN)).allowed
        finally:
            await p.aclose()


# --------------------------------------------------------------------------- 503 or 403


@pytest.mark.parametrize(
    ("respond", "reason"),
    [
        (hang, PROVIDER_TIMEOUT),
        (answering(500, {}), PROVIDER_ERROR),
        (answering(200, b"{"), BAD_PROVIDER_ANSWER),
        (answering(200, {"userId": ALICE}), BAD_PROVIDER_ANSWER),  # valid JSON, not an AcContext
    ],
    ids=["timeout", "http_500", "truncated_json", "incomplete_context"],
)
async def test_no_trustworthy_answer_is_unavailable(
    recorded: Recorded, respond: Callable[[str, str, Any], Awaitable[Answer]], reason: str
) -> None:
    result, _ = await check_with(respond, recorded, acp_timeout=0.3)
    assert not result.allowed and result.reason == reason
    assert result.reason in UNAVAILABLE_REASONS  # a caller answers 503: try again later


async def test_a_refused_connection_is_unavailable(recorded: Recorded) -> None:
    p = AccessProvider(f"http://127.0.0.1:{free_port()}", 2.0, "vagent")
    try:
        result = await p.check(ALICE, DOMAIN)
    finally:
        await p.aclose()
    assert not result.allowed and result.reason in UNAVAILABLE_REASONS


@pytest.mark.parametrize(
    ("respond", "reason"),
    [
        (answering(403, {"detail": "no"}), PROVIDER_DENIED),
        (answering(404, {"detail": "unknown user"}), PROVIDER_DENIED),
        (answering(200, ac(instances=["tool:ask_user"])), NO_AGENT_GRANT),
        (answering(200, ac(instances=["agent:other-agent"])), NO_AGENT_GRANT),
        (answering(200, ac(domain="other.example")), DOMAIN_MISMATCH),
    ],
    ids=["403", "404", "no_agent_role", "another_agent_only", "another_domain"],
)
async def test_a_real_refusal_is_not_unavailable(
    recorded: Recorded, respond: Callable[[str, str, Any], Awaitable[Answer]], reason: str
) -> None:
    result, _ = await check_with(respond, recorded)
    assert not result.allowed and result.reason == reason
    assert result.reason not in UNAVAILABLE_REASONS  # a caller answers 403: asking again will not help
    assert recorded.errors == []  # the provider is healthy


@pytest.mark.parametrize(
    ("body", "reason"),
    [(ac(), GRANTED), (ac(instances=[], superuserGroups=["admins"]), SUPERUSER)],
    ids=["granted", "superuser"],
)
async def test_allowed_reasons_are_not_unavailable(recorded: Recorded, body: Any, reason: str) -> None:
    result, _ = await check_with(answering(200, body), recorded)
    assert result.allowed and result.reason == reason and reason not in UNAVAILABLE_REASONS


def test_unavailable_reasons_are_exactly_the_provider_failures() -> None:
    assert frozenset({PROVIDER_ERROR, PROVIDER_TIMEOUT, BAD_PROVIDER_ANSWER}) == UNAVAILABLE_REASONS


# --------------------------------------------------------------------------- the injected proxy


async def test_the_proxy_passed_in_is_used_and_the_environment_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared client reads no proxy variables (each service decides); `proxy=` is honoured."""

    async def as_proxy(method: str, path: str, body: Any) -> Answer:
        return 200, ac(user=body["user_id"])

    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HTTP_PROXY", dead)
    monkeypatch.setenv("http_proxy", dead)
    async with HttpStandIn(as_proxy) as proxy:
        through = AccessProvider("http://acp.invalid:8090", 5.0, "vagent", proxy=proxy.url)
        direct = AccessProvider(proxy.url, 5.0, "vagent")  # the dead HTTP_PROXY is ignored
        try:
            assert (await through.check(ALICE, DOMAIN)).allowed
            assert (await direct.check(ALICE, DOMAIN)).allowed
        finally:
            await through.aclose()
            await direct.aclose()
    paths = [path for _, path, _, _ in proxy.requests]
    assert paths == [f"http://acp.invalid:8090{AUTHENTICATE_PATH}", AUTHENTICATE_PATH]
    assert json.dumps(proxy.bodies[0]) == json.dumps({"user_id": ALICE, "domain": DOMAIN})
