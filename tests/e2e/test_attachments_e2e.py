"""Files, images and voice end to end in Matrix: humans (matrix-nio) upload files encrypted
(`file`, never `url`) into an encrypted DM and an encrypted group room; the real bot downloads,
checks and decrypts them, the real graph reads them in its sandboxed worker and the scripted
LLM sees what a model would see. A speech-to-text stand-in hears voice messages, an MCP test
server's tool returns an image that comes back into the room encrypted, and a reasoning model's
thoughts never reach the room.

One bot and one graph for the module (their settings differ from the session stack's: a small
ATTACHMENT_MAX_BYTES, STT, vision, the MCP image tool), and one DM and one group room: the
session's main bot is down meanwhile, as in test_mcp_e2e. Vision off is the same graph
restarted with LLM_VISION=false (LLM_VISION is read at start; a restart costs ~2.5 s, a second
graph would need a second bot, which costs more). A download that stalls is not tested here:
Synapse serves media at once, so only a stand-in homeserver can stall
(tests/integration/test_bot_media.py covers it: `test_a_stalled_download_is_given_up`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nio
import pytest
import yaml
from nio.crypto.attachments import decrypt_attachment, encrypt_attachment
from redis.asyncio import Redis

from tests.e2e.conftest import DOMAIN, Stack, echo_llm
from tests.e2e.test_bot_e2e import TENANT
from tests.support.files import corrupt_pdf, docx_with_text, pdf_with_text, png, wav, zip_bomb_docx
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer, TextResponse
from tests.support.matrix_human import HumanClient, Msg, syncing_human
from tests.support.mcp_server import McpTestServer, tool
from tests.support.procs import BIN, ServiceProcess
from tests.support.stt_server import ScriptedSTTServer
from vagent_shared import SessionId, redis_keys

pytestmark = pytest.mark.e2e

MAX_BYTES = 2 * 1024 * 1024  # the zip bomb is ~1.02 MiB: it must pass the size check to be read
REPLY_TIMEOUT = 30.0
REPORT = ["Quarterly report Q3", "Revenue grew 12% to 4.2 million.", "Churn fell to 3%."]
NOTES = ["Meeting notes", "We ship the release on Friday the 13th."]
PLAN = ["Launch plan", "The launch code word is BLUE-HERON-42."]
SALARIES = ["Salaries 2027", "The CEO earns 412 000 EUR a year."]
PICTURE = png(320, 200)
CHART = png(64, 48)
PICS_PERMISSION = "mcp_server:pics"
PDF, DOCX = "application/pdf", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


@dataclass
class World:
    stack: Stack
    graph: GraphProcess
    stt: ScriptedSTTServer
    pics: McpTestServer
    alice: HumanClient
    bob: HumanClient
    erin: HumanClient
    dm: str  # alice and the bot, encrypted
    group: str  # alice, bob, erin and the bot, encrypted
    process: ServiceProcess  # this module's bot

    @property
    def bot(self) -> str:
        return self.stack.users.bot

    async def vision(self, on: bool) -> None:
        """The graph with LLM_VISION `on` (restarted when it is not)."""
        wanted = "true" if on else "false"
        if self.graph.env["LLM_VISION"] != wanted:
            self.graph.env["LLM_VISION"] = wanted
            await asyncio.to_thread(self.graph.restart)


@contextmanager
def pics_allowed(stack: Stack) -> Iterator[None]:
    """Operators may use the `pics` MCP server for the block (the provider re-reads its file)."""
    policy = yaml.safe_load(stack.policy.read_text())
    policy["domains"][DOMAIN]["roles"]["operator"].append(PICS_PERMISSION)
    stack.policy.write_text(yaml.safe_dump(policy))
    try:
        yield
    finally:
        stack.write_policy()


def agent_descriptor(path: Path, mcp_url: str) -> Path:
    """The agent with the `pics` MCP server (no confirmation: its tool only draws)."""
    agent = {
        "id": "vagent",
        "name": "vagent",
        "system_prompt": "You help.",
        "tools": [],
        "mcp_servers": [{"name": "pics", "url": mcp_url, "confirm": "never"}],
    }
    path.write_text(yaml.safe_dump(agent))
    return path


@pytest.fixture(scope="module")
async def world(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """This module's graph, MCP server and bot (the main bot is down meanwhile), started side
    by side, then three people and the two encrypted rooms."""
    tmp = tmp_path_factory.mktemp("attachments")
    chart = tool("chart", "image", params={"text": "string"}, data=base64.b64encode(CHART).decode())
    with ScriptedSTTServer() as stt, pics_allowed(stack), ExitStack() as procs:
        pics = McpTestServer({"name": "pics", "tools": [chart]}, tmp)
        graph = GraphProcess(
            stack.redis_url,
            tmp / "graph",
            stack.llm.base_url,
            AGENT_DESCRIPTOR=str(agent_descriptor(tmp / "agent.yaml", pics.url)),
            LLM_VISION="true",
            ATTACHMENT_MAX_BYTES=str(MAX_BYTES),
        )
        bot = stack.new_bot(
            "attachments",
            GRAPH_API_ENDPOINT=graph.url,
            STT_BASE_URL=stt.base_url,
            ATTACHMENT_MAX_BYTES=str(MAX_BYTES),
        )
        procs.callback(pics.stop)
        procs.callback(graph.stop)
        procs.callback(stack.main_bot.start)  # after this module's bot has stopped
        procs.callback(stack.bots.remove, bot)
        procs.callback(bot.stop)

        def services() -> None:
            pics.start()
            graph.start()

        def swap_bots() -> None:
            stack.main_bot.stop()
            bot.start()

        await asyncio.gather(asyncio.to_thread(services), asyncio.to_thread(swap_bots))
        async with AsyncExitStack() as logged_in:
            u = stack.users

            async def login(user_id: str) -> HumanClient:
                store = tmp / user_id.strip("@").replace(":", "_")
                human = syncing_human(stack.synapse.url, user_id, u.passwords[user_id], store)
                return await logged_in.enter_async_context(human)

            alice, bob, erin = await asyncio.gather(login(u.alice), login(u.bob), login(u.erin))
            dm = await alice.create_dm(u.bot, encrypted=True)
            group = await alice.create_room([u.bot, u.bob, u.erin], "files", state=TENANT, encrypted=True)
            for member in (u.bot, u.bob, u.erin):
                await alice.wait_joined(group, member)
            await asyncio.gather(bob.wait_joined(group, u.bot), erin.wait_joined(group, u.bot))
            yield World(stack, graph, stt, pics, alice, bob, erin, dm, group, bot)


@pytest.fixture
def llm(world: World, llm_server: ScriptedLLMServer) -> ScriptedLLMServer:
    """The module's LLM: echo unless scripted; the STT stand-in is emptied too."""
    llm_server.set_default(echo_llm)
    world.stt.clear()
    return llm_server


# ---- sending files like Element does ---------------------------------------------------------


def unpadded_b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


async def send_file(
    human: HumanClient,
    room: str,
    name: str,
    data: bytes,
    *,
    mimetype: str,
    msgtype: str = "m.file",
    caption: str | None = None,
    mentions: list[str] | None = None,
    voice: bool = False,
    declared_size: int | None = None,
    tamper: bool = False,
) -> str:
    """Upload `data` encrypted (AES-CTR, the key in the Megolm-encrypted event's `file`) and
    send its event; with `caption` the body is the caption and `filename` the name (MSC2530).
    `tamper`: the event names another ciphertext's SHA-256."""
    ciphertext, keys = encrypt_attachment(data)
    resp, _ = await human.client.upload(
        io.BytesIO(ciphertext), "application/octet-stream", filesize=len(ciphertext)
    )
    assert isinstance(resp, nio.UploadResponse), resp
    if tamper:
        keys["hashes"] = {"sha256": unpadded_b64(hashlib.sha256(ciphertext + b"!").digest())}
    size = len(data) if declared_size is None else declared_size
    content: dict[str, Any] = {
        "msgtype": msgtype,
        "body": caption or name,
        "info": {"mimetype": mimetype, "size": size},
        "file": {**keys, "url": resp.content_uri},
        "m.mentions": {"user_ids": mentions} if mentions else {},
    }
    if caption:
        content["filename"] = name
    if voice:
        content["org.matrix.msc3245.voice"] = {}
        content["org.matrix.msc1767.audio"] = {"duration": 1000}
    return await human.send_event(room, "m.room.message", content)


def replying_to(event_id: str, done: Callable[[str], bool]) -> Callable[[Msg], bool]:
    """The bot's message in reply to `event_id` whose latest body passes `done`."""
    return lambda m: m.in_reply_to == event_id and done(m.body)


def user_text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))


def last_user(request: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in reversed(request["messages"]) if m["role"] == "user")


def seen(request: dict[str, Any]) -> str:
    """Every user message of an LLM request, as text."""
    return "\n".join(user_text(m) for m in request["messages"] if m["role"] == "user")


_DOCUMENT = re.compile(r"«attachment \w+ begin»\n(.*?)\n«attachment \w+ end»", re.DOTALL)


def quoting_llm(request: dict[str, Any]) -> TextResponse:
    """Answers from the document the model was given: quotes its line about revenue."""
    blocks = _DOCUMENT.findall(user_text(last_user(request)))
    lines = [ln for b in blocks for ln in b.splitlines() if "Revenue" in ln]
    return TextResponse(f'The report says: "{lines[0]}"' if lines else "I see no document.")


# ---- the scenarios ---------------------------------------------------------------------------


async def test_a_pdf_with_a_question_in_the_encrypted_dm_is_answered_from_it(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    llm.set_default(quoting_llm)
    sent = await send_file(
        w.alice, w.dm, "report.pdf", pdf_with_text(REPORT), mimetype=PDF, caption="how did revenue do?"
    )
    reply = await w.alice.wait_for_reply(
        w.bot, w.dm, replying_to(sent, lambda b: b.endswith("`report.pdf`")), REPLY_TIMEOUT
    )
    assert reply.body == (
        'The report says: "Revenue grew 12% to 4.2 million."\n\n📎 From your attachment: `report.pdf`'
    )
    asked = user_text(last_user(llm.requests[-1]))
    assert "report.pdf" in asked and "Churn fell to 3%." in asked and asked.endswith("how did revenue do?")
    assert next(e for e in w.alice.events if e.event_id == reply.event_id).encrypted


async def test_an_addressed_reply_to_an_earlier_docx_in_the_group_room_uses_it(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    posted = await send_file(w.alice, w.group, "notes.docx", docx_with_text(NOTES), mimetype=DOCX)
    await w.bob.send(w.group, "unrelated chatter")  # neither is for the bot
    llm.push_text("On Friday the 13th.")
    asked = await w.alice.send(w.group, "when do we ship?", reply_to=posted, mentions=[w.bot])
    reply = await w.alice.wait_for_reply(
        w.bot, w.group, replying_to(asked, lambda b: b.endswith("`notes.docx`")), REPLY_TIMEOUT
    )
    assert reply.body == "On Friday the 13th.\n\n📎 From your attachment: `notes.docx`"
    assert len(llm.requests) == 1  # the file alone and bob's chatter were not answered
    question = user_text(last_user(llm.requests[-1]))
    assert "notes.docx" in question and NOTES[1] in question and question.endswith("when do we ship?")
    assert posted not in [m.in_reply_to for m in await w.alice.messages_from(w.bot, w.group)]


async def test_a_newcomers_reply_to_someone_elses_file_is_refused_and_nothing_is_read(
    world: World, llm: ScriptedLLMServer
) -> None:
    """Bob joins after Alice posted salaries.pdf, so he holds no key for it; its event id is
    still clear text. His `!ai summarise` in reply to it gets one short answer: the bot
    downloads nothing, the model sees nothing, Bob's conversation holds nothing. Alice's own
    reply to it is answered from it (the bot can read it: only whose file it is differs)."""
    w = world
    u = w.stack.users
    room = await w.alice.create_room([u.bot], "payroll", state=TENANT, encrypted=True)
    await w.alice.wait_joined(room, u.bot)
    posted = await send_file(w.alice, room, "salaries.pdf", pdf_with_text(SALARIES), mimetype=PDF)
    invited = await w.alice.client.room_invite(room, u.bob)
    assert isinstance(invited, nio.RoomInviteResponse), invited
    await w.bob.wait_joined(room, u.bob, timeout=REPLY_TIMEOUT)  # he joins invites as he syncs
    await w.alice.wait_joined(room, u.bob, timeout=REPLY_TIMEOUT)
    asked_before = len(llm.requests)

    asked = await w.bob.send(room, "!ai summarise", reply_to=posted)
    reply = await w.bob.wait_for_reply(u.bot, room, replying_to(asked, lambda _: True), REPLY_TIMEOUT)
    assert reply.body == "⚠️ I can only read files you sent yourself."
    assert next(e for e in w.bob.events if e.event_id == posted).type == "m.room.encrypted"  # no key
    assert len(llm.requests) == asked_before
    assert not any(SALARIES[1] in seen(r) for r in llm.requests)
    logged = [r for r in w.process.log_records() if r.get("event_id") == asked]
    assert [r["reason"] for r in logged if r["event"] == "file_refused"] == ["not_yours"]
    assert [r for r in logged if r["event"] == "media_downloaded"] == []
    redis = Redis.from_url(w.stack.redis_url)
    try:
        bobs = SessionId(room_id=room, thread_id=None, user_id=u.bob).format()
        assert [k async for k in redis.scan_iter(match=f"*{redis_keys.glob_escape(bobs)}*")] == []
    finally:
        await redis.aclose()

    llm.push_text("412 000 EUR.")
    mine = await w.alice.send(room, "what does the CEO earn?", reply_to=posted, mentions=[w.bot])
    await w.alice.wait_for_reply(
        u.bot, room, replying_to(mine, lambda b: b.endswith("`salaries.pdf`")), REPLY_TIMEOUT
    )
    assert SALARIES[1] in seen(llm.requests[-1])


async def test_an_image_reaches_a_vision_model_and_without_vision_the_model_is_told(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    await w.vision(True)
    llm.push_text("An orange rectangle on blue.")
    sent = await send_file(
        w.alice, w.dm, "shot.png", PICTURE, mimetype="image/png", msgtype="m.image", caption="what is this?"
    )
    await w.alice.wait_for_reply(
        w.bot, w.dm, replying_to(sent, lambda b: b.startswith("An orange rectangle")), REPLY_TIMEOUT
    )
    parts = llm.image_parts()
    assert len(parts) == 1 and parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1]).startswith(b"\x89PNG")
    assert "shot.png" in user_text(last_user(llm.requests[-1]))

    await w.vision(False)
    llm.clear()
    llm.set_default(echo_llm)
    llm.push_text("I cannot see images, sorry: please describe it.")
    sent = await send_file(
        w.alice, w.dm, "other.png", PICTURE, mimetype="image/png", msgtype="m.image", caption="and this?"
    )
    await w.alice.wait_for_reply(
        w.bot, w.dm, replying_to(sent, lambda b: b.startswith("I cannot see images")), REPLY_TIMEOUT
    )
    told = last_user(llm.requests[-1])
    assert isinstance(told["content"], str), told  # no image part this turn
    assert "other.png" in told["content"] and "You cannot see images" in told["content"]
    assert llm.image_parts() == []  # nor the earlier turn's: a text-only model would refuse it


async def test_a_voice_message_is_transcribed_and_the_transcript_is_shown(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    said = "what is on my calendar today"
    w.stt.push(said)
    audio = wav(1.0)
    sent = await send_file(
        w.alice, w.dm, "Voice message", audio, mimetype="audio/ogg", msgtype="m.audio", voice=True
    )
    reply = await w.alice.wait_for_reply(
        w.bot, w.dm, replying_to(sent, lambda b: b.endswith(f"You said: {said}")), REPLY_TIMEOUT
    )
    assert reply.body == f'> 🎤 "{said}"\n\nYou said: {said}'
    assert user_text(last_user(llm.requests[-1])) == said  # the transcript is the user's message
    heard = w.stt.requests
    assert len(heard) == 1 and heard[0].data == audio and (heard[0].filename or "").endswith(".wav")


async def test_a_tool_image_arrives_as_an_encrypted_image_a_client_can_decrypt(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    w.pics.clear()
    llm.push_tool_calls([("pics__chart", {"text": "sales"})])
    llm.push_text("Here is the chart.")
    asked = await w.alice.send(w.group, "draw the sales chart", mentions=[w.bot])
    image = await w.alice.wait_for_reply(
        w.bot, w.group, lambda m: m.msgtype == "m.image" and m.in_reply_to == asked, REPLY_TIMEOUT
    )
    answers = [m for m in await w.alice.messages_from(w.bot, w.group) if m.in_reply_to == asked]
    assert [m.msgtype for m in answers] == ["m.text", "m.image"] and answers[1] == image
    assert answers[0].body == "Here is the chart." and image.body.endswith(".png")
    order = [e.event_id for e in w.alice.events]
    last_edit = max(
        i
        for i, e in enumerate(w.alice.events)
        if e.event_id == answers[0].event_id or e.relates_to.get("event_id") == answers[0].event_id
    )
    assert last_edit < order.index(image.event_id)  # posted once the answer's text was final
    assert [c["tool"] for c in w.pics.calls()] == ["chart"]
    file = image.content["file"]
    assert "url" not in image.content and file["url"].startswith("mxc://")
    assert next(e for e in w.alice.events if e.event_id == image.event_id).encrypted
    got = await w.alice.client.download(mxc=file["url"])
    assert isinstance(got, nio.MemoryDownloadResponse), got
    assert got.body != CHART  # the homeserver holds ciphertext only
    plain = decrypt_attachment(got.body, file["key"]["k"], file["hashes"]["sha256"], file["iv"])
    assert plain == CHART
    info = image.content["info"]
    assert (info["mimetype"], info["size"], info["w"], info["h"]) == ("image/png", len(CHART), 64, 48)
    told = [m for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert "shown to the user in the room" in str(told[-1]["content"])


async def test_bad_files_each_get_one_clear_reply_while_others_are_answered(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    elf = b"\x7fELF\x02\x01\x01" + bytes(500)
    too_big = b"%PDF-1.4\n" + bytes(MAX_BYTES + 1)
    # name, bytes, how it is sent, what the one reply says
    bad: list[tuple[str, bytes, dict[str, Any], str]] = [
        (
            "declared.pdf",
            b"%PDF-1.4\n",
            {"declared_size": 3 << 20},
            "declared.pdf (3 MB) is larger than the 2 MB",
        ),
        ("actual.pdf", too_big, {"declared_size": 1000}, "actual.pdf is larger than the 2 MB"),
        ("program.pdf", elf, {}, "I can't read program.pdf: I take PDF"),
        ("broken.pdf", corrupt_pdf(), {}, "I could not use broken.pdf: not a readable PDF"),
        (
            "bomb.docx",
            zip_bomb_docx(),
            {"mimetype": DOCX},
            "I could not use bomb.docx: it looks like a zip bomb",
        ),
        (
            "tampered.pdf",
            pdf_with_text(REPORT),
            {"tamper": True},
            "tampered.pdf: the file's checksum does not match",
        ),
    ]
    sent: dict[str, str] = {}
    asked = None
    for n, (name, data, options, _) in enumerate(bad):
        options.setdefault("mimetype", PDF)
        sent[name] = await send_file(w.alice, w.dm, name, data, caption="summarise this", **options)
        if n == 0:  # someone else asks meanwhile
            asked = await w.bob.send(w.group, "is anyone there?", mentions=[w.bot])
    assert asked is not None
    await w.bob.wait_for_reply(
        w.bot, w.group, replying_to(asked, lambda b: b == "You said: is anyone there?")
    )
    for name, _, _, reason in bad:
        # the graph's refusals replace its "Reading …" line: one message, edited
        refused = replying_to(sent[name], lambda b: b.startswith("⚠️ "))
        reply = await w.alice.wait_for_reply(w.bot, w.dm, refused, REPLY_TIMEOUT)
        assert name in reply.body and reason in reply.body, reply.body
    replies = [m.in_reply_to for m in await w.alice.messages_from(w.bot, w.dm)]
    assert all(replies.count(event_id) == 1 for event_id in sent.values()), replies
    assert [user_text(last_user(r)) for r in llm.requests] == ["is anyone there?"]  # no file got through


async def test_a_file_is_used_only_in_its_room_and_is_gone_after_forget(
    world: World, llm: ScriptedLLMServer
) -> None:
    w = world
    erin = w.erin
    posted = await send_file(erin, w.group, "plan.pdf", pdf_with_text(PLAN), mimetype=PDF)
    asked = await erin.send(w.group, "what is the code word?", reply_to=posted, mentions=[w.bot])
    await erin.wait_for_reply(
        w.bot, w.group, replying_to(asked, lambda b: b.endswith("`plan.pdf`")), REPLY_TIMEOUT
    )
    assert PLAN[1] in seen(llm.requests[-1])

    async def ask(room: str, text: str) -> dict[str, Any]:
        """erin asks the bot in `room`; what the model was sent for it."""
        mentions = [w.bot] if room == w.group else None
        event_id = await erin.send(room, text, mentions=mentions)
        await erin.wait_for_reply(w.bot, room, replying_to(event_id, lambda b: b == f"You said: {text}"))
        return llm.requests[-1]

    assert PLAN[1] in seen(await ask(w.group, "say the code word again"))  # her session keeps it
    elsewhere = await erin.create_dm(w.bot)
    assert PLAN[1] not in seen(await ask(elsewhere, "what was the code word?"))  # never in another room
    forget = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "vagent"), "admin", "forget", w.stack.users.erin],
        env={**os.environ, "REDIS_URL": w.stack.redis_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert forget.returncode == 0, forget.stderr
    assert PLAN[1] not in seen(await ask(w.group, "and the code word now?"))  # gone with her sessions


async def test_reasoning_never_reaches_any_message_or_edit(world: World, llm: ScriptedLLMServer) -> None:
    w = world
    start = len(w.alice.events)
    thought = "<think>The user is alice; her password is hunter2.</think>\n\nHello Alice, all good."
    end = thought.index("</think>")
    llm.push_text(thought, delay=0.1, split_at=[3, 12, 30, end + 3, end + 10, len(thought) - 5])
    asked = await w.alice.send(w.dm, "hi")
    first = await w.alice.wait_for_reply(
        w.bot, w.dm, replying_to(asked, lambda b: b == "Hello Alice, all good."), REPLY_TIMEOUT
    )
    llm.push_reasoning("Let me think about hunter2 first.", "Second answer.", delay=0.1)
    asked = await w.alice.send(w.dm, "again")
    second = await w.alice.wait_for_reply(
        w.bot, w.dm, replying_to(asked, lambda b: b == "Second answer."), REPLY_TIMEOUT
    )
    assert first.body == "Hello Alice, all good." and second.body == "Second answer."
    assert "hunter2" not in json.dumps(llm.requests[-1]["messages"])  # nor in the history sent back
    from_bot = [e for e in w.alice.events[start:] if e.room_id == w.dm and e.sender == w.bot]
    assert any(e.relates_to.get("rel_type") == "m.replace" for e in from_bot)  # edits were seen
    everything = json.dumps([e.content for e in from_bot], ensure_ascii=False)
    for leak in ("hunter2", "<think", "</think", "Let me think"):
        assert leak not in everything, leak
