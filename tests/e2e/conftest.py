"""The whole product for end-to-end tests: a real Synapse, Redis, the graph service on the
scripted OpenAI-compatible LLM, the development AccessControlProvider and the bot, each a
real process on 127.0.0.1. Humans are matrix-nio clients (tests/support/matrix_human.py)."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis

from redis_local import free_port
from synapse_local import SynapseServer
from tests.support.graph_process import TOKEN, GraphProcess
from tests.support.llm_server import ScriptedLLMServer, TextResponse
from tests.support.matrix_human import HumanClient, syncing_human
from tests.support.procs import ServiceProcess, credential_registry, ticket_service
from vagent_shared import redis_keys

DOMAIN = "localhost"
ROLES = {
    "operator": [
        "agent:vagent",
        "tool:ask_user",
        "tool:database_query",
        "tool:delete_records",
        "tool:search_documents",
        "tool:list_my_tickets",
        "tool:create_ticket",
        "mcp_server:calendar",  # the calendar MCP server's tools (tests/e2e/test_mcp_e2e.py)
        "document_category:finance",
        "document_tag:public",
    ],
    # known to the provider, but no agent access; reads public documents (as a room member)
    "guest": ["tool:ask_user", "document_tag:public"],
}


@dataclass
class Users:
    passwords: dict[str, str]
    bot: str
    alice: str  # operator
    bob: str  # operator too: has access, but must not answer alice's questions
    carol: str  # in the policy without agent access
    dave: str  # unknown to the provider
    erin: str  # operator: the third person of the fault suite's busy rooms


@pytest.fixture(scope="session")
def users(synapse: SynapseServer) -> Users:
    pw = {name: secrets.token_urlsafe(12) for name in ("vagent", "alice", "bob", "carol", "dave", "erin")}
    ids = {name: synapse.register_user(name, p) for name, p in pw.items()}
    return Users(
        passwords={ids[n]: p for n, p in pw.items()},
        bot=ids["vagent"],
        alice=ids["alice"],
        bob=ids["bob"],
        carol=ids["carol"],
        dave=ids["dave"],
        erin=ids["erin"],
    )


def echo_llm(request: dict[str, Any]) -> TextResponse:
    """Default answer: quotes the last user message, so each reply names its question."""
    last = next((m for m in reversed(request["messages"]) if m["role"] == "user"), {"content": ""})
    return TextResponse(f"You said: {last['content']}")


class Stack:
    def __init__(
        self, tmp: Path, synapse: SynapseServer, redis_url: str, llm: ScriptedLLMServer, users: Users
    ) -> None:
        self.tmp, self.synapse, self.redis_url, self.llm, self.users = tmp, synapse, redis_url, llm, users
        self.policy = tmp / "policy.yaml"
        self.write_policy()
        acp_port = free_port()
        self.acp = ServiceProcess(
            "vagent-acp",
            {"ACP_PORT": str(acp_port), "ACP_HOST": "127.0.0.1", "ACP_POLICY_FILE": str(self.policy)},
            tmp / "acp.log",
            f"http://127.0.0.1:{acp_port}/health",
        )
        self.acp_url = f"http://127.0.0.1:{acp_port}"
        self.ticket_keys = {
            users.alice: f"e2e-key-alice-{secrets.token_hex(8)}",
            users.bob: f"e2e-key-bob-{secrets.token_hex(8)}",
        }
        self.registry, self.tickets = self.credential_services(tmp)
        self.graph = GraphProcess(
            redis_url,
            tmp / "graph",
            llm.base_url,
            CREDENTIAL_REGISTRY_URL=self.registry.base_url,
            CREDENTIAL_CACHE_KEY=base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
            TICKETS_URL=self.tickets.base_url,
        )
        self.bots: list[ServiceProcess] = []

    def credential_services(self, tmp: Path) -> tuple[ServiceProcess, ServiceProcess]:
        """The development Credential Registry and the ticket service, with keys for alice and
        bob only (carol has none)."""
        policy = {
            "domains": {
                DOMAIN: {
                    "resources": {
                        "tickets": {"type": "api_key", "ttl_seconds": 3600, "users": self.ticket_keys}
                    }
                }
            }
        }
        (tmp / "credentials.yaml").write_text(yaml.safe_dump(policy))
        seed = {
            "keys": {key: user for user, key in self.ticket_keys.items()},
            "tickets": [
                {"owner": self.users.alice, "title": "Alice's VPN", "status": "open", "priority": "high"},
                {"owner": self.users.bob, "title": "Bob's monitor", "status": "open", "priority": "low"},
            ],
        }
        (tmp / "tickets.yaml").write_text(yaml.safe_dump(seed))
        registry = credential_registry(tmp, tmp / "credentials.yaml")
        return registry, ticket_service(tmp, tmp / "tickets.yaml", db_name="tickets.db")

    def write_policy(self) -> None:
        u = self.users
        policy = {
            "superusers": [],
            "domains": {
                DOMAIN: {
                    "users": {
                        u.alice: ["operator"],
                        u.bob: ["operator"],
                        u.carol: ["guest"],
                        u.erin: ["operator"],
                    },
                    "roles": ROLES,
                }
            },
        }
        self.policy.write_text(yaml.safe_dump(policy))

    def bot_env(self, name: str) -> dict[str, str]:
        return {
            "MATRIX_HOMESERVER": self.synapse.url,
            "MATRIX_USER": self.users.bot,
            "MATRIX_PASSWORD": self.users.passwords[self.users.bot],
            "MATRIX_STORE_PATH": str(self.tmp / f"{name}-store"),
            "REDIS_URL": self.redis_url,
            "GRAPH_API_ENDPOINT": self.graph.url,
            "GRAPH_API_TOKEN": TOKEN,
            "ACCESS_CONTROL_PROVIDER_URL": self.acp_url,
            "DEFAULT_DOMAIN": DOMAIN,
            "BOT_HEALTH_HOST": "127.0.0.1",
            "BOT_HEALTH_PORT": str(free_port()),
            "EDIT_FIRST_DELAY_SECONDS": "0.3",
            "LOG_LEVEL": "DEBUG",
            "FLOOD_MAX_MESSAGES": "1000",  # the flood test runs its own strict bot
        }

    def new_bot(self, name: str, **overrides: str) -> ServiceProcess:
        env = {**self.bot_env(name), **overrides}
        bot = ServiceProcess(
            "vagent-bot", env, self.tmp / f"{name}.log", f"http://127.0.0.1:{env['BOT_HEALTH_PORT']}/health"
        )
        self.bots.append(bot)
        return bot

    @property
    def main_bot(self) -> ServiceProcess:
        """The bot every test talks to unless it runs its own."""
        return self.bots[0]

    @contextmanager
    def another_bot(self, name: str, **overrides: str) -> Iterator[ServiceProcess]:
        """One more bot process for the block (store `name`, env overrides); stopped after it."""
        bot = self.new_bot(name, **overrides)
        try:
            yield bot.start()
        finally:
            bot.stop()
            self.bots.remove(bot)

    async def redis_delete(self, key: str) -> None:
        """Removes one key from the stack's Redis, as an expiry would."""
        redis = Redis.from_url(self.redis_url)
        try:
            await redis.delete(key)
        finally:
            await redis.aclose()

    async def question_saved(self, question_event_id: str, timeout: float = 10) -> None:  # noqa: ASYNC109
        """Until the bot has stored the question it just posted. It posts first (the event id
        is the key), so a client that sees the question can be a moment ahead of Redis."""
        redis = Redis.from_url(self.redis_url)
        deadline = time.monotonic() + timeout
        try:
            while not await redis.exists(redis_keys.hitl_question(question_event_id)):
                assert time.monotonic() < deadline, f"question {question_event_id} was never stored"
                await asyncio.sleep(0.05)
        finally:
            await redis.aclose()

    def logs(self) -> str:
        return "\n".join(b.logs() for b in self.bots)


@contextmanager
def down(service: ServiceProcess, crash: bool = False) -> Iterator[None]:
    """The service is down for the block (SIGTERM, or SIGKILL as a crash), started again after it."""
    if crash:
        service.kill()
    else:
        service.stop()
    try:
        yield
    finally:
        service.start()


def log_tail(service: ServiceProcess, lines: int = 60) -> str:
    """The last `lines` non-debug lines of a service's log, cut to 400 characters each."""
    kept = [ln for ln in service.logs().splitlines() if '"level": "debug"' not in ln]
    return "\n".join(ln[:400] for ln in kept[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed end-to-end test shows what the bots and the graph were doing: a timeout in
    Matrix says only that nothing came; their logs say why (CI keeps nothing else)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.failed and report.when == "call" and isinstance(stack, Stack):
        for bot in stack.bots:
            report.sections.append((f"log of {bot.log_path.name}", log_tail(bot)))
        report.sections.append(("log of the graph", log_tail(stack.graph)))


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    synapse: SynapseServer,
    redis_url: str,
    _llm_session: ScriptedLLMServer,
    users: Users,
) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("stack"), synapse, redis_url, _llm_session, users)
    s.acp.start()
    s.registry.start()
    s.tickets.start()
    s.graph.start()
    s.new_bot("bot").start()
    yield s
    for b in s.bots:
        b.stop()
    s.graph.stop()
    s.tickets.stop()
    s.registry.stop()
    s.acp.stop()


@pytest.fixture
def llm(stack: Stack, llm_server: ScriptedLLMServer) -> ScriptedLLMServer:
    """The stack's LLM (the session's, which `llm_server` empties around the test), answering
    with echo_llm unless the test scripts something else."""
    llm_server.set_default(echo_llm)
    return llm_server


Login = Callable[[str], Awaitable[HumanClient]]


@pytest.fixture
async def humans(stack: Stack, tmp_path: Path) -> AsyncIterator[Login]:
    """Logs one of `users` in as a syncing HumanClient; all are closed after the test."""
    async with AsyncExitStack() as logged_in:

        async def login(user_id: str) -> HumanClient:
            store = tmp_path / user_id.strip("@").replace(":", "_")
            password = stack.users.passwords[user_id]
            human = syncing_human(stack.synapse.url, user_id, password, store)
            return await logged_in.enter_async_context(human)

        yield login


@pytest.fixture
async def alice(humans: Login, stack: Stack) -> HumanClient:
    return await humans(stack.users.alice)


@pytest.fixture
async def bob(humans: Login, stack: Stack) -> HumanClient:
    return await humans(stack.users.bob)


@pytest.fixture
async def carol(humans: Login, stack: Stack) -> HumanClient:
    return await humans(stack.users.carol)
