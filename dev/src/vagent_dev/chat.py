"""`vagent-chat` (`make chat`): talk to the bot from a terminal as a Matrix user.

Logs in as the demo user, opens (or reuses) an encrypted DM with the bot, and shows the
bot's answers as they stream in (edits are printed as they grow). Type `yes`/`no` to
answer a confirmation; Ctrl-D or Ctrl-C quits.

`/file PATH [caption]` sends a file (the caption is the question about it) and `/voice PATH` a
recording as a voice message, both encrypted like the DM (chat_files.py builds the events;
deploy/dev/samples/ has one of each kind). Files the bot sends (an image a tool made) are
shown as one line, e.g. "[image: chart.png, 640x480, 12 KB]", and saved to --save-dir.

`--with @carol:localhost` (CHAT_WITH) talks in a group room with the bot and that user
instead (created with the tenant state event, the other user joined with their dev
password): answers there use only what everyone in the room may read. Messages are sent
with the `!ai` prefix there (commands too: `!ai !help`), as the bot answers only when
addressed in a group room.

What a newcomer would otherwise take for a broken client is said in one dim line each
(chat_hints.py decides): no reply to a message for CHAT_SILENCE_HINT_SECONDS (the bot is silent
by design for people without access), the homeserver unreachable and back, a stored login the
homeserver refused (a fresh Synapse: the chat logs in again with the password). The bot's
Markdown is printed readably (chat_render.py). Its files live under VAGENT_DATA_DIR, like
`make run`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    InviteMemberEvent,
    LoginResponse,
    MemoryDownloadResponse,
    RoomCreateResponse,
    RoomSendResponse,
    SyncResponse,
    TypingNoticeEvent,
    UploadResponse,
)
from nio.api import RoomPreset
from nio.client.async_client import ClientConnectionError
from nio.crypto.attachments import decrypt_attachment, encrypt_attachment
from nio.exceptions import EncryptionError

from vagent_dev.chat_files import (
    HELP,
    CommandError,
    FileCommand,
    OutgoingFile,
    describe_media,
    load_file,
    max_bytes_from_env,
    media_content,
    parse_command,
    saved_path,
)
from vagent_dev.chat_hints import (
    DEFAULT_PREFIX,
    SILENCE_HINT,
    HomeserverStatus,
    SilenceWatch,
    address_bot,
    data_dir,
    login_failed,
    relogged_in,
    silence_hint_seconds,
    token_refused,
    why_note,
)
from vagent_dev.chat_render import render_markdown

BOT_COLOR, RESET, DIM = "\033[36m", "\033[0m", "\033[2m"
#: The bot's answer is over when it has stopped typing and nothing new came for this long:
#: the line is ended then, so what the person types next starts on a line of its own.
QUIET_SECONDS = 1.0
#: What a homeserver that does not answer raises (nio retries none of it: max_timeouts=0).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (ClientConnectionError, TimeoutError, OSError)
#: Seconds between two tries while the homeserver is unreachable.
RETRY_SECONDS = (1.0, 2.0, 5.0)


class Transcript:
    """The conversation as terminal lines: answers grow in place as the bot edits them, and
    the cursor is back at the start of a line once the bot is done, so the next input is
    never glued to the end of the bot's last line. The bot's Markdown is shown rendered
    (`render_markdown`: ANSI bold on a terminal, plain through a pipe)."""

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.monotonic, tty: bool = False) -> None:
        self.out, self.clock, self.tty = out, clock, tty
        self.shown: dict[str, str] = {}  # bot message id -> rendered text shown so far
        self.raw: dict[str, str] = {}  # bot message id -> its latest Markdown
        self.last_id: str | None = None
        self.open_line = False  # the cursor is after text, not at the start of a line
        self.closed_early = False  # the line of last_id was ended while it could still grow
        self.bot_typing = False
        self.last_output = clock()

    def _write(self, text: str) -> None:
        if not text:
            return
        self.out.write(text)
        self.out.flush()
        self.open_line = not text.endswith("\n")
        self.last_output = self.clock()

    def _break(self) -> str:
        """A new message starts on a line of its own."""
        return "\n" if self.open_line else ""

    def _render(self, body: str, final: bool = False) -> str:
        return render_markdown(body, tty=self.tty, final=final)

    def _extend(self, more: str) -> None:
        if self.closed_early and not self.open_line:
            more = more.removeprefix("\n")  # the line break was already written
        self._write(more)

    def new(self, event_id: str, body: str) -> None:
        shown = self._render(body)
        self._write(f"{self._break()}{BOT_COLOR}vagent:{RESET} {shown}")
        self.shown[event_id], self.raw[event_id] = shown, body
        self.last_id, self.closed_early = event_id, False

    def note(self, text: str) -> None:
        """A line of the client's own (a file sent or saved, an error), dim, on a line of its own."""
        self._write(f"{self._break()}{DIM}{text}{RESET}\n")
        self.last_id = None  # what the bot edits next is shown as an edit, not glued to this

    def edit(self, event_id: str, body: str) -> None:
        before = self.shown.get(event_id)
        if before is None:
            return
        shown = self._render(body)
        if event_id == self.last_id and shown.startswith(before):
            self._extend(shown[len(before) :])
        else:
            self._write(f"{self._break()}{BOT_COLOR}vagent (edited):{RESET} {shown}")
            self.last_id, self.closed_early = event_id, False
        self.shown[event_id], self.raw[event_id] = shown, body

    def tick(self) -> None:
        """Once the bot has finished (stopped typing, then quiet): show what was held back
        while the answer could still change its meaning (a trailing `*`), end its line."""
        if self.bot_typing or self.clock() - self.last_output < QUIET_SECONDS:
            return
        last = self.last_id
        if last is not None and last in self.raw:
            final, before = self._render(self.raw[last], final=True), self.shown[last]
            if len(final) > len(before) and final.startswith(before):
                self._extend(final[len(before) :])
                self.shown[last] = final
        if self.open_line:
            self._write("\n")
            self.closed_early = True


class Chat:
    def __init__(
        self,
        client: AsyncClient,
        bot: str,
        transcript: Transcript,
        save_dir: Path | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.client, self.bot, self.transcript = client, bot, transcript
        self.room_id: str | None = None
        #: The bot's latest message (`/why` reacts 🔍 to it).
        self.last_answer: str | None = None
        #: Where the files the bot sends are saved (None: only shown).
        self.save_dir = save_dir
        self.max_bytes = max_bytes if max_bytes is not None else max_bytes_from_env()
        self._saving: set[asyncio.Task[None]] = set()
        #: Says so under a message the bot did not answer (silent by design for some people).
        self.silence = SilenceWatch(silence_hint_seconds())
        #: Prefix for group rooms (the bot's COMMAND_PREFIX); None in a DM, where all is for the bot.
        self.prefix: str | None = None

    def addressed(self, text: str) -> str:
        """The line as sent: in a group room with the bot's prefix, commands too (`!ai !help`)."""
        return address_bot(text, self.prefix) if self.prefix is not None else text

    async def _send(self, event_type: str, content: dict[str, Any]) -> bool:
        """Send one event; an unreachable homeserver or a refusal is one line, not a traceback.
        True when it was sent (the silence hint then waits for a reply)."""
        assert self.room_id is not None
        try:
            resp = await self.client.room_send(
                self.room_id, event_type, content, ignore_unverified_devices=True
            )
        except CONNECTION_ERRORS:
            self.transcript.note("chat: not sent, the homeserver is unreachable; try again in a moment")
            return False
        if isinstance(resp, ErrorResponse):
            self.transcript.note(f"chat: not sent: {resp.message or resp.status_code}")
            return False
        self.silence.sent(self.transcript.clock())
        return True

    async def send_text(self, text: str) -> None:
        """Send a typed line."""
        await self._send("m.room.message", {"msgtype": "m.text", "body": self.addressed(text)})

    def tick(self) -> None:
        """Called a few times a second: end the bot's finished line, say when no reply came."""
        self.transcript.tick()
        if self.silence.due(self.transcript.clock()):
            self.transcript.note(SILENCE_HINT)

    async def on_sync(self, resp: SyncResponse) -> None:
        for room_id, info in resp.rooms.invite.items():
            if any(isinstance(e, InviteMemberEvent) and e.sender == self.bot for e in info.invite_state):
                await self.client.join(room_id)
        if not self.room_id or self.room_id not in resp.rooms.join:
            return
        room = resp.rooms.join[self.room_id]
        for ephemeral in room.ephemeral:
            if isinstance(ephemeral, TypingNoticeEvent):
                self.transcript.bot_typing = self.bot in ephemeral.users
                if self.transcript.bot_typing:
                    self.silence.bot_spoke()
        for event in room.timeline.events:
            src: dict[str, Any] = getattr(event, "source", {}) or {}
            if src.get("sender") != self.bot or src.get("type") != "m.room.message":
                continue
            self.silence.bot_spoke()
            content = src.get("content") or {}
            rel = content.get("m.relates_to") or {}
            media = describe_media(content)
            if rel.get("rel_type") == "m.replace":
                self.transcript.edit(
                    str(rel.get("event_id")), str((content.get("m.new_content") or {}).get("body", ""))
                )
            elif media is not None:
                self.transcript.new(str(src.get("event_id")), media)
                if self.save_dir is not None:
                    task = asyncio.create_task(self.save(content, self.save_dir))
                    self._saving.add(task)
                    task.add_done_callback(self._saving.discard)
            else:
                body = str(content.get("body", ""))
                self.transcript.new(str(src.get("event_id")), body)
                answer = rel.get("rel_type") in (None, "m.thread") and not body.startswith("🔍")
                if answer:  # (not an edit, not a 🔍 account)
                    self.last_answer = str(src.get("event_id"))

    async def why(self) -> None:
        """React 🔍 to the bot's latest message: the bot explains how that answer came about."""
        assert self.room_id is not None
        if self.last_answer is None:
            self.transcript.note("chat: no answer to ask about yet")
            return
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": self.last_answer, "key": "🔍"}}
        if await self._send("m.reaction", content):
            self.transcript.note(why_note(self.last_answer))

    async def save(self, content: dict[str, Any], directory: Path) -> None:
        """Download (and decrypt) a file the bot sent into `directory`; a note says where."""
        try:
            path = await save_media(self.client, content, directory, self.max_bytes)
        except CommandError as exc:
            self.transcript.note(f"(not saved: {exc})")
        else:
            self.transcript.note(f"(saved to {path})")

    async def send_file(self, command: FileCommand) -> None:
        """Upload a `/file` or `/voice` (encrypted in an encrypted room) and send its event;
        CommandError says what went wrong."""
        assert self.room_id is not None
        file = await asyncio.to_thread(load_file, command, self.max_bytes)
        caption = self.addressed(command.caption) if command.caption else None
        room = self.client.rooms.get(self.room_id)
        encrypted = bool(room is not None and room.encrypted)
        try:
            content = await upload(self.client, file, encrypted, caption, command.voice)
            resp = await self.client.room_send(
                self.room_id, "m.room.message", content, ignore_unverified_devices=True
            )
        except CONNECTION_ERRORS:
            raise CommandError(f"could not send {file.name}: the homeserver is unreachable") from None
        if not isinstance(resp, RoomSendResponse):
            raise CommandError(f"could not send {file.name}: {getattr(resp, 'message', resp)}")
        what = "voice message" if command.voice else content["msgtype"]
        self.transcript.note(f"(sent {file.name} as {what}, {content['info']['mimetype']})")
        self.silence.sent(self.transcript.clock())


async def upload(
    client: AsyncClient, file: OutgoingFile, encrypted: bool, caption: str | None, voice: bool
) -> dict[str, Any]:
    """Upload the bytes (as ciphertext in an encrypted room: the key travels in the event, which
    Megolm encrypts) and build the event content."""
    payload, keys = await asyncio.to_thread(encrypt_attachment, file.data) if encrypted else (file.data, None)
    resp, _ = await client.upload(
        io.BytesIO(payload),
        content_type="application/octet-stream" if encrypted else file.mimetype,
        filename=file.name,
        filesize=len(payload),
    )
    if not isinstance(resp, UploadResponse):
        raise CommandError(f"could not upload {file.name}: {getattr(resp, 'message', resp)}")
    if keys is not None:
        return media_content(file, caption=caption, voice=voice, encrypted={**keys, "url": resp.content_uri})
    return media_content(file, caption=caption, voice=voice, url=resp.content_uri)


async def save_media(client: AsyncClient, content: dict[str, Any], directory: Path, max_bytes: int) -> Path:
    """The file of a media event, downloaded, decrypted if it came encrypted, written to a new
    file in `directory`; CommandError when that fails."""
    file = content.get("file") if isinstance(content.get("file"), dict) else None
    url = (file or content).get("url")
    if not isinstance(url, str) or not url.startswith("mxc://"):
        raise CommandError("the event names no file")
    resp = await client.download(mxc=url)
    if not isinstance(resp, MemoryDownloadResponse):
        raise CommandError(f"download failed: {getattr(resp, 'message', resp)}")
    data = resp.body
    if len(data) > max_bytes:
        raise CommandError(f"larger than {max_bytes} bytes")
    if file is not None:
        try:
            data = decrypt_attachment(data, file["key"]["k"], file["hashes"]["sha256"], file["iv"])
        except (KeyError, TypeError, ValueError, EncryptionError) as exc:
            raise CommandError(f"could not decrypt it ({type(exc).__name__})") from None
    name = str(content.get("filename") or content.get("body") or "file")
    return await asyncio.to_thread(_write_new, directory, name, data)


def _write_new(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = saved_path(directory, name)
    path.write_bytes(data)
    return path


async def keep_lines(chat: Chat) -> None:
    while True:
        chat.tick()
        await asyncio.sleep(0.1)


async def find_or_create_dm(client: AsyncClient, bot: str) -> str:
    for room_id, room in client.rooms.items():
        if room.member_count == 2 and bot in room.users:
            return str(room_id)
    resp = await client.room_create(
        is_direct=True,
        invite=[bot],
        preset=RoomPreset.trusted_private_chat,
        initial_state=[
            {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}
        ],
    )
    if not isinstance(resp, RoomCreateResponse):
        raise SystemExit(f"chat: could not create a DM with {bot}: {resp}")
    return str(resp.room_id)


async def find_or_create_group(
    client: AsyncClient, bot: str, other: str, other_password: str, tenant: str, homeserver: str
) -> str:
    """A room with the bot and `other` (who joins with their password), reused when it exists."""
    name = f"vagent demo with {other}"
    for room_id, room in client.rooms.items():
        if room.name == name:
            return str(room_id)
    resp = await client.room_create(
        name=name,
        invite=[bot, other],
        preset=RoomPreset.private_chat,
        initial_state=[{"type": "io.vagent.tenant", "state_key": "", "content": {"domain": tenant}}],
    )
    if not isinstance(resp, RoomCreateResponse):
        raise SystemExit(f"chat: could not create a room with {bot} and {other}: {resp}")
    guest = AsyncClient(homeserver, other)
    try:
        login = await guest.login(other_password, device_name="vagent-chat (joining)")
        if not isinstance(login, LoginResponse):
            raise SystemExit(
                f"chat: could not log in as {other} to join the room: {getattr(login, 'message', login)}"
            )
        await guest.join(str(resp.room_id))
    finally:
        await guest.close()
    return str(resp.room_id)


async def wait_for_bot(
    client: AsyncClient, room_id: str, bot: str, sync: asyncio.Task[None], limit_s: float = 60
) -> None:
    """Messages can only be sent (and encrypted for the bot) once the bot has joined."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        if sync.done():
            raise SystemExit(1)  # it said why
        room = client.rooms.get(room_id)
        if room is not None and bot in room.users and not client.should_query_keys:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"chat: {bot} did not join the DM within {limit_s:.0f} s; is `make run` running?")


T = TypeVar("T")


def new_client(args: argparse.Namespace, store: Path) -> AsyncClient:
    """nio's client, told not to retry a homeserver that does not answer (the chat says so
    and retries itself)."""
    return AsyncClient(
        args.homeserver,
        args.user,
        store_path=str(store),
        config=AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True, max_timeouts=0),
    )


class Session:
    """The chat's Matrix client and how the homeserver is doing; whatever client is current is
    closed on every way out (no `Unclosed client session` noise)."""

    def __init__(self, args: argparse.Namespace, store: Path, transcript: Transcript) -> None:
        self.args, self.store, self.transcript = args, store, transcript
        self.status = HomeserverStatus(args.homeserver)
        self.client = new_client(args, store)

    async def close(self) -> None:
        await self.client.close()

    def _note(self, line: str | None) -> None:
        if line:
            self.transcript.note(line)

    async def reachable(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`, tried again (one line says so) while the homeserver does not answer."""
        tries = 0
        while True:
            try:
                result = await attempt()
            except CONNECTION_ERRORS:
                self._note(self.status.failed())
                await asyncio.sleep(RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)])
                tries += 1
                continue
            self._note(self.status.worked())
            return result

    async def start(self) -> None:
        """Logged in (the stored login, or with the password: first time, or when the
        homeserver refuses the stored one) and synced once."""
        creds = self.store / "credentials.json"
        if creds.exists():
            saved = json.loads(creds.read_text())
            self.client.restore_login(saved["user_id"], saved["device_id"], saved["access_token"])
            first = await self.reachable(lambda: self.client.sync(timeout=0, full_state=True))
            if isinstance(first, SyncResponse):
                return
            errcode = getattr(first, "status_code", None)
            if not token_refused(errcode):
                raise SystemExit(f"chat: the homeserver refused to sync: {getattr(first, 'message', first)}")
            await self.client.close()
            forget_login(self.store)
            self.client = new_client(self.args, self.store)
            await self.login()
            self.transcript.note(relogged_in(self.client.user_id))
        else:
            await self.login()
        first = await self.reachable(lambda: self.client.sync(timeout=0, full_state=True))
        if not isinstance(first, SyncResponse):
            raise SystemExit(f"chat: the homeserver refused to sync: {getattr(first, 'message', first)}")

    async def login(self) -> None:
        resp = await self.reachable(lambda: self.client.login(self.args.password, device_name="vagent-chat"))
        if not isinstance(resp, LoginResponse):
            reason = str(getattr(resp, "message", None) or resp)
            raise SystemExit(login_failed(self.args.user, reason, self.args.homeserver, self.store))
        creds = self.store / "credentials.json"
        creds.write_text(
            json.dumps(
                {"user_id": resp.user_id, "device_id": resp.device_id, "access_token": resp.access_token}
            )
        )
        os.chmod(creds, 0o600)

    async def sync_forever(self, chat: Chat) -> None:
        """nio's `sync_forever`, saying when the homeserver stops answering and comes back, and
        stopping with one line when it no longer knows this login."""
        client, tries = self.client, 0
        while True:
            try:
                resp = await client.sync(timeout=1_000)
                if isinstance(resp, SyncResponse):
                    await client.send_to_device_messages()
                    if client.should_upload_keys:
                        await client.keys_upload()
                    if client.should_query_keys:
                        await client.keys_query()
                    if client.should_claim_keys:
                        await client.keys_claim(client.get_users_for_key_claiming())
            except CONNECTION_ERRORS:
                self._note(self.status.failed())
                await asyncio.sleep(RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)])
                tries += 1
                continue
            if not isinstance(resp, SyncResponse):
                if token_refused(getattr(resp, "status_code", None)):
                    self.transcript.note(
                        "chat: the homeserver no longer knows this login (was it reset?); "
                        "start `make chat` again to log in anew"
                    )
                    return
                self._note(self.status.failed())
                await asyncio.sleep(RETRY_SECONDS[-1])
                continue
            tries = 0
            self._note(self.status.worked())
            await chat.on_sync(resp)


def forget_login(store: Path) -> None:
    """Drop a login the homeserver refused: its token and its device's crypto store (the next
    login is a new device with keys of its own)."""
    (store / "credentials.json").unlink(missing_ok=True)
    for db in store.glob("*.db"):
        db.unlink(missing_ok=True)


async def amain(args: argparse.Namespace) -> None:
    store = Path(args.store) / args.user.strip("@").replace(":", "_")
    store.mkdir(parents=True, exist_ok=True)
    transcript = Transcript(sys.stdout, tty=sys.stdout.isatty())
    session = Session(args, store, transcript)
    tasks: list[asyncio.Task[None]] = []
    try:
        await session.start()
        client = session.client
        chat = Chat(client, args.bot, transcript, Path(args.save_dir) if args.save_dir else None)
        if args.with_user:
            chat.prefix = args.prefix
            password = args.with_password or f"{args.with_user.strip('@').split(':')[0]}-password"
            chat.room_id = await session.reachable(
                lambda: find_or_create_group(
                    client, args.bot, args.with_user, password, args.tenant, args.homeserver
                )
            )
        else:
            chat.room_id = await session.reachable(lambda: find_or_create_dm(client, args.bot))
        sync = asyncio.create_task(session.sync_forever(chat))
        tasks += [sync, asyncio.create_task(keep_lines(chat))]
        await wait_for_bot(client, chat.room_id, args.bot, sync)
        where = f"a room with {args.with_user}" if args.with_user else "an encrypted DM"
        print(
            f"{DIM}Logged in as {args.user}; talking to {args.bot} in {where} ({chat.room_id}). "
            f"Type a message; Ctrl-D quits. Try: what was the Q3 revenue?  /  how many records are "
            f"older than 2020?  /  delete records older than 2018  /  !help\n"
            f"Files: /file deploy/dev/samples/report.pdf what is the outlook?  /  "
            f"/voice deploy/dev/samples/voice.wav  /  /why (how the last answer came about)  /  /help\n"
            f"Memory and schedules: !remember I prefer short answers  /  !memory  /  "
            f"!schedule in 2m: remind me to stretch  /  !schedules  /  !unschedule 1{RESET}"
        )
        await converse(chat, sync)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await session.close()
        print()


def stdin_lines() -> asyncio.Queue[str]:
    """The person's lines ("" at Ctrl-D), read by a daemon thread: a chat that stops on its own
    (a lost login) does not wait for one more Enter to exit."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        while True:
            line = sys.stdin.readline()
            try:
                loop.call_soon_threadsafe(queue.put_nowait, line)
            except RuntimeError:  # the chat has ended
                return
            if not line:
                return

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return queue


async def converse(chat: Chat, sync: asyncio.Task[None]) -> None:
    """Read the person's lines until Ctrl-D (or the sync gave up on a login it lost)."""
    lines = stdin_lines()
    while True:
        reading = asyncio.ensure_future(lines.get())
        done, _ = await asyncio.wait({reading, sync}, return_when=asyncio.FIRST_COMPLETED)
        if reading not in done:
            reading.cancel()
            raise SystemExit(1)  # sync_forever said why
        line = reading.result()
        if not line:
            return
        text = line.strip()
        if text == "/help":
            chat.transcript.note(HELP)
            continue
        if text == "/why":
            await chat.why()
            continue
        try:
            command = parse_command(text)
            if command is not None:
                await chat.send_file(command)
                continue
        except CommandError as exc:
            chat.transcript.note(f"chat: {exc}")
            continue
        if text:
            await chat.send_text(text)


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # nio's key-sharing chatter is not for a chat window
    data = data_dir()
    p = argparse.ArgumentParser(
        description="Talk to vagent from a terminal. In the chat:\n" + HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    synapse = f"http://127.0.0.1:{os.environ.get('SYNAPSE_PORT') or 8008}"
    p.add_argument(
        "--homeserver",
        default=os.environ.get("CHAT_HOMESERVER", synapse),
        help="default: make run's Synapse (SYNAPSE_PORT, 8008)",
    )
    p.add_argument("--user", default=os.environ.get("CHAT_USER", "@alice:localhost"))
    p.add_argument("--password", default=os.environ.get("CHAT_PASSWORD", "alice-password"))
    p.add_argument("--bot", default=os.environ.get("CHAT_BOT", "@vagent:localhost"))
    p.add_argument(
        "--store",
        default=os.environ.get("CHAT_STORE", str(data / "chat")),
        help="logins and encryption keys (default: VAGENT_DATA_DIR/chat)",
    )
    p.add_argument(
        "--with",
        dest="with_user",
        default=os.environ.get("CHAT_WITH") or None,
        help="talk in a group room with the bot and this user (e.g. @carol:localhost)",
    )
    p.add_argument(
        "--with-password",
        default=os.environ.get("CHAT_WITH_PASSWORD") or None,
        help="that user's password (default: the demo convention <name>-password)",
    )
    p.add_argument("--tenant", default=os.environ.get("CHAT_TENANT", "localhost"), help="the room's domain")
    p.add_argument(
        "--prefix",
        default=os.environ.get("COMMAND_PREFIX") or DEFAULT_PREFIX,
        help="how the bot is addressed in a group room (the bot's COMMAND_PREFIX)",
    )
    p.add_argument(
        "--save-dir",
        default=os.environ.get("CHAT_SAVE_DIR", str(data / "chat" / "received")),
        help="where files the bot sends are saved (VAGENT_DATA_DIR/chat/received); empty: only shown",
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()
