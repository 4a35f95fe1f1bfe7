"""Faults, end to end: the bot killed again and again while people talk to it, the access
control provider slow or down, the model endpoint failing before or during its stream.

Everything is a real process on 127.0.0.1 (tests/e2e/conftest.py); every test is bounded by
its own timeout. `make test` kills the bot over 45 messages; `make soak` (marker `soak`) runs
the same scenario longer (SOAK_MESSAGES, 500 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import pytest

from tests.e2e.conftest import Login, Stack, down, echo_llm
from tests.e2e.test_bot_e2e import dm_with_bot, echoed, group, tenant_room
from tests.support.http_standin import HttpStandIn
from tests.support.llm_server import ScriptedLLMServer, TextResponse
from tests.support.matrix_human import HumanClient
from tests.support.procs import ServiceProcess

pytestmark = pytest.mark.e2e

#: The lease of a claimed event: how long a killed bot's unfinished messages wait for the next one.
LEASE_SECONDS = "3"


@dataclass
class Sent:
    event_id: str
    room_id: str
    text: str


@dataclass
class SoakResult:
    sent: list[Sent] = field(default_factory=list)
    kills: int = 0
    restart_seconds: list[float] = field(default_factory=list)
    send_seconds: float = 0.0
    settle_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        restarts = sorted(self.restart_seconds)
        return {
            "messages": len(self.sent),
            "kills": self.kills,
            "restart_p50_s": round(restarts[len(restarts) // 2], 2) if restarts else None,
            "restart_max_s": round(restarts[-1], 2) if restarts else None,
            "sending_s": round(self.send_seconds, 1),
            "all_answered_after_last_send_s": round(self.settle_seconds, 1),
        }


def streamed_echo(request: dict[str, Any]) -> TextResponse:
    """The echo answer in 3 pieces 0.1 s apart, so a kill can land in the middle of an answer."""
    return TextResponse(echo_llm(request).content, chunks=3, delay=0.1)


async def killer(
    bot: ServiceProcess,
    rng: random.Random,
    stop: asyncio.Event,
    result: SoakResult,
    every: tuple[float, float],
) -> None:
    """SIGKILL the bot every `every` seconds (a seeded uniform draw), start it again at once;
    leaves it running."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(*every))
        if stop.is_set():
            return
        bot.kill()
        result.kills += 1
        started = time.monotonic()
        await asyncio.to_thread(bot.start)
        result.restart_seconds.append(time.monotonic() - started)


def replies_by_question(msgs: list[Any]) -> Counter[str | None]:
    """How many messages (edits are not messages) the bot sent in reply to each event."""
    return Counter(m.in_reply_to for m in msgs)


async def answered(alice: HumanClient, stack: Stack, rooms: list[str]) -> list[Any]:
    return [m for room in rooms for m in await alice.messages_from(stack.users.bot, room)]


async def kill_soak(
    stack: Stack,
    humans: Login,
    llm: ScriptedLLMServer,
    messages: int,
    seed: int,
    kill_every: tuple[float, float] = (1.5, 4.0),
) -> SoakResult:
    """3 people, 2 group rooms, `messages` questions (and some chatter not for the bot) over time
    while the bot is killed at random moments and restarted; returns once every question has a
    reply (or fails after 120 s) and nothing else has."""
    u = stack.users
    alice, bob, erin = [await humans(who) for who in (u.alice, u.bob, u.erin)]
    llm.set_default(streamed_echo)
    rng = random.Random(seed)
    result = SoakResult()
    stop = asyncio.Event()
    env = {"EVENT_LEASE_SECONDS": LEASE_SECONDS}
    with stack.another_bot("soakbot", **env) as bot:
        rooms = [await tenant_room(alice, f"busy {i}", [u.bot, u.bob, u.erin]) for i in range(2)]
        kills = asyncio.create_task(killer(bot, rng, stop, result, kill_every))
        began = time.monotonic()
        try:
            for i in range(messages):
                human = (alice, bob, erin)[i % 3]
                room = rooms[(i // 3) % 2]
                text = f"q{i} from {human.user_id}"
                result.sent.append(Sent(await human.send(room, f"!ai {text}"), room, text))
                if i % 10 == 9:  # people also talk among themselves: not for the bot
                    await human.send(room, f"chatter {i}, not for the bot")
                await asyncio.sleep(rng.uniform(0.1, 0.4))
            result.send_seconds = time.monotonic() - began
        finally:
            stop.set()
            await kills
        last_send = time.monotonic()
        wanted = {s.event_id for s in result.sent}
        deadline = last_send + 120
        while time.monotonic() < deadline:
            if wanted <= set(replies_by_question(await answered(alice, stack, rooms))):
                break
            await asyncio.sleep(0.5)
        result.settle_seconds = time.monotonic() - last_send
        await asyncio.sleep(2 * float(LEASE_SECONDS) + 2)  # a late second answer would show by now
        msgs = await answered(alice, stack, rooms)
    replies = replies_by_question(msgs)
    missing = [s.text for s in result.sent if replies[s.event_id] == 0]
    twice = [s.text for s in result.sent if replies[s.event_id] > 1]
    stray = [m.body for m in msgs if m.in_reply_to not in wanted]
    assert not missing and not twice and not stray, (
        f"unanswered: {missing}\nanswered more than once: {twice}\nstray: {stray}\n{result.summary()}"
    )
    print("fault soak:", json.dumps(result.summary()))
    bodies = {m.in_reply_to: m.body for m in msgs}
    assert [bodies[s.event_id] for s in result.sent] == [f"You said: {s.text}" for s in result.sent]
    return result


@pytest.fixture
def main_bot_down(stack: Stack) -> Iterator[None]:
    """The session's bot is stopped for the test (another process uses its device), then back."""
    stack.main_bot.stop()
    try:
        yield
    finally:
        stack.main_bot.start()


@pytest.mark.timeout(240)
async def test_bot_killed_at_random_answers_every_message_exactly_once(
    stack: Stack, humans: Login, llm: ScriptedLLMServer, main_bot_down: None
) -> None:
    result = await kill_soak(stack, humans, llm, messages=45, seed=14, kill_every=(0.5, 1.5))
    assert result.kills >= 5, result.summary()


@pytest.mark.soak
@pytest.mark.timeout(1800)
async def test_soak_bot_killed_at_random(
    stack: Stack, humans: Login, llm: ScriptedLLMServer, main_bot_down: None
) -> None:
    """`make soak`: the same with SOAK_MESSAGES (500) messages."""
    messages = int(os.environ.get("SOAK_MESSAGES", "500"))
    result = await kill_soak(stack, humans, llm, messages=messages, seed=messages)
    assert result.kills >= messages // 20, result.summary()


# ---- the access control provider slow or down ------------------------------------------------


async def metric(bot: ServiceProcess, sample: str) -> float:
    """One sample of the bot's /metrics (`name{labels}`), 0 when it has none yet."""
    url = f"http://127.0.0.1:{bot.env['BOT_HEALTH_PORT']}/metrics"
    text = (await asyncio.to_thread(httpx.get, url, timeout=10)).text
    values = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(sample + " ")]
    return values[0] if values else 0.0


def acp_errors(bot: ServiceProcess, user: str, reason: str) -> list[dict[str, Any]]:
    """The bot's error log lines saying the provider gave no answer about `user`."""
    return [
        r
        for r in bot.log_records()
        if r.get("event") == "acp_unavailable" and r.get("user_id") == user and r.get("reason") == reason
    ]


async def assert_silently_denied(
    alice: HumanClient, stack: Stack, bot: ServiceProcess, room: str, llm: ScriptedLLMServer, **how: str
) -> None:
    """Alice asks while the provider cannot answer: no reply, no model call, one more failure
    counted as `kind`, and one more error log line with `reason`."""
    kind, reason = how["kind"], how["reason"]
    sample = f'vagent_bot_acp_errors_total{{kind="{kind}"}}'
    counted, logged = await metric(bot, sample), len(acp_errors(bot, stack.users.alice, reason))
    await alice.send(room, "anyone there?")
    await alice.assert_no_message_from(stack.users.bot, room, within=4)
    assert not any("anyone there?" in str(r["messages"]) for r in llm.requests)
    assert await metric(bot, sample) == counted + 1
    lines = acp_errors(bot, stack.users.alice, reason)
    assert len(lines) == logged + 1 and lines[-1]["level"] == "error", lines[-1:]


@pytest.mark.timeout(120)
async def test_provider_down_nobody_is_answered_counted_logged_back_without_restart(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    pid = stack.main_bot.proc.pid if stack.main_bot.proc else None
    with down(stack.acp):
        await assert_silently_denied(
            alice, stack, stack.main_bot, room, llm, kind="transport", reason="provider_error"
        )
    await echoed(alice, stack, room, "back?")  # the provider is back: the next message is answered
    assert stack.main_bot.proc is not None and stack.main_bot.proc.pid == pid  # without a restart


@pytest.mark.timeout(120)
async def test_provider_slower_than_its_timeout_nobody_is_answered_then_back(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, main_bot_down: None
) -> None:
    timeout = 1.0
    slow = asyncio.Event()

    async def provider(method: str, path: str, body: Any) -> tuple[int, Any]:
        """The real development provider, answering after 3x the bot's timeout while `slow`."""
        if slow.is_set():
            await asyncio.sleep(3 * timeout)
        async with httpx.AsyncClient() as c:
            r = await c.request(method, stack.acp_url + path, json=body)
        return r.status_code, r.content

    async with HttpStandIn(provider) as acp:
        env = {"ACCESS_CONTROL_PROVIDER_URL": acp.url, "ACP_TIMEOUT_SECONDS": str(timeout)}
        with stack.another_bot("slowacp", **env) as bot:
            room = await dm_with_bot(alice, stack)
            await echoed(alice, stack, room, "hello")
            slow.set()
            await assert_silently_denied(
                alice, stack, bot, room, llm, kind="timeout", reason="provider_timeout"
            )
            slow.clear()
            pid = bot.proc.pid if bot.proc else None
            await echoed(alice, stack, room, "fast again?")
            assert bot.proc is not None and bot.proc.pid == pid


# ---- the model endpoint failing ------------------------------------------------------------------

BUSY = "⚠️ The language model is busy right now. Please try again shortly."
UNAVAILABLE = "⚠️ The language model is not available right now. Please try again later."
BROKEN = "⚠️ Something went wrong while answering. Please try again."
GRAPH_DOWN = "⚠️ I can't reach my reasoning service right now. Please try again in a moment."
RETRIES = 2  # the stack's graph runs with the SDK's default LLM_MAX_RETRIES


async def only_reply(alice: HumanClient, stack: Stack, room: str, question: str, body: str) -> None:
    """The bot's one message in reply to `question` reads `body` (after a moment for a second)."""
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.in_reply_to == question and m.body == body)
    await asyncio.sleep(1)
    replies = [m.body for m in await alice.messages_from(stack.users.bot, room) if m.in_reply_to == question]
    assert replies == [body]


@pytest.mark.timeout(120)
async def test_model_failures_are_told_once_and_the_session_stays_usable(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    room = await dm_with_bot(alice, stack)
    # a 429 with Retry-After before the stream: the SDK waits and retries, the user never knows
    llm.push_error(429, "rate limited", retry_after=0.5)
    asked = await alice.send(room, "busy?")
    await only_reply(alice, stack, room, asked, "You said: busy?")
    # refused more often than the SDK retries: one short message, no details
    for status, told in ((429, BUSY), (500, UNAVAILABLE)):
        for _ in range(RETRIES + 1):
            llm.push_error(status, "boom: internal details", retry_after=0.1)
        await only_reply(alice, stack, room, await alice.send(room, f"{status}?"), told)
    # the graph unreachable: one short message too
    with down(stack.graph):
        await only_reply(alice, stack, room, await alice.send(room, "graph?"), GRAPH_DOWN)
    asked = await alice.send(room, "third")
    await only_reply(alice, stack, room, asked, "You said: third")


@pytest.mark.parametrize(
    ("how", "told"), [("garbage", BROKEN), ("drop", UNAVAILABLE)], ids=["garbage", "drop"]
)
@pytest.mark.timeout(120)
async def test_a_stream_broken_midway_keeps_its_text_and_adds_one_warning(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, how: Literal["garbage", "drop"], told: str
) -> None:
    room = await dm_with_bot(alice, stack)
    llm.push_broken_stream("Half an answer that never ends", chunks_before=3, how=how)
    asked = await alice.send(room, "tell me")
    # what had streamed stays as it was; then one short warning; the stream is not retried
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.in_reply_to == asked and m.body == told)
    await asyncio.sleep(1)
    replies = [m.body for m in await alice.messages_from(stack.users.bot, room) if m.in_reply_to == asked]
    assert replies == ["Half an answer ", told]
    assert len(llm.requests) == 1
    await only_reply(alice, stack, room, await alice.send(room, "again"), "You said: again")


@pytest.mark.timeout(120)
async def test_after_a_crash_a_group_room_is_still_no_dm(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    """Found by the kill soak: the first sync after a restart may carry no member counts, and
    with lazy-loaded members nio knew only who had spoken, so a group room passed for a DM
    (everything answered, no audience)."""
    room = await group(alice, stack, "after a crash")
    await alice.send(room, "!ai hello")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == "You said: hello")
    with down(stack.main_bot, crash=True):
        pass
    await bob.send(room, "just chatting with alice, not with the bot")
    await alice.assert_no_message_from(stack.users.bot, room, within=3)
    await alice.send(room, "!ai still there?")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == "You said: still there?")
