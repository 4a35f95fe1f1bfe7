"""Files, images and voice through the bot's real parts (vagent_bot.matrix.downloads, transcribe,
images_out, turn_files, and the whole router -> conversation wiring with a real nio client and
real Redis), against one local aiohttp server standing in for what lies outside the bot: the
homeserver (authenticated media, events, uploads, sends), the access provider, the graph and
an OpenAI-compatible speech-to-text service; and, once, the same I/O against a real Synapse.
What is checked is what a user would notice: what the graph is asked, what appears in the
room, what is refused and how fast."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from aiohttp import BodyPartReader, web
from nio import AsyncClient, AsyncClientConfig, MatrixRoom, MemoryDownloadResponse, UploadResponse
from nio.crypto.attachments import decrypt_attachment, encrypt_attachment
from nio.responses import RoomSummary
from redis.asyncio import Redis

from synapse_local import SynapseServer
from tests.support.matrix_human import new_human
from vagent_bot.access.flood import BotFloodControl as FloodControl
from vagent_bot.access.provider import BotAccessProvider as AccessProvider
from vagent_bot.answers.edit_pacing import EditThrottle
from vagent_bot.answers.images_out import post_image
from vagent_bot.answers.questions_out import post_question
from vagent_bot.answers.streaming import Answer
from vagent_bot.clients.graph_client import GraphClient
from vagent_bot.clients.transcribe import NOT_CONFIGURED, Transcriber, TranscriptionFailed
from vagent_bot.conversation.conversations import Conversations
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_bot.conversation.questions import Questions, check_answer
from vagent_bot.conversation.routing import parse_message, session_for
from vagent_bot.conversation.sessions import SessionWorkers
from vagent_bot.matrix import rooms
from vagent_bot.matrix.downloads import TAMPERED, MediaDownloader, MediaRefused
from vagent_bot.matrix.media import FILE_KINDS, VOICE_KINDS, EncryptedFile, Media, media_of_event
from vagent_bot.matrix.tenants import Tenants
from vagent_bot.router import EventRouter
from vagent_shared.events import ImageOut
from vagent_shared.hitl import PendingQuestion, format_question
from vagent_shared.session import SessionId
from vagent_shared.settings import BotSettings

pytestmark = pytest.mark.timeout(30)

BOT = "@vagent:localhost"
TOKEN = "bot-access-token"
STT_KEY = "stt-secret-key"
PDF = b"%PDF-1.4\n" + b"0123456789" * 300
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
OGG = b"OggS" + b"\x00" * 200
MEDIA_PREFIX = "/_matrix/client/v1/media/download/localhost/"

MediaAnswer = bytes | Callable[[web.Request], Awaitable[web.StreamResponse]]


async def not_found(_: web.Request) -> web.Response:
    return web.json_response({"errcode": "M_NOT_FOUND", "error": "not found"}, status=404)


async def empty(_: web.Request) -> web.Response:
    return web.json_response({})


@dataclass
class Outside:
    """Everything outside the bot, on one loopback port; it records what the bot asked."""

    url: str = ""
    media: dict[str, MediaAnswer] = field(default_factory=dict)
    media_requests: list[tuple[str, str | None]] = field(default_factory=list)
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    uploads: dict[str, bytes] = field(default_factory=dict)
    upload_names: list[str | None] = field(default_factory=list)
    sent: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    allowed: set[str] = field(default_factory=set)
    graph_requests: list[dict[str, Any]] = field(default_factory=list)
    feedback_requests: list[dict[str, Any]] = field(default_factory=list)
    graph_script: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stt_requests: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    stt_answer: tuple[int, Any] = (200, {"text": "what is on my calendar"})
    stt_delay: float = 0.0

    # ---- the homeserver ----------------------------------------------------------------------
    async def download(self, request: web.Request) -> web.StreamResponse:
        self.media_requests.append((request.path, request.headers.get("Authorization")))
        answer = self.media.get(request.match_info["media_id"])
        if answer is None:
            return web.json_response({"errcode": "M_NOT_FOUND", "error": "no such media"}, status=404)
        if isinstance(answer, bytes):
            return web.Response(body=answer, content_type="application/octet-stream")
        return await answer(request)

    async def get_event(self, request: web.Request) -> web.Response:
        """Answers by event id alone, whatever room was asked about (a misbehaving server)."""
        event = self.events.get(request.match_info["event_id"])
        if event is None:
            return web.json_response({"errcode": "M_NOT_FOUND", "error": "no such event"}, status=404)
        return web.json_response(event)

    async def upload(self, request: web.Request) -> web.Response:
        uri = f"mxc://localhost/up{len(self.uploads)}"
        self.uploads[uri] = await request.read()
        self.upload_names.append(request.query.get("filename"))
        return web.json_response({"content_uri": uri})

    async def send(self, request: web.Request) -> web.Response:
        event_id = f"$bot{len(self.sent)}"
        self.sent.append((time.monotonic(), request.match_info["room"], await request.json()))
        return web.json_response({"event_id": event_id})

    # ---- the access provider, the graph, the speech service -----------------------------------
    async def authenticate(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["user_id"] not in self.allowed:
            return web.json_response({"error": "no access"}, status=403)
        ac = {"userId": body["user_id"], "activeAclDomain": body["domain"], "superuserGroups": ["admins"]}
        return web.json_response(ac)

    async def graph(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        endpoint = request.match_info["endpoint"]
        (self.graph_requests if endpoint == "process_message" else self.feedback_requests).append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event, data in [*self.graph_script, ("done", {})]:
            await resp.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        return resp

    async def transcriptions(self, request: web.Request) -> web.Response:
        form: dict[str, Any] = {}
        async for part in await request.multipart():
            assert isinstance(part, BodyPartReader)
            data = await part.read()
            if part.filename:
                form[part.name or ""] = (part.filename, bytes(data), part.headers.get("Content-Type"))
            else:
                form[part.name or ""] = data.decode()
        self.stt_requests.append((form, request.headers.get("Authorization")))
        await asyncio.sleep(self.stt_delay)
        status, body = self.stt_answer
        return web.json_response(body, status=status)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get(MEDIA_PREFIX + "{media_id}", self.download)
        app.router.add_get("/_matrix/client/v3/rooms/{room}/event/{event_id}", self.get_event)
        app.router.add_get("/_matrix/client/v3/rooms/{room}/state/{rest:.*}", not_found)
        app.router.add_post("/_matrix/media/v3/upload", self.upload)
        app.router.add_put("/_matrix/client/v3/rooms/{room}/send/{type}/{txn}", self.send)
        app.router.add_put("/_matrix/client/v3/rooms/{room}/typing/{user}", empty)
        app.router.add_post("/api/v1/authenticate", self.authenticate)
        app.router.add_post("/api/v1/{endpoint}", self.graph)
        app.router.add_post("/v1/audio/transcriptions", self.transcriptions)
        return app

    # ---- what people see ------------------------------------------------------------------------
    def shown(self, room: str) -> list[dict[str, Any]]:
        """The room's messages from the bot as a client shows them: edits applied, in order."""
        out: dict[str, dict[str, Any]] = {}
        for i, (_, room_id, content) in enumerate(self.sent):
            if room_id != room:
                continue
            relates = content.get("m.relates_to") or {}
            if relates.get("rel_type") == "m.replace":
                target = str(relates["event_id"])
                out[target] = {**out[target], **content["m.new_content"]}
            else:
                out[f"$bot{i}"] = content
        return list(out.values())

    def bodies(self, room: str) -> list[str]:
        return [str(c.get("body")) for c in self.shown(room)]


@pytest.fixture
async def outside() -> AsyncIterator[Outside]:
    state = Outside()
    runner = web.AppRunner(state.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()


def media(
    media_id: str,
    name: str = "report.pdf",
    *,
    msgtype: str = "m.file",
    size: int | None = None,
    encrypted: EncryptedFile | None = None,
) -> Media:
    return Media(msgtype, name, None, None, size, f"mxc://localhost/{media_id}", encrypted)


def downloader(outside: Outside, *, max_bytes: int = 1024 * 1024, stall: float = 2.0) -> MediaDownloader:
    return MediaDownloader(outside.url, lambda: TOKEN, max_bytes=max_bytes, stall_seconds=stall)


# ---- downloads -------------------------------------------------------------------------------------
async def test_a_file_is_downloaded_from_authenticated_media_with_the_access_token(outside: Outside) -> None:
    outside.media["pdf1"] = PDF
    d = downloader(outside)
    try:
        got = await d.fetch(media("pdf1"), FILE_KINDS)
    finally:
        await d.aclose()
    assert got.data == PDF and got.mimetype == "application/pdf"
    assert outside.media_requests == [(MEDIA_PREFIX + "pdf1", f"Bearer {TOKEN}")]


async def test_an_encrypted_file_is_decrypted_and_a_tampered_one_refused(outside: Outside) -> None:
    ciphertext, info = encrypt_attachment(PDF)
    key = EncryptedFile(key=info["key"]["k"], iv=info["iv"], sha256=info["hashes"]["sha256"])
    outside.media["enc"] = ciphertext
    outside.media["bad"] = ciphertext[:-1] + bytes([ciphertext[-1] ^ 1])
    d = downloader(outside)
    try:
        got = await d.fetch(media("enc", encrypted=key), FILE_KINDS)
        with pytest.raises(MediaRefused) as refused:
            await d.fetch(media("bad", "secret.pdf", encrypted=key), FILE_KINDS)
    finally:
        await d.aclose()
    assert got.data == PDF
    assert refused.value.reason == "tampered"
    assert refused.value.user_message == f"I can't use secret.pdf: {TAMPERED}."


async def test_a_file_declared_too_large_is_refused_without_downloading(outside: Outside) -> None:
    outside.media["big"] = PDF
    d = downloader(outside, max_bytes=2048)
    try:
        with pytest.raises(MediaRefused) as refused:
            await d.fetch(media("big", "huge.pdf", size=5 * 1024 * 1024), FILE_KINDS)
    finally:
        await d.aclose()
    assert refused.value.user_message == "huge.pdf (5 MB) is larger than the 2 KB I can take."
    assert outside.media_requests == []


async def test_a_download_larger_than_the_limit_is_aborted_while_it_arrives(outside: Outside) -> None:
    """Neither the event nor the server says how large it is: the bytes are counted."""
    written = [0]

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for _ in range(2000):  # 128 MB if nobody stops it
                await resp.write(b"%PDF-" + b"x" * (64 * 1024 - 5))
                written[0] += 64 * 1024
        except (ConnectionError, RuntimeError):
            pass
        return resp

    outside.media["endless"] = endless
    outside.media["honest"] = PDF * 1000  # its Content-Length says 2.9 MB
    d = downloader(outside, max_bytes=256 * 1024)
    try:
        with pytest.raises(MediaRefused) as refused:
            await d.fetch(media("endless", "stream.pdf"), FILE_KINDS)
        with pytest.raises(MediaRefused) as refused_by_length:
            await d.fetch(media("honest", "big.pdf"), FILE_KINDS)
    finally:
        await d.aclose()
    assert refused.value.reason == "too_large" and "stream.pdf" in refused.value.user_message
    assert written[0] < 32 * 1024 * 1024
    assert (
        refused_by_length.value.reason == "too_large" and "(2.9 MB)" in refused_by_length.value.user_message
    )


async def test_a_stalled_download_is_given_up(outside: Outside) -> None:
    async def stalls(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"%PDF-1.4\n")
        await asyncio.sleep(20)
        return resp

    outside.media["slow"] = stalls
    d = downloader(outside, stall=0.3)
    start = time.monotonic()
    try:
        with pytest.raises(MediaRefused) as refused:
            await d.fetch(media("slow", "slow.pdf"), FILE_KINDS)
    finally:
        await d.aclose()
    assert refused.value.reason == "stalled"
    assert refused.value.user_message == "Downloading slow.pdf stalled, so I gave up. Please send it again."
    assert time.monotonic() - start < 2


async def test_what_the_agent_cannot_read_is_refused_by_its_bytes(outside: Outside) -> None:
    outside.media["exe"] = b"MZ\x90\x00" + b"\x00" * 100
    outside.media["pdf"] = PDF
    outside.media["ogg"] = OGG
    d = downloader(outside)
    try:
        with pytest.raises(MediaRefused) as not_a_document:
            await d.fetch(media("exe", "invoice.pdf"), FILE_KINDS)  # the name says PDF, the bytes do not
        with pytest.raises(MediaRefused) as not_a_voice:
            await d.fetch(media("pdf", "Voice message.ogg", msgtype="m.audio"), VOICE_KINDS)
        with pytest.raises(MediaRefused) as gone:
            await d.fetch(media("missing", "old.pdf"), FILE_KINDS)
        voice = await d.fetch(media("ogg", "Voice message.ogg", msgtype="m.audio"), VOICE_KINDS)
    finally:
        await d.aclose()
    assert (
        not_a_document.value.reason == "type"
        and "can't read invoice.pdf" in not_a_document.value.user_message
    )
    assert not_a_voice.value.user_message == "Voice message.ogg is not a voice recording I can listen to."
    assert gone.value.user_message == "I could not find old.pdf on the server any more."
    assert voice.mimetype == "audio/ogg"


# ---- speech to text -----------------------------------------------------------------------------------
async def test_transcription_posts_the_audio_and_never_logs_the_key(outside: Outside) -> None:
    stt = Transcriber(f"{outside.url}/v1", "whisper-1", STT_KEY)
    try:
        with structlog.testing.capture_logs() as logs:
            text = await stt.transcribe(OGG, "Voice message", "audio/ogg")
    finally:
        await stt.aclose()
    assert text == "what is on my calendar"
    [(form, auth)] = outside.stt_requests
    assert auth == f"Bearer {STT_KEY}"
    assert form["model"] == "whisper-1"
    assert form["file"] == ("Voice_message.ogg", OGG, "audio/ogg")
    assert STT_KEY not in repr(logs) and "calendar" not in repr(logs)


@pytest.mark.parametrize(
    ("answer", "delay", "reason"),
    [
        ((500, {"error": "boom"}), 0.0, "http_500"),
        ((200, {"text": "   "}), 0.0, "empty"),
        ((200, {"nothing": 1}), 0.0, "unreachable"),
        ((200, {"text": "late"}), 2.0, "timeout"),
    ],
)
async def test_transcription_failures_become_one_clear_reply(
    outside: Outside, answer: tuple[int, Any], delay: float, reason: str
) -> None:
    outside.stt_answer, outside.stt_delay = answer, delay
    stt = Transcriber(f"{outside.url}/v1", "whisper-1", timeout_seconds=0.3)
    try:
        with pytest.raises(TranscriptionFailed) as failed:
            await stt.transcribe(OGG, "v.ogg", "audio/ogg")
    finally:
        await stt.aclose()
    assert failed.value.reason == reason and failed.value.user_message.startswith("🎤 ")


async def test_without_a_speech_service_voice_is_not_configured() -> None:
    with pytest.raises(TranscriptionFailed) as failed:
        await Transcriber(None, "whisper-1").transcribe(OGG, "v.ogg", "audio/ogg")
    assert failed.value.user_message == NOT_CONFIGURED


# ---- the whole bot: router -> access -> files -> graph -> room -------------------------------------
@dataclass
class Bot:
    outside: Outside
    router: EventRouter
    client: AsyncClient
    redis: Redis
    finished: dict[str, asyncio.Event]
    user: str
    dm: str
    group: str

    async def handle(self, room: str, content: dict[str, Any], *, sender: str | None = None) -> str:
        """One event from `sender` (default: the test's user), handled to the end."""
        event_id = f"${uuid.uuid4().hex}"
        self.finished[event_id] = asyncio.Event()
        src = {
            "type": "m.room.message",
            "event_id": event_id,
            "sender": sender or self.user,
            "origin_server_ts": int(time.time() * 1000),
            "room_id": room,
            "content": content,
        }
        self.router.dispatch(room, SimpleNamespace(source=src))
        await asyncio.wait_for(self.finished[event_id].wait(), 10)
        return event_id

    def room(self, room_id: str, members: int, *, encrypted: bool = False) -> str:
        room = MatrixRoom(room_id, BOT, encrypted=encrypted)
        room.summary = RoomSummary(invited_member_count=0, joined_member_count=members)
        self.client.rooms[room_id] = room
        return room_id


def file_content(media_id: str, name: str = "report.pdf", **extra: Any) -> dict[str, Any]:
    return {"msgtype": "m.file", "body": name, "url": f"mxc://localhost/{media_id}", **extra}


def voice_content(media_id: str) -> dict[str, Any]:
    return {
        "msgtype": "m.audio",
        "body": "Voice message.ogg",
        "url": f"mxc://localhost/{media_id}",
        "info": {"mimetype": "audio/ogg", "size": len(OGG)},
        "org.matrix.msc3245.voice": {},
    }


def attachments(request: dict[str, Any]) -> list[tuple[str, bytes, str | None]]:
    return [(a["name"], base64.b64decode(a["data"]), a.get("event_id")) for a in request["attachments"]]


BotFactory = Callable[..., Awaitable[Bot]]


@pytest.fixture
async def make_bot(outside: Outside, redis_url: str) -> AsyncIterator[BotFactory]:
    closers: list[Callable[[], Awaitable[Any]]] = []

    async def make(**overrides: Any) -> Bot:
        user = f"@u{uuid.uuid4().hex[:10]}:localhost"
        outside.allowed.add(user)
        settings = BotSettings(
            **{
                "MATRIX_HOMESERVER": outside.url,
                "MATRIX_USER": BOT,
                "GRAPH_API_ENDPOINT": outside.url,
                "ACCESS_CONTROL_PROVIDER_URL": outside.url,
                "DEFAULT_DOMAIN": "localhost",
                "AUDIENCE_FILTER": "off",
                "STT_BASE_URL": f"{outside.url}/v1",
                "STT_API_KEY": STT_KEY,
                "ATTACHMENT_MAX_BYTES": 1024 * 1024,
                "ATTACHMENT_STALL_SECONDS": 2.0,
                "STREAM_HOLD_SECONDS": 0,
                "TYPING_DELAY_SECONDS": 5,
                "FLOOD_MAX_MESSAGES": 1000,
                "REDIS_URL": redis_url,
                **overrides,
            }
        )
        client = AsyncClient(
            outside.url, BOT, config=AsyncClientConfig(encryption_enabled=False, max_timeouts=1)
        )
        client.user_id, client.access_token = BOT, TOKEN
        redis = Redis.from_url(redis_url)
        hitl = HitlStore(redis)
        graph = GraphClient(outside.url, "graph-token")
        access = AccessProvider(outside.url, 3.0, "vagent")
        flood = FloodControl(redis, 1000, 60)
        tenants = Tenants(client, settings.TENANT_STATE_EVENT_TYPE, settings.DEFAULT_DOMAIN)
        conversations = Conversations(settings, client, redis, graph, access, flood, hitl, tenants)
        workers = SessionWorkers()
        finished: dict[str, asyncio.Event] = {}
        tasks: set[asyncio.Task[Any]] = set()

        async def on_finished(event_id: str) -> None:
            finished.setdefault(event_id, asyncio.Event()).set()

        def spawn(coro: Any) -> None:
            task = asyncio.ensure_future(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        router = EventRouter(
            settings,
            client,
            redis,
            hitl=hitl,
            workers=workers,
            questions=Questions(hitl, graph, workers, conversations),
            conversations=conversations,
            finished=on_finished,
            spawn=spawn,
            stopping=asyncio.Event(),
        )
        router.display_name = "vagent"

        async def close() -> None:
            await workers.shutdown(1)
            await conversations.files.aclose()
            await graph.aclose()
            await access.aclose()
            await client.close()
            await redis.aclose()

        closers.append(close)
        bot = Bot(outside, router, client, redis, finished, user, "", "")
        bot.dm = bot.room(f"!dm{uuid.uuid4().hex[:8]}:localhost", 2)
        bot.group = bot.room(f"!group{uuid.uuid4().hex[:8]}:localhost", 3)
        return bot

    yield make
    for close in closers:
        await close()


async def test_a_file_alone_in_a_dm_is_sent_to_be_kept_for_the_next_question(make_bot: BotFactory) -> None:
    bot = await make_bot()
    bot.outside.media["f1"] = PDF
    bot.outside.graph_script = [("text_final", {"content": "Got report.pdf — what should I do with it?"})]
    event_id = await bot.handle(bot.dm, file_content("f1"))
    [request] = bot.outside.graph_requests
    assert request["message"] == ""
    assert attachments(request) == [("report.pdf", PDF, event_id)]
    assert bot.outside.bodies(bot.dm) == ["Got report.pdf — what should I do with it?"]


async def test_a_caption_is_the_question_that_comes_with_the_file(make_bot: BotFactory) -> None:
    bot = await make_bot()
    bot.outside.media["f2"] = PNG
    bot.outside.graph_script = [("text_final", {"content": "A cat."})]
    await bot.handle(
        bot.dm, file_content("f2", "What is in this picture?", filename="cat.png", msgtype="m.image")
    )
    [request] = bot.outside.graph_requests
    assert request["message"] == "What is in this picture?"
    assert [(name, data) for name, data, _ in attachments(request)] == [("cat.png", PNG)]


def file_event(event_id: str, room: str, sender: str, content: dict[str, Any]) -> dict[str, Any]:
    """An event as the homeserver serves it when the bot fetches it by id."""
    return {
        "type": "m.room.message",
        "event_id": event_id,
        "sender": sender,
        "origin_server_ts": 1,
        "room_id": room,
        "content": content,
    }


def reply_to(event_id: str, body: str = "!ai summarise this", **content: Any) -> dict[str, Any]:
    """An addressed rich reply to `event_id`."""
    relates = {"m.in_reply_to": {"event_id": event_id}}
    return {"msgtype": "m.text", "body": body, "m.relates_to": relates, **content}


async def test_an_addressed_reply_to_a_file_brings_that_file_but_never_one_of_another_room(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot()
    bot.outside.media["f3"] = PDF
    for event_id, room in (("$myfile", bot.group), ("$elsewhere", "!other:localhost")):
        bot.outside.events[event_id] = file_event(event_id, room, bot.user, file_content("f3", "q3.pdf"))
    bot.outside.graph_script = [("text_final", {"content": "Revenue grew."})]

    await bot.handle(bot.group, reply_to("$myfile"))
    await bot.handle(bot.group, reply_to("$elsewhere"))
    first, second = bot.outside.graph_requests
    assert first["message"] == "summarise this"
    assert attachments(first) == [("q3.pdf", PDF, "$myfile")]
    assert second["attachments"] == []
    assert bot.outside.media_requests == [(MEDIA_PREFIX + "f3", f"Bearer {TOKEN}")]


async def test_the_first_question_in_a_thread_started_on_a_file_takes_that_file(make_bot: BotFactory) -> None:
    bot = await make_bot()
    bot.outside.media["f9"] = PDF
    root = "$threadfile"
    bot.outside.events[root] = file_event(root, bot.group, bot.user, file_content("f9", "plan.pdf"))
    bot.outside.graph_script = [("text_final", {"content": "It plans."}), ("text_final", {"content": "Yes."})]
    in_thread = {
        "rel_type": "m.thread",
        "event_id": root,
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": root},
    }
    await bot.handle(
        bot.group, {"msgtype": "m.text", "body": "!ai what is this plan?", "m.relates_to": in_thread}
    )
    await bot.handle(bot.group, {"msgtype": "m.text", "body": "and the budget?", "m.relates_to": in_thread})
    first, second = bot.outside.graph_requests
    assert attachments(first) == [("plan.pdf", PDF, root)]
    assert second["attachments"] == []  # the thread's history already has it


async def test_only_the_requesters_own_files_are_used_and_nothing_else_is_downloaded(
    make_bot: BotFactory,
) -> None:
    """A reply to someone else's file (even with a file or a voice message of one's own) and a
    new thread started on someone else's file: one short answer, no download, no graph call.
    A file the bot posted is not read back, and a reply to a message that replies to a file
    brings no file."""
    bot = await make_bot()
    bob = "@bob:localhost"
    for media_id in ("hers", "mine", "bots"):
        bot.outside.media[media_id] = PDF
    quoting = {"msgtype": "m.text", "body": "see this", **reply_to("$bobs")}
    bot.outside.events.update(
        {
            "$bobs": file_event("$bobs", bot.group, bob, file_content("hers", "salaries.pdf")),
            "$left": file_event("$left", bot.dm, bob, file_content("hers", "salaries.pdf")),  # bob left
            "$bots": file_event(
                "$bots", bot.group, BOT, file_content("bots", "chart.png", msgtype="m.image")
            ),
            "$quote": file_event("$quote", bot.group, bob, quoting),
        }
    )
    bot.outside.graph_script = [("text_final", {"content": "Answered."})]
    in_thread = {"rel_type": "m.thread", "event_id": "$bobs", "is_falling_back": True}
    relates = reply_to("$bobs")["m.relates_to"]

    await bot.handle(bot.group, reply_to("$bobs"))
    await bot.handle(
        bot.group, {**file_content("mine", "!ai compare", filename="mine.pdf"), "m.relates_to": relates}
    )
    await bot.handle(bot.group, {"msgtype": "m.text", "body": "!ai what is this?", "m.relates_to": in_thread})
    await bot.handle(bot.dm, {**voice_content("mine"), "m.relates_to": reply_to("$left")["m.relates_to"]})
    not_yours = "⚠️ I can only read files you sent yourself."
    assert bot.outside.bodies(bot.group) == [not_yours] * 3 and bot.outside.bodies(bot.dm) == [not_yours]
    assert bot.outside.media_requests == [] and bot.outside.graph_requests == []
    assert bot.outside.stt_requests == []

    await bot.handle(bot.group, reply_to("$bots", "!ai make it bigger"))
    await bot.handle(bot.group, reply_to("$quote", "!ai and this?"))
    assert [r["attachments"] for r in bot.outside.graph_requests] == [[], []]
    assert bot.outside.media_requests == []


async def test_a_voice_message_is_answered_with_what_was_understood_quoted_first(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot()
    bot.outside.media["v1"] = OGG
    bot.outside.graph_script = [("text_chunk", {"content": "You have ", "chunk_index": 0})]
    bot.outside.graph_script += [("text_final", {"content": "You have two meetings."})]
    await bot.handle(bot.dm, voice_content("v1"))
    [request] = bot.outside.graph_requests
    assert request["message"] == "what is on my calendar" and request["attachments"] == []
    [(form, _)] = bot.outside.stt_requests
    assert form["file"][1] == OGG
    assert bot.outside.bodies(bot.dm) == ['> 🎤 "what is on my calendar"\n\nYou have two meetings.']


async def test_what_was_understood_stays_above_a_question_of_the_agent(make_bot: BotFactory) -> None:
    bot = await make_bot()
    bot.outside.media["v4"] = OGG
    bot.outside.stt_answer = (200, {"text": "delete my old records"})
    question = {"question": "Delete 3 records?", "options": ["yes", "no"], "interrupt_id": "i-4"}
    bot.outside.graph_script = [("hitl_request", question)]
    await bot.handle(bot.dm, voice_content("v4"))
    heard, asked = bot.outside.bodies(bot.dm)
    assert heard == '> 🎤 "delete my old records"'
    assert "Delete 3 records?" in asked


async def test_voice_without_a_speech_service_gets_a_clear_reply_and_nothing_is_downloaded(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(STT_BASE_URL=None)
    bot.outside.media["v2"] = OGG
    await bot.handle(bot.dm, voice_content("v2"))
    assert bot.outside.bodies(bot.dm) == [NOT_CONFIGURED]
    assert bot.outside.media_requests == [] and bot.outside.graph_requests == []


async def test_a_voice_message_in_a_group_is_heard_only_in_reply_to_the_bot(make_bot: BotFactory) -> None:
    bot = await make_bot()
    bot.outside.media["v3"] = OGG
    bot.outside.events["$botsays"] = {
        "type": "m.room.message",
        "event_id": "$botsays",
        "sender": BOT,
        "origin_server_ts": 1,
        "room_id": bot.group,
        "content": {"msgtype": "m.text", "body": "Anything else?"},
    }
    bot.outside.graph_script = [("text_final", {"content": "Two meetings."})]
    await bot.handle(bot.group, voice_content("v3"))
    assert bot.outside.media_requests == [] and bot.outside.graph_requests == []
    await bot.handle(
        bot.group, {**voice_content("v3"), "m.relates_to": {"m.in_reply_to": {"event_id": "$botsays"}}}
    )
    assert [r["message"] for r in bot.outside.graph_requests] == ["what is on my calendar"]


async def test_a_denied_users_file_is_never_downloaded(make_bot: BotFactory) -> None:
    bot = await make_bot()
    bot.outside.media["f4"] = PDF
    await bot.handle(bot.dm, file_content("f4"), sender="@mallory:localhost")
    await bot.handle(bot.dm, voice_content("f4"), sender="@mallory:localhost")
    assert bot.outside.media_requests == [] and bot.outside.stt_requests == []
    assert bot.outside.sent == [] and bot.outside.graph_requests == []


async def test_refusals_are_one_short_reply_naming_the_file(make_bot: BotFactory) -> None:
    bot = await make_bot()
    ciphertext, info = encrypt_attachment(PDF)
    bot.outside.media["tampered"] = ciphertext[::-1]
    encrypted = {
        "msgtype": "m.file",
        "body": "contract.pdf",
        "file": {"url": "mxc://localhost/tampered", **info},
    }
    await bot.handle(bot.dm, file_content("f5", "huge.pdf", info={"size": 50 * 1024 * 1024}))
    await bot.handle(bot.dm, {"msgtype": "m.video", "body": "clip.mp4", "url": "mxc://localhost/f6"})
    await bot.handle(bot.dm, encrypted)
    assert bot.outside.bodies(bot.dm) == [
        "⚠️ huge.pdf (50 MB) is larger than the 1 MB I can take.",
        "🎬 Sorry, videos are not supported yet, so I can't look at clip.mp4.",
        f"⚠️ I can't use contract.pdf: {TAMPERED}.",
    ]
    assert bot.outside.graph_requests == []
    assert [path for path, _ in bot.outside.media_requests] == [MEDIA_PREFIX + "tampered"]


@pytest.mark.parametrize("encrypted", [False, True])
async def test_images_a_tool_returned_are_posted_after_the_answer(
    make_bot: BotFactory, encrypted: bool
) -> None:
    bot = await make_bot()
    room = bot.room(f"!img{uuid.uuid4().hex[:8]}:localhost", 2, encrypted=encrypted)
    image = {"name": "chart.png", "mimetype": "image/png", "data": base64.b64encode(PNG).decode(), "width": 4}
    image["height"] = 3
    not_an_image = {**image, "name": "fake.png", "data": base64.b64encode(PDF).decode()}
    bot.outside.graph_script = [
        ("image", image),
        ("image", not_an_image),
        ("text_final", {"content": "Here is the chart."}),
    ]
    question = await bot.handle(room, {"msgtype": "m.text", "body": "draw it"})
    text, posted = bot.outside.shown(room)
    assert text["body"] == "Here is the chart."
    assert posted["msgtype"] == "m.image" and posted["body"] == "chart.png"
    assert posted["info"] == {"mimetype": "image/png", "size": len(PNG), "w": 4, "h": 3}
    assert posted["m.relates_to"] == {"m.in_reply_to": {"event_id": question}}
    [(uri, uploaded)] = bot.outside.uploads.items()
    if encrypted:
        file = posted["file"]
        assert "url" not in posted and file["url"] == uri and uploaded != PNG
        assert decrypt_attachment(uploaded, file["key"]["k"], file["hashes"]["sha256"], file["iv"]) == PNG
        assert bot.outside.upload_names == [None]  # the server does not learn the name either
    else:
        assert posted["url"] == uri and uploaded == PNG and "file" not in posted
        assert bot.outside.upload_names == ["chart.png"]


async def test_a_file_alone_is_no_answer_to_a_pending_question_but_a_spoken_yes_is(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot()
    sid = SessionId(room_id=bot.dm, thread_id=None, user_id=bot.user)
    pending = PendingQuestion(
        session_id=sid.format(),
        room_id=bot.dm,
        user_id=bot.user,
        question="Delete 3 records?",
        options=["yes", "no"],
        interrupt_id="int-1",
    )
    await HitlStore(bot.redis).save(pending, 60)
    bot.outside.media["f7"] = PDF
    bot.outside.media["v7"] = OGG
    await bot.handle(bot.dm, file_content("f7", "list.pdf"))
    assert bot.outside.bodies(bot.dm) == [
        "I'm still waiting for your answer to my question, so I did not take list.pdf. "
        "Answer the question first, then send the file again."
    ]
    assert bot.outside.media_requests == [] and bot.outside.graph_requests == []
    assert await HitlStore(bot.redis).peek(sid.format()) is not None

    bot.outside.stt_answer = (200, {"text": "Yes."})
    bot.outside.graph_script = [("text_final", {"content": "Deleted 3 records."})]
    await bot.handle(bot.dm, voice_content("v7"))
    [feedback] = bot.outside.feedback_requests
    assert feedback["response"] == "yes" and feedback["interrupt_id"] == "int-1"
    assert await HitlStore(bot.redis).peek(sid.format()) is None


async def test_a_slow_download_does_not_hold_up_anyone_else(make_bot: BotFactory) -> None:
    bot = await make_bot(ATTACHMENT_STALL_SECONDS=1.5)

    async def stalls(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"%PDF-1.4\n")
        await asyncio.sleep(20)
        return resp

    bot.outside.media["slow"] = stalls
    bot.outside.graph_script = [("text_final", {"content": "Hello Bob."})]
    other = "@bob:localhost"
    bot.outside.allowed.add(other)
    bobs_dm = bot.room(f"!bob{uuid.uuid4().hex[:8]}:localhost", 2)
    slow = asyncio.ensure_future(bot.handle(bot.dm, file_content("slow", "slow.pdf")))
    await asyncio.sleep(0.2)
    start = time.monotonic()
    await bot.handle(bobs_dm, {"msgtype": "m.text", "body": "hi"}, sender=other)
    assert time.monotonic() - start < 1.0
    assert bot.outside.bodies(bobs_dm) == ["Hello Bob."]
    await slow
    assert bot.outside.bodies(bot.dm) == [
        "⚠️ Downloading slow.pdf stalled, so I gave up. Please send it again."
    ]


# ---- the same I/O against a real Synapse ------------------------------------------------------------
@pytest.mark.e2e
async def test_real_synapse_encrypted_file_in_reply_and_image_out(
    synapse: SynapseServer, tmp_path: Path
) -> None:
    """What the stand-in cannot prove: Synapse serves the file on the authenticated media path
    to the bot's token, a replied-to file of an encrypted room is fetched and decrypted, and
    an image the bot posts there is encrypted and readable by the human."""
    alice = await new_human(synapse, "alice", tmp_path)
    bot = await new_human(synapse, "vagent", tmp_path)
    downloads = MediaDownloader.for_client(bot.client, BotSettings(MATRIX_HOMESERVER=synapse.url))
    try:
        room = await alice.create_dm(bot.user_id, encrypted=True)
        ciphertext, info = encrypt_attachment(PDF)
        up, _ = await alice.client.upload(
            io.BytesIO(ciphertext), filename="report.pdf", filesize=len(ciphertext)
        )
        assert isinstance(up, UploadResponse)
        content = {"msgtype": "m.file", "body": "report.pdf", "file": {**info, "url": up.content_uri}}
        file_event = await alice.send_event(room, "m.room.message", content)

        replied = await rooms.fetch_event(bot.client, room, file_event)
        found = media_of_event(replied or {})
        assert found is not None and found.name == "report.pdf" and found.encrypted is not None
        assert (await downloads.fetch(found, FILE_KINDS)).data == PDF
        assert await rooms.fetch_event(bot.client, "!elsewhere:localhost", file_event) is None

        image = ImageOut(name="chart.png", mimetype="image/png", data=base64.b64encode(PNG).decode())
        posted = await post_image(
            bot.client, room, image, thread_root=None, reply_to=file_event, max_bytes=1 << 20
        )
        assert posted is not None
        seen = await alice.wait_for(lambda e: e.event_id == posted)
        assert seen.encrypted and seen.content["msgtype"] == "m.image" and "url" not in seen.content
        file = seen.content["file"]
        downloaded = await alice.client.download(mxc=file["url"])
        assert isinstance(downloaded, MemoryDownloadResponse)
        assert (
            decrypt_attachment(downloaded.body, file["key"]["k"], file["hashes"]["sha256"], file["iv"]) == PNG
        )
    finally:
        await downloads.aclose()
        await alice.close()
        await bot.close()


# ---- a question too long for one message -------------------------------------------------------
PLANTED = "CONFIDENTIAL: the merger closes on 3 March."
LONG_QUESTION = (
    "Create this ticket in the ticket service, in your name?\n`description` (42 043 characters):\n```\n"
    + "filler " * 3000
    + PLANTED
    + " filler" * 3000
    + "\n```"
)


@pytest.mark.parametrize("encrypted", [False, True])
async def test_a_question_too_long_for_one_message_comes_whole_as_a_file_and_is_answered_as_usual(
    make_bot: BotFactory, encrypted: bool
) -> None:
    """A confirmation shows every character the call will send, so it can outgrow a Matrix
    event: the whole question goes out as a text file (encrypted in an encrypted room) with
    a short question after it, and "yes" in the conversation answers it as always."""
    bot = await make_bot()
    room = bot.room(f"!long{uuid.uuid4().hex[:8]}:localhost", 2, encrypted=encrypted)
    asked = {"question": LONG_QUESTION, "options": ["yes", "no"], "interrupt_id": "i-long"}
    bot.outside.graph_script = [("hitl_request", asked)]
    request = await bot.handle(room, {"msgtype": "m.text", "body": "open a ticket"})
    file, question = bot.outside.shown(room)
    [(uri, uploaded)] = bot.outside.uploads.items()
    if encrypted:
        info = file["file"]
        assert "url" not in file and info["url"] == uri and bot.outside.upload_names == [None]
        uploaded = decrypt_attachment(uploaded, info["key"]["k"], info["hashes"]["sha256"], info["iv"])
    else:
        assert file["url"] == uri and "file" not in file
    whole = format_question(LONG_QUESTION, ["yes", "no"]).encode()
    assert uploaded == whole  # every character
    assert (file["msgtype"], file["body"]) == ("m.file", "question.txt")
    assert file["info"] == {"mimetype": "text/plain", "size": len(whole)}
    assert file["m.relates_to"] == question["m.relates_to"] == {"m.in_reply_to": {"event_id": request}}
    assert question["body"].startswith(
        "❓ Create this ticket in the ticket service, in your name? (yes/no)\n📎 This question is too long"
    )
    assert PLANTED not in question["body"] and len(question["body"]) < 1000

    await bot.handle(room, {"msgtype": "m.text", "body": "maybe"})  # no answer: asked again, briefly
    again = bot.outside.bodies(room)[-1]
    assert again.startswith("Please answer yes or no. ❓ Create this ticket") and len(again) < 1000
    bot.outside.graph_script = [("text_final", {"content": "Ticket created."})]
    await bot.handle(room, {"msgtype": "m.text", "body": "yes"})
    [feedback] = bot.outside.feedback_requests
    assert (feedback["response"], feedback["interrupt_id"]) == ("yes", "i-long")
    assert bot.outside.bodies(room)[-1] == "Ticket created."


@pytest.mark.e2e
async def test_real_synapse_a_long_question_comes_as_an_encrypted_file_in_its_thread(
    synapse: SynapseServer, tmp_path: Path
) -> None:
    """The same against a real Synapse, in an encrypted DM: the human downloads and decrypts
    the whole question, and an answer in the thread belongs to the question's conversation."""
    alice = await new_human(synapse, "alice", tmp_path)
    bot = await new_human(synapse, "vagent", tmp_path)
    try:
        room = await alice.create_dm(bot.user_id, encrypted=True)
        root = await alice.send(room, "open a ticket about the printer")
        await bot.wait_for(lambda e: e.event_id == root)
        answer = Answer(bot.client, room, thread_root=root, reply_to=root, throttle=EditThrottle())
        asked_id = await post_question(answer, LONG_QUESTION, ["yes", "no"])
        assert asked_id is not None
        asked = await alice.wait_for(lambda e: e.event_id == asked_id)
        [file_id] = [e for e in answer.sent_event_ids if e != asked_id]
        file = await alice.wait_for(lambda e: e.event_id == file_id)
        assert asked.encrypted and file.encrypted and file.content["msgtype"] == "m.file"
        assert asked.relates_to["rel_type"] == file.relates_to["rel_type"] == "m.thread"
        assert asked.relates_to["event_id"] == file.relates_to["event_id"] == root
        assert "url" not in file.content
        info = file.content["file"]
        downloaded = await alice.client.download(mxc=info["url"])
        assert isinstance(downloaded, MemoryDownloadResponse)
        whole = decrypt_attachment(downloaded.body, info["key"]["k"], info["hashes"]["sha256"], info["iv"])
        assert whole.decode() == format_question(LONG_QUESTION, ["yes", "no"])

        reply = await alice.send(room, "yes", thread_root=root)
        seen = await bot.wait_for(lambda e: e.event_id == reply)
        raw = {"type": seen.type, "event_id": seen.event_id, "sender": seen.sender, "content": seen.content}
        msg = parse_message(raw, room)
        assert msg is not None
        assert session_for(msg) == SessionId(room_id=room, thread_id=root, user_id=alice.user_id)
        assert check_answer(msg.body, ["yes", "no"]).answer == "yes"
    finally:
        await alice.close()
        await bot.close()
