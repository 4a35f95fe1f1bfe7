"""The room audience over real HTTP: `AccessProvider.context` and the resolver against the real
`vagent-acp` subprocess, and against small misbehaving providers on loopback sockets.

Why real sockets: what must hold for a room (a member's failure never breaks the message, the
provider is never flooded, a slow provider costs one timeout, not one per member) depends on
real connections, real timeouts and real concurrency, which only a real server shows.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from procutil import free_port

from tests.support.http_standin import HttpStandIn
from tests.support.procs import ServiceProcess
from vagent_bot.access.audience import RoomAudience, fetch_members
from vagent_bot.access.provider import BotAccessProvider as AccessProvider
from vagent_bot.observability.metrics import ACCESS, ACP_ERRORS
from vagent_shared.knowledge import Audience

DOMAIN = "localhost"
BOT, ALICE, DAVE, ADMIN = "@vagent:localhost", "@alice:localhost", "@dave:localhost", "@admin:localhost"
MALLORY, ERIN = "@mallory:localhost", "@erin:localhost"  # unknown; listed in another domain only
ROOM = "!room:localhost"

POLICY: dict[str, Any] = {
    "superusers": [ADMIN],
    "domains": {
        DOMAIN: {
            "users": {ALICE: ["operator"], DAVE: ["reader"]},
            "roles": {
                "operator": ["agent:vagent", "tool:search_documents", "document_category:finance"],
                "reader": ["document_tag:public"],  # may read, may not talk to the agent
            },
        },
        "acme": {"users": {ERIN: ["reader"]}, "roles": {"reader": ["document_tag:public"]}},
    },
}


def write_policy(path: Path, policy: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(policy))
    tmp.replace(path)  # atomically, so the provider never reads half a file


@pytest.fixture(scope="module")
def acp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("audience-acp")
    policy, port = tmp / "policy.yaml", free_port()
    write_policy(policy, POLICY)
    env = {"ACP_HOST": "127.0.0.1", "ACP_PORT": str(port), "ACP_POLICY_FILE": str(policy)}
    server = ServiceProcess("vagent-acp", env, tmp / "acp.log", f"http://127.0.0.1:{port}/health").start()
    yield server
    server.stop()


def acp_url(acp: ServiceProcess) -> str:
    return f"http://127.0.0.1:{acp.env['ACP_PORT']}"


@pytest.fixture
async def provider(acp: ServiceProcess) -> AsyncIterator[AccessProvider]:
    p = AccessProvider(acp_url(acp), timeout=5.0, agent_id="vagent")
    yield p
    await p.aclose()


def room(provider: AccessProvider, joined: list[str], *, concurrency: int = 8) -> RoomAudience:
    async def list_joined(room_id: str) -> list[str]:
        return joined

    return RoomAudience(
        list_joined=list_joined,
        fetch=provider.context,
        max_members=50,
        concurrency=concurrency,
        timeout=provider.timeout,
    )


async def resolve(provider: AccessProvider, joined: list[str], **kw: Any) -> Audience:
    return await room(provider, joined, **kw).resolve(ROOM, bot=BOT, sender=ALICE, domain=DOMAIN)


def contexts(audience: Audience) -> dict[str, list[str] | None]:
    """Each member's active roles, None when unresolved."""
    return {m.user_id: m.ac_context.active_roles if m.ac_context else None for m in audience.members}


def decisions() -> float:
    """All agent-access decisions counted so far."""
    return sum(s.value for m in ACCESS.collect() for s in m.samples if s.name.endswith("_total"))


def _count(metric: Any, label: str) -> float:
    return float(metric.labels(label)._value.get())


# --------------------------------------------------------------------------- the real provider


async def test_members_are_resolved_for_reading_without_an_access_decision(
    provider: AccessProvider,
    acp: ServiceProcess,
    capsys: pytest.CaptureFixture[str],
    json_logs: Callable[[], None],
) -> None:
    """Dave may not use the agent but sits in the room: his context counts for what he reads."""
    json_logs()
    before = decisions()
    audience = await resolve(provider, [BOT, ALICE, DAVE, ADMIN, MALLORY, ERIN])
    assert audience.member_count == 6 and not audience.public_only
    assert contexts(audience) == {DAVE: ["reader"], ADMIN: [], MALLORY: None, ERIN: None}
    admin = audience.members[1].ac_context
    assert admin is not None and admin.is_superuser()

    assert decisions() == before  # no member was "denied the agent" for sitting in a room
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert not [ln for ln in lines if ln["event"] in ("access_denied", "access_granted", "acp_unavailable")]
    [summary] = [ln for ln in lines if ln["event"] == "audience_resolved"]
    assert {"member_count": 6, "members": 4, "unresolved": 2, "public_only": False}.items() <= summary.items()
    assert sorted(summary["unresolved_users"]) == [ERIN, MALLORY]
    asked = [ln["user_id"] for ln in acp.log_records() if ln.get("event") == "acp_decision"][-4:]
    assert sorted(asked) == sorted([DAVE, ADMIN, MALLORY, ERIN])  # never the bot or the sender


async def test_every_message_asks_the_provider_again(provider: AccessProvider, acp: ServiceProcess) -> None:
    """No caching beyond one message: a member whose grant is revoked reads nothing next time."""
    policy_path = Path(acp.env["ACP_POLICY_FILE"])
    assert contexts(await resolve(provider, [BOT, ALICE, DAVE])) == {DAVE: ["reader"]}
    revoked = json.loads(json.dumps(POLICY))
    del revoked["domains"][DOMAIN]["users"][DAVE]
    write_policy(policy_path, revoked)
    try:
        assert contexts(await resolve(provider, [BOT, ALICE, DAVE])) == {DAVE: None}
    finally:
        write_policy(policy_path, POLICY)
    assert contexts(await resolve(provider, [BOT, ALICE, DAVE])) == {DAVE: ["reader"]}


async def test_the_access_check_of_the_sender_is_unchanged(provider: AccessProvider) -> None:
    """`check` and `context` share the HTTP call; only `check` decides (and audits)."""
    before = decisions()
    assert (await provider.check(DAVE, DOMAIN)).reason == "no_agent_grant"
    assert (await provider.context(DAVE, DOMAIN)) is not None
    assert decisions() == before + 1


# --------------------------------------------------------------------------- misbehaving providers

Respond = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]


def http(status: int, body: bytes) -> tuple[int, bytes]:
    return status, body


def ac_json(user: str) -> bytes:
    return json.dumps(
        {
            "userId": user,
            "activeAclDomain": DOMAIN,
            "activeRoles": ["reader"],
            "superuserGroups": [],
            "roles": {DOMAIN: [{"name": "reader", "instances": ["document_tag:public"]}]},
        }
    ).encode()


def stand_in(respond: Respond) -> HttpStandIn:
    """A provider answering every request with `respond(body)`."""

    async def answer(method: str, path: str, body: Any) -> tuple[int, bytes]:
        return await respond(body)

    return HttpStandIn(answer)


def asked(provider: HttpStandIn) -> list[str]:
    """The users the provider was asked about, in arrival order."""
    return [body["user_id"] for body in provider.bodies]


async def resolved_against(
    respond: Respond, joined: list[str], acp_timeout: float = 2.0, **kw: Any
) -> Audience:
    async with stand_in(respond) as provider:
        p = AccessProvider(provider.url, timeout=acp_timeout, agent_id="vagent")
        try:
            return await resolve(p, joined, **kw)
        finally:
            await p.aclose()


async def answer_ok(body: dict[str, Any]) -> tuple[int, bytes]:
    return http(200, ac_json(body["user_id"]))


async def answer_500(_: dict[str, Any]) -> tuple[int, bytes]:
    return http(500, b'{"error_code": "boom"}')


async def answer_garbage(_: dict[str, Any]) -> tuple[int, bytes]:
    return http(200, b"<html>proxy error</html>")


async def answer_somebody_else(_: dict[str, Any]) -> tuple[int, bytes]:
    return http(200, ac_json(MALLORY))


async def answer_403(_: dict[str, Any]) -> tuple[int, bytes]:
    return http(403, b'{"error_code": "not_in_domain"}')


async def hang(body: dict[str, Any]) -> tuple[int, bytes]:
    await asyncio.sleep(60)
    return http(200, ac_json(body["user_id"]))


@pytest.mark.parametrize(
    ("respond", "kind"),
    [
        (answer_500, "http_5xx"),
        (answer_garbage, "bad_answer"),
        (answer_somebody_else, "user_mismatch"),
        (hang, "timeout"),
        (answer_403, None),
    ],
    ids=["500", "garbage", "user_mismatch", "slow", "403"],
)
async def test_a_member_the_provider_cannot_answer_for_is_unresolved(
    respond: Respond, kind: str | None
) -> None:
    before = _count(ACP_ERRORS, kind) if kind else 0.0
    before_decisions = decisions()
    audience = await resolved_against(respond, [BOT, ALICE, DAVE], acp_timeout=0.5)
    assert contexts(audience) == {DAVE: None} and not audience.public_only
    if kind:  # the provider's health shows in its error counter
        assert _count(ACP_ERRORS, kind) == before + 1
    assert decisions() == before_decisions


async def test_one_bad_answer_does_not_spoil_the_others() -> None:
    async def mixed(body: dict[str, Any]) -> tuple[int, bytes]:
        return await (answer_500 if body["user_id"] == MALLORY else answer_ok)(body)

    audience = await resolved_against(mixed, [BOT, ALICE, DAVE, MALLORY, ERIN])
    assert contexts(audience) == {DAVE: ["reader"], MALLORY: None, ERIN: ["reader"]}


async def test_requests_in_flight_never_exceed_the_concurrency() -> None:
    async def slowish(body: dict[str, Any]) -> tuple[int, bytes]:
        await asyncio.sleep(0.05)
        return http(200, ac_json(body["user_id"]))

    members = [f"@m{i}:localhost" for i in range(24)]
    async with stand_in(slowish) as provider:
        p = AccessProvider(provider.url, timeout=5.0, agent_id="vagent")
        try:
            audience = await resolve(p, [BOT, ALICE, *members], concurrency=5)
        finally:
            await p.aclose()
    assert provider.max_in_flight == 5
    assert sorted(asked(provider)) == sorted(members)  # each member asked exactly once
    assert all(m.ac_context is not None for m in audience.members)


async def test_many_slow_members_cost_about_one_timeout() -> None:
    members = [f"@m{i}:localhost" for i in range(40)]
    async with stand_in(hang) as provider:
        p = AccessProvider(provider.url, timeout=0.5, agent_id="vagent")
        start = time.monotonic()
        try:
            audience = await resolve(p, [BOT, ALICE, *members], concurrency=4)
        finally:
            await p.aclose()
        elapsed = time.monotonic() - start
    assert elapsed < 3, elapsed  # not 40 / 4 x 0.5 s = 5 s
    assert len(audience.members) == 40 and all(m.ac_context is None for m in audience.members)
    # at most two rounds of 4 were sent before the deadline; the rest were never asked
    assert len(asked(provider)) <= 8


async def test_a_provider_that_is_down_leaves_everyone_unresolved() -> None:
    p = AccessProvider(f"http://127.0.0.1:{free_port()}", timeout=2.0, agent_id="vagent")
    try:
        members = await fetch_members((DAVE, ERIN), lambda u: p.context(u, DOMAIN), concurrency=8, within=2.0)
    finally:
        await p.aclose()
    assert [m.ac_context for m in members] == [None, None]
