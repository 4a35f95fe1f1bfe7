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
with the `!ai` prefix there, as the bot answers only when addressed in a group room.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from nio import (
    AsyncClient,
    AsyncClientConfig,
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

BOT_COLOR, RESET, DIM = "\033[36m", "\033[0m", "\033[2m"
#: The bot's answer is over when it has stopped typing and nothing new came for this long:
#: the line is ended then, so what the person types next starts on a line of its own.
QUIET_SECONDS = 1.0


class Transcript:
    """The conversation as terminal lines: answers grow in place as the bot edits them, and
    the cursor is back at the start of a line once the bot is done, so the next input is
    never glued to the end of the bot's last line."""

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.out, self.clock = out, clock
        self.shown: dict[str, str] = {}  # bot message id -> text shown so far
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

    def new(self, event_id: str, body: str) -> None:
        self._write(f"{self._break()}{BOT_COLOR}vagent:{RESET} {body}")
        self.shown[event_id], self.last_id, self.closed_early = body, event_id, False

    def note(self, text: str) -> None:
        """A line of the client's own (a file sent or saved, an error), dim, on a line of its own."""
        self._write(f"{self._break()}{DIM}{text}{RESET}\n")
        self.last_id = None  # what the bot edits next is shown as an edit, not glued to this

    def edit(self, event_id: str, body: str) -> None:
        before = self.shown.get(event_id)
        if before is None:
            return
        if event_id == self.last_id and body.startswith(before):
            more = body[len(before) :]
            if self.closed_early and not self.open_line:
                more = more.removeprefix("\n")  # the line break was already written
            self._write(more)
        else:
            self._write(f"{self._break()}{BOT_COLOR}vagent (edited):{RESET} {body}")
            self.last_id, self.closed_early = event_id, False
        self.shown[event_id] = body

    def tick(self) -> None:
        """End the bot's line once it has finished (stopped typing, then quiet)."""
        if self.open_line and not self.bot_typing and self.clock() - self.last_output >= QUIET_SECONDS:
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
        for event in room.timeline.events:
            src: dict[str, Any] = getattr(event, "source", {}) or {}
            if src.get("sender") != self.bot or src.get("type") != "m.room.message":
                continue
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
        await self.client.room_send(self.room_id, "m.reaction", content, ignore_unverified_devices=True)
        self.transcript.note("(reacted 🔍 to the last answer)")

    async def save(self, content: dict[str, Any], directory: Path) -> None:
        """Download (and decrypt) a file the bot sent into `directory`; a note says where."""
        try:
            path = await save_media(self.client, content, directory, self.max_bytes)
        except CommandError as exc:
            self.transcript.note(f"(not saved: {exc})")
        else:
            self.transcript.note(f"(saved to {path})")

    async def send_file(self, command: FileCommand, group: bool) -> None:
        """Upload a `/file` or `/voice` (encrypted in an encrypted room) and send its event;
        CommandError says what went wrong."""
        assert self.room_id is not None
        file = await asyncio.to_thread(load_file, command, self.max_bytes)
        caption = command.caption
        if group and caption and not caption.startswith("!"):
            caption = f"!ai {caption}"  # a group room: address the bot
        room = self.client.rooms.get(self.room_id)
        encrypted = bool(room is not None and room.encrypted)
        content = await upload(self.client, file, encrypted, caption, command.voice)
        resp = await self.client.room_send(
            self.room_id, "m.room.message", content, ignore_unverified_devices=True
        )
        if not isinstance(resp, RoomSendResponse):
            raise CommandError(f"could not send {file.name}: {getattr(resp, 'message', resp)}")
        what = "voice message" if command.voice else content["msgtype"]
        self.transcript.note(f"(sent {file.name} as {what}, {content['info']['mimetype']})")


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


async def keep_lines(transcript: Transcript) -> None:
    while True:
        transcript.tick()
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


async def wait_for_bot(client: AsyncClient, room_id: str, bot: str, limit_s: float = 60) -> None:
    """Messages can only be sent (and encrypted for the bot) once the bot has joined."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        room = client.rooms.get(room_id)
        if room is not None and bot in room.users and not client.should_query_keys:
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"chat: {bot} did not join the DM within {limit_s:.0f} s; is `make run` running?")


async def amain(args: argparse.Namespace) -> None:
    store = Path(args.store) / args.user.strip("@").replace(":", "_")
    store.mkdir(parents=True, exist_ok=True)
    client = AsyncClient(
        args.homeserver,
        args.user,
        store_path=str(store),
        config=AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True),
    )
    creds = store / "credentials.json"
    if creds.exists():
        saved = json.loads(creds.read_text())
        client.restore_login(saved["user_id"], saved["device_id"], saved["access_token"])
    else:
        resp = await client.login(args.password, device_name="vagent-chat")
        if not isinstance(resp, LoginResponse):
            raise SystemExit(f"chat: login as {args.user} failed: {getattr(resp, 'message', resp)}")
        creds.write_text(
            json.dumps(
                {"user_id": resp.user_id, "device_id": resp.device_id, "access_token": resp.access_token}
            )
        )
        os.chmod(creds, 0o600)
    transcript = Transcript(sys.stdout)
    chat = Chat(client, args.bot, transcript, Path(args.save_dir) if args.save_dir else None)
    await client.sync(timeout=0, full_state=True)
    if args.with_user:
        password = args.with_password or f"{args.with_user.strip('@').split(':')[0]}-password"
        chat.room_id = await find_or_create_group(
            client, args.bot, args.with_user, password, args.tenant, args.homeserver
        )
    else:
        chat.room_id = await find_or_create_dm(client, args.bot)
    client.add_response_callback(chat.on_sync, SyncResponse)  # type: ignore[arg-type]
    sync = asyncio.create_task(client.sync_forever(timeout=1_000, full_state=False))
    lines = asyncio.create_task(keep_lines(transcript))
    await wait_for_bot(client, chat.room_id, args.bot)
    where = f"a room with {args.with_user}" if args.with_user else "an encrypted DM"
    print(
        f"{DIM}Logged in as {args.user}; talking to {args.bot} in {where} ({chat.room_id}). "
        f"Type a message; Ctrl-D quits. Try: what was the Q3 revenue?  /  how many records are "
        f"older than 2020?  /  delete records older than 2018  /  !help\n"
        f"Files: /file deploy/dev/samples/report.pdf what is the outlook?  /  "
        f"/voice deploy/dev/samples/voice.wav  /  /why (how the last answer came about)  /  /help{RESET}"
    )
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            text = line.strip()
            if text == "/help":
                transcript.note(HELP)
                continue
            if text == "/why":
                await chat.why()
                continue
            try:
                command = parse_command(text)
                if command is not None:
                    await chat.send_file(command, group=bool(args.with_user))
                    continue
            except CommandError as exc:
                transcript.note(f"chat: {exc}")
                continue
            if text and args.with_user and not text.startswith("!"):
                text = f"!ai {text}"  # a group room: address the bot
            if text:
                await client.room_send(
                    chat.room_id,
                    "m.room.message",
                    {"msgtype": "m.text", "body": text},
                    ignore_unverified_devices=True,
                )
    finally:
        for task in (sync, lines):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await client.close()
        print()


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # nio's key-sharing chatter is not for a chat window
    p = argparse.ArgumentParser(
        description="Talk to vagent from a terminal. In the chat:\n" + HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--homeserver", default=os.environ.get("CHAT_HOMESERVER", "http://127.0.0.1:8008"))
    p.add_argument("--user", default=os.environ.get("CHAT_USER", "@alice:localhost"))
    p.add_argument("--password", default=os.environ.get("CHAT_PASSWORD", "alice-password"))
    p.add_argument("--bot", default=os.environ.get("CHAT_BOT", "@vagent:localhost"))
    p.add_argument("--store", default=os.environ.get("CHAT_STORE", ".data/chat"))
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
        "--save-dir",
        default=os.environ.get("CHAT_SAVE_DIR", ".data/chat/received"),
        help="where files the bot sends (images) are saved; empty: only shown",
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()
