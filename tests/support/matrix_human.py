"""A real person's Matrix client for end-to-end tests, on matrix-nio against a local Synapse.

The bot under test sees exactly what Element would send: threads with the `m.thread` fallback
structure, `m.mentions`, encrypted rooms (Megolm via nio + vodozemac), encrypted reactions.
The human records every room event it syncs (decrypted when it can) so tests can wait on
what the bot did and assert on the latest edited content of the bot's messages.

    alice = await new_human(synapse, "alice", tmp_path)
    room = await alice.create_dm(bot_user_id)
    await alice.send(room, "hi", mentions=[bot_user_id])
    reply = await alice.wait_for_reply(bot_user_id, room, lambda m: "hello" in m.body)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import nio

if TYPE_CHECKING:
    from synapse_local import SynapseServer

# Synapse's default timeline limit is 10 events per room and sync; a bot that streams by
# editing can exceed that between two syncs and the gap would silently drop events.
SYNC_FILTER: dict[str, Any] = {
    "room": {"timeline": {"limit": 500}, "state": {"lazy_load_members": False}},
    "presence": {"not_types": ["*"]},
}
MESSAGE_TYPES = ("m.room.message", "m.room.encrypted", "m.sticker")
MEGOLM = {"algorithm": "m.megolm.v1.aes-sha2"}


@dataclass(frozen=True)
class Event:
    """One room event as this human's client saw it; type/content are the decrypted ones."""

    room_id: str
    event_id: str
    sender: str
    type: str
    content: dict[str, Any]
    ts: int
    state_key: str | None = None
    encrypted: bool = False  # sent encrypted; type stays m.room.encrypted if undecryptable

    @property
    def relates_to(self) -> dict[str, Any]:
        rel = self.content.get("m.relates_to")
        return rel if isinstance(rel, dict) else {}

    @property
    def body(self) -> str | None:
        body = self.content.get("body")
        return body if isinstance(body, str) else None


@dataclass(frozen=True)
class Msg:
    """An m.room.message with its latest edit (m.replace by the same sender) applied."""

    event_id: str
    sender: str
    body: str
    formatted_body: str | None
    thread_root: str | None  # m.relates_to.event_id when rel_type is m.thread
    in_reply_to: str | None  # m.relates_to.m.in_reply_to.event_id, thread fallbacks included
    edits: int  # how many m.replace events were applied
    msgtype: str
    ts: int
    room_id: str = ""
    is_falling_back: bool = False  # thread message whose in_reply_to is only the fallback
    content: dict[str, Any] = field(default_factory=dict)  # latest content (m.new_content)


def _event_from_nio(room_id: str, ev: Any) -> Event | None:
    """Our view of a nio event; decrypted nio events carry the plaintext in `source`."""
    src = getattr(ev, "source", None)
    if not isinstance(src, dict) or "event_id" not in src:
        return None
    content = src.get("content")
    return Event(
        room_id=room_id,
        event_id=str(src["event_id"]),
        sender=str(src.get("sender", "")),
        type=str(src.get("type", "")),
        content=content if isinstance(content, dict) else {},
        ts=int(src.get("origin_server_ts", 0)),
        state_key=src.get("state_key"),
        encrypted=bool(getattr(ev, "decrypted", False)) or isinstance(ev, nio.MegolmEvent),
    )


def build_messages(events: list[Event], room_id: str, sender: str | None = None) -> list[Msg]:
    """Originals in timeline order, each with its edits applied (pure, for reuse in asserts)."""
    originals: list[Event] = []
    edits: dict[str, list[Event]] = {}
    for e in events:
        if e.room_id != room_id or e.type != "m.room.message":
            continue
        rel = e.relates_to
        if rel.get("rel_type") == "m.replace" and isinstance(rel.get("event_id"), str):
            edits.setdefault(rel["event_id"], []).append(e)
        else:
            originals.append(e)
    out = []
    for o in originals:
        if sender is not None and o.sender != sender:
            continue
        content, applied = o.content, 0
        for ed in sorted(edits.get(o.event_id, []), key=lambda e: e.ts):
            new = ed.content.get("m.new_content")
            if ed.sender == o.sender and isinstance(new, dict):
                content, applied = new, applied + 1
        rel = o.relates_to
        reply = rel.get("m.in_reply_to")
        out.append(
            Msg(
                event_id=o.event_id,
                sender=o.sender,
                body=str(content.get("body", "")),
                formatted_body=content.get("formatted_body"),
                thread_root=rel.get("event_id") if rel.get("rel_type") == "m.thread" else None,
                in_reply_to=reply.get("event_id") if isinstance(reply, dict) else None,
                edits=applied,
                msgtype=str(content.get("msgtype", "")),
                ts=o.ts,
                room_id=o.room_id,
                is_falling_back=bool(rel.get("is_falling_back", False)),
                content=content,
            )
        )
    return out


def _load_session(store_dir: Path, user_id: str) -> dict[str, Any]:
    """device_id and next_batch of an earlier login of user_id from store_dir, if any."""
    store_dir.mkdir(parents=True, exist_ok=True)
    session_file = store_dir / "session.json"
    if not session_file.exists():
        return {}
    saved: dict[str, Any] = json.loads(session_file.read_text())
    return saved if saved.get("user_id") == user_id else {}


class HumanClient:
    """A logged-in nio client plus a background sync that records everything it sees."""

    #: The background sync's long-poll; Synapse answers at once when an event arrives.
    sync_timeout_ms: int = 10_000

    def __init__(self, client: nio.AsyncClient, store_dir: Path, encryption: bool) -> None:
        self.client = client
        self.user_id: str = client.user_id
        self.store_dir, self.encryption = store_dir, encryption
        self.password: str | None = None  # set by new_human(), for a later login on this store
        self.events: list[Event] = []
        self.typing: list[tuple[str, tuple[str, ...]]] = []  # (room_id, users typing) as synced
        self.auto_join = True
        self.join_errors: list[str] = []
        self._ids: dict[str, int] = {}  # event_id -> index in self.events
        self._undecrypted: dict[str, Any] = {}  # event_id -> nio.MegolmEvent to retry
        self._typing_seen: set[tuple[str, str]] = set()
        self._join_tried: set[str] = set()
        self._change = asyncio.Event()
        self._crypto = asyncio.Lock()  # nio key upload/query/claim/share must not interleave
        self._task: asyncio.Task[None] | None = None

    # ---- session ---------------------------------------------------------------------------

    @classmethod
    async def login(
        cls, homeserver: str, user_id: str, password: str, store_dir: Path, encryption: bool = True
    ) -> HumanClient:
        """Password login; the same store_dir reuses the device (and its olm account)."""
        saved = _load_session(store_dir, user_id)
        config = nio.AsyncClientConfig(
            encryption_enabled=encryption,
            store_sync_tokens=True,
            max_limit_exceeded=0,  # a 429 should fail the test, not sleep silently
            max_timeouts=2,
            request_timeout=30,
        )
        client = nio.AsyncClient(
            homeserver,
            user_id,
            device_id=saved.get("device_id", ""),
            store_path=str(store_dir),
            config=config,
        )
        resp = await client.login(password, device_name="vagent test human")
        if not isinstance(resp, nio.LoginResponse):
            await client.close()
            raise RuntimeError(f"login {user_id} failed: {resp}")
        if not client.next_batch and not client.loaded_sync_token and saved.get("next_batch"):
            client.next_batch = saved["next_batch"]  # unencrypted: nio keeps no sync token
        human = cls(client, store_dir, encryption)
        human._save_session()
        return human

    def _save_session(self) -> None:
        data = {
            "user_id": self.user_id,
            "device_id": self.client.device_id,
            "next_batch": self.client.next_batch,
        }
        (self.store_dir / "session.json").write_text(json.dumps(data))

    async def close(self) -> None:
        """Stop syncing and close the HTTP session; the device stays for a later login."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._save_session()
        await self.client.close()

    # ---- sync ------------------------------------------------------------------------------

    async def start_sync(self) -> None:
        """One sync now (keys uploaded, invites joined), then keep syncing in the background."""
        if self._task is not None:
            return
        await self._sync_once(timeout_ms=0)
        self._task = asyncio.create_task(self._sync_loop(), name=f"sync {self.user_id}")
        self._task.add_done_callback(lambda _: self._notify())

    async def _sync_loop(self) -> None:
        failures = 0
        while True:
            try:
                await self._sync_once(timeout_ms=self.sync_timeout_ms)
                failures = 0
            except RuntimeError:
                failures += 1
                if failures > 10:
                    raise
                await asyncio.sleep(0.2)

    async def _sync_once(self, timeout_ms: int) -> None:
        resp = await self.client.sync(timeout=timeout_ms, sync_filter=SYNC_FILTER)
        if not isinstance(resp, nio.SyncResponse):
            raise RuntimeError(f"sync failed for {self.user_id}: {resp}")
        await self._crypto_housekeeping()
        self._retry_decryption()
        for room_id, info in resp.rooms.join.items():
            for ev in [*info.state, *info.timeline.events]:
                self._record(room_id, ev)
            for eph in info.ephemeral:
                if isinstance(eph, nio.TypingNoticeEvent):
                    self.typing.append((room_id, tuple(eph.users)))
                    self._typing_seen.update((room_id, u) for u in eph.users)
        self._notify()
        if self.auto_join:
            for room_id in resp.rooms.invite:
                if room_id not in self._join_tried:
                    self._join_tried.add(room_id)
                    joined = await self.client.join(room_id)
                    if not isinstance(joined, nio.JoinResponse):
                        self.join_errors.append(f"{room_id}: {joined}")

    async def _crypto_housekeeping(self) -> None:
        """What nio's sync_forever does between syncs: keys up, device lists, to-device out."""
        if self.client.olm is None:
            return
        async with self._crypto:
            if self.client.should_upload_keys:
                await self.client.keys_upload()
            if self.client.should_query_keys:
                await self.client.keys_query()
            if self.client.should_claim_keys:
                await self.client.keys_claim(self.client.get_users_for_key_claiming())
            await self.client.send_to_device_messages()

    def _record(self, room_id: str, ev: Any) -> None:
        event = _event_from_nio(room_id, ev)
        if event is None:
            return
        if isinstance(ev, nio.MegolmEvent):
            self._undecrypted[event.event_id] = ev
        index = self._ids.get(event.event_id)
        if index is None:
            self._ids[event.event_id] = len(self.events)
            self.events.append(event)
        elif self.events[index].type == "m.room.encrypted" and event.type != "m.room.encrypted":
            self.events[index] = event

    def _retry_decryption(self) -> None:
        """A room key can arrive (to-device) after its message; nio never retries by itself."""
        for event_id, ev in list(self._undecrypted.items()):
            try:
                decrypted = self.client.decrypt_event(ev)
            except (nio.EncryptionError, nio.LocalProtocolError):
                continue
            del self._undecrypted[event_id]
            self._record(ev.room_id, decrypted)

    def _notify(self) -> None:
        change, self._change = self._change, asyncio.Event()
        change.set()

    def _check_alive(self) -> None:
        if self._task is None:
            raise RuntimeError(f"{self.user_id}: call start_sync() first")
        if self._task.done() and not self._task.cancelled() and self._task.exception():
            raise RuntimeError(f"{self.user_id}: sync loop died") from self._task.exception()

    # ---- waiting ---------------------------------------------------------------------------

    async def _wait(self, check: Callable[[], Any], timeout: float, what: Callable[[], str]) -> Any:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while True:
            change = self._change
            self._check_alive()
            found = check()
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.user_id}: after {timeout}s, no {what()}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(change.wait(), remaining)

    async def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 20) -> Event:  # noqa: ASYNC109
        """First recorded event (past or future) matching predicate."""

        def check() -> Event | None:
            return next((e for e in self.events if predicate(e)), None)

        result: Event = await self._wait(check, timeout, lambda: "event matched the predicate")
        return result

    async def wait_joined(self, room_id: str, user_id: str, timeout: float = 20) -> None:  # noqa: ASYNC109
        """Until this client has synced user_id's join (so nio knows the room and members)."""
        await self.wait_for(
            lambda e: (
                e.room_id == room_id
                and e.type == "m.room.member"
                and e.state_key == user_id
                and e.content.get("membership") == "join"
            ),
            timeout,
        )

    async def messages_from(self, sender: str, room_id: str) -> list[Msg]:
        """sender's messages in room_id so far, latest edits applied, timeline order."""
        self._check_alive()
        return build_messages(self.events, room_id, sender)

    async def wait_for_reply(
        self,
        sender: str,
        room_id: str,
        predicate: Callable[[Msg], bool],
        timeout: float = 20,  # noqa: ASYNC109
    ) -> Msg:
        """First message of sender in room_id whose latest content satisfies predicate."""

        def check() -> Msg | None:
            return next((m for m in build_messages(self.events, room_id, sender) if predicate(m)), None)

        result: Msg = await self._wait(check, timeout, lambda: self._describe(sender, room_id))
        return result

    def _describe(self, sender: str, room_id: str) -> str:
        msgs = build_messages(self.events, room_id, sender)
        undecryptable = sum(
            1
            for e in self.events
            if e.room_id == room_id and e.sender == sender and e.type == "m.room.encrypted"
        )
        lines = [f"{m.msgtype} edits={m.edits} thread={m.thread_root} {m.body[:200]!r}" for m in msgs]
        return (
            f"matching message from {sender} in {room_id}; it sent {len(msgs)} message(s)"
            f" ({undecryptable} undecryptable):\n" + "\n".join(lines[-10:])
        )

    async def assert_no_message_from(
        self, sender: str, room_id: str, within: float, types: Collection[str] = MESSAGE_TYPES
    ) -> None:
        """Waits `within` s, then fails if sender sent anything of `types` since the call."""
        start = len(self.events)
        await asyncio.sleep(within)
        self._check_alive()
        new = [
            e for e in self.events[start:] if e.room_id == room_id and e.sender == sender and e.type in types
        ]
        assert not new, f"{sender} sent in {room_id}: {[(e.type, e.body) for e in new]}"

    def typing_seen_from(self, user_id: str, room_id: str) -> bool:
        """Whether a synced m.typing ever listed user_id (a start+stop between syncs is missed)."""
        return (room_id, user_id) in self._typing_seen

    async def wait_typing_from(self, user_id: str, room_id: str, timeout: float = 20) -> None:  # noqa: ASYNC109
        """Until a synced m.typing in room_id lists user_id."""
        await self._wait(
            lambda: True if self.typing_seen_from(user_id, room_id) else None,
            timeout,
            lambda: f"m.typing from {user_id} in {room_id}",
        )

    # ---- acting ----------------------------------------------------------------------------

    async def create_room(
        self,
        invite: list[str],
        name: str,
        state: list[dict[str, Any]] | None = None,
        encrypted: bool = False,
    ) -> str:
        """A private room (initial_state allowed); returns once this client synced its join."""
        initial_state = list(state or [])
        if encrypted:
            initial_state.append({"type": "m.room.encryption", "state_key": "", "content": MEGOLM})
        resp = await self.client.room_create(
            name=name, invite=invite, initial_state=initial_state, preset=nio.RoomPreset.private_chat
        )
        if not isinstance(resp, nio.RoomCreateResponse):
            raise RuntimeError(f"create_room failed: {resp}")
        room_id = str(resp.room_id)
        await self.wait_joined(room_id, self.user_id)
        return room_id

    async def create_dm(self, other_user_id: str, encrypted: bool = False, timeout: float = 20) -> str:  # noqa: ASYNC109
        """A DM like Element makes it (is_direct, trusted_private_chat); waits for their join."""
        initial_state = (
            [{"type": "m.room.encryption", "state_key": "", "content": MEGOLM}] if encrypted else []
        )
        resp = await self.client.room_create(
            is_direct=True,
            invite=[other_user_id],
            initial_state=initial_state,
            preset=nio.RoomPreset.trusted_private_chat,
        )
        if not isinstance(resp, nio.RoomCreateResponse):
            raise RuntimeError(f"create_dm failed: {resp}")
        room_id = str(resp.room_id)
        await self.wait_joined(room_id, other_user_id, timeout)
        return room_id

    async def join(self, room_id: str) -> None:
        resp = await self.client.join(room_id)
        if not isinstance(resp, nio.JoinResponse):
            raise RuntimeError(f"join {room_id} failed: {resp}")
        await self.wait_joined(room_id, self.user_id)

    def _thread_latest(self, room_id: str, root: str) -> str:
        """The newest event of a thread we have seen: the m.in_reply_to fallback target."""
        latest = root
        for e in self.events:
            rel = e.relates_to
            if e.room_id == room_id and rel.get("rel_type") == "m.thread" and rel.get("event_id") == root:
                latest = e.event_id
        return latest

    async def send(
        self,
        room_id: str,
        text: str,
        *,
        thread_root: str | None = None,
        reply_to: str | None = None,
        mentions: list[str] | None = None,
        html: str | None = None,
    ) -> str:
        """An m.text like Element sends it; returns the event id.

        Always carries `m.mentions` (empty when nobody is mentioned). A mentioned user id
        missing from the text is prepended to it (and as a pill to html).
        """
        mentions = list(mentions or [])
        missing = [u for u in mentions if u not in text]
        body = " ".join([*missing, text]) if missing else text
        content: dict[str, Any] = {"msgtype": "m.text", "body": body, "m.mentions": {}}
        if mentions:
            content["m.mentions"] = {"user_ids": mentions}
        if html is not None:
            pills = [f'<a href="https://matrix.to/#/{u}">{u}</a>' for u in mentions if u not in html]
            content["format"] = "org.matrix.custom.html"
            content["formatted_body"] = " ".join([*pills, html]) if pills else html
        if thread_root is not None:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": thread_root,
                "is_falling_back": reply_to is None,
                "m.in_reply_to": {"event_id": reply_to or self._thread_latest(room_id, thread_root)},
            }
        elif reply_to is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
        return await self.send_event(room_id, "m.room.message", content)

    async def edit(self, room_id: str, event_id: str, text: str) -> str:
        """m.replace of one of our messages, with the `* ` fallback body Element uses."""
        content = {
            "msgtype": "m.text",
            "body": f"* {text}",
            "m.new_content": {"msgtype": "m.text", "body": text},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
        }
        return await self.send_event(room_id, "m.room.message", content)

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}}
        return await self.send_event(room_id, "m.reaction", content)

    async def set_state(self, room_id: str, type: str, content: dict[str, Any], state_key: str = "") -> str:
        resp = await self.client.room_put_state(room_id, type, content, state_key=state_key)
        if not isinstance(resp, nio.RoomPutStateResponse):
            raise RuntimeError(f"set_state {type} failed: {resp}")
        return str(resp.event_id)

    async def send_event(self, room_id: str, type: str, content: dict[str, Any]) -> str:
        """Any room event, encrypted when the room is (reactions too, unlike nio's room_send)."""
        room = self.client.rooms.get(room_id)
        encrypted = self.client.olm is not None and room is not None and room.encrypted
        if not encrypted:
            resp = await self.client.room_send(room_id, type, content, ignore_unverified_devices=True)
        else:
            async with self._crypto:
                if self.client.should_query_keys:
                    await self.client.keys_query()
                if type != "m.reaction":
                    resp = await self.client.room_send(room_id, type, content, ignore_unverified_devices=True)
                else:
                    return await self._send_encrypted_raw(room_id, type, content)
        if not isinstance(resp, nio.RoomSendResponse):
            raise RuntimeError(f"send {type} to {room_id} failed: {resp}")
        return str(resp.event_id)

    async def _send_encrypted_raw(self, room_id: str, type: str, content: dict[str, Any]) -> str:
        """nio's room_send leaves m.reaction in clear text; Element encrypts it."""
        if not self.client.rooms[room_id].members_synced:
            await self.client.joined_members(room_id)
        if self.client.olm.should_share_group_session(room_id):
            await self.client.share_group_session(room_id, ignore_unverified_devices=True)
        enc_type, enc_content = self.client.encrypt(room_id, type, content)
        method, path, data = nio.Api.room_send(
            self.client.access_token, room_id, enc_type, enc_content, uuid4()
        )
        path = path.split("?", 1)[0]  # nio puts the token in the query; send it as a header only
        headers = {
            "Authorization": f"Bearer {self.client.access_token}",
            "Content-Type": "application/json",
        }
        http = await self.client.send(method, path, data, headers)
        body = await http.json()
        if http.status != 200 or "event_id" not in body:
            raise RuntimeError(f"send {type} to {room_id} failed: {http.status} {body}")
        return str(body["event_id"])


async def new_human(
    synapse: SynapseServer, localpart_prefix: str, tmp_path: Path, encryption: bool = True
) -> HumanClient:
    """Register a fresh user (unique localpart), log in, start syncing."""
    localpart = f"{localpart_prefix.lower()}-{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(12)
    user_id = await asyncio.to_thread(synapse.register_user, localpart, password)
    human = await HumanClient.login(synapse.url, user_id, password, tmp_path / localpart, encryption)
    human.password = password
    await human.start_sync()
    return human


@contextlib.asynccontextmanager
async def syncing_human(
    homeserver: str, user_id: str, password: str, store_dir: Path, encryption: bool = True
) -> AsyncIterator[HumanClient]:
    """An existing user logged in and syncing for the block; closed after it (the device stays)."""
    human = await HumanClient.login(homeserver, user_id, password, store_dir, encryption)
    try:
        await human.start_sync()
        yield human
    finally:
        await human.close()
