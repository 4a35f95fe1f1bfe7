"""Facts about a room that the routing rules need and nio may not know yet: is it a DM, and
who sent an event (and what it said: a message may reply to a file). Asked of nio first, of
the homeserver when nio cannot say."""

from __future__ import annotations

from typing import Any

import structlog
from nio import AsyncClient, MegolmEvent, RoomGetEventResponse
from nio.exceptions import EncryptionError

from vagent_bot.access.audience import joined_members

log = structlog.get_logger(__name__)


async def is_dm(client: AsyncClient, room_id: str) -> bool:
    """Two members at most. nio counts them from the sync's room summary; without one (the
    first sync after a restart may carry none) it counts the members it knows, and with
    lazy-loaded members that is only who has spoken: a group room would pass for a DM
    (everything answered, no audience). Then the homeserver is asked for the members, once
    (nio keeps them up to date from then on); if it cannot say, the room is no DM."""
    room = client.rooms.get(room_id)
    if room is None:
        return False
    summary = room.summary
    counted = summary is not None and None not in (
        summary.joined_member_count,
        summary.invited_member_count,
    )
    if not counted and not room.members_synced and await joined_members(client, room_id) is None:
        return False
    return bool(room.member_count <= 2)


async def sender_of(client: AsyncClient, room_id: str, event_id: str) -> str | None:
    """Who sent `event_id` (a reply to the bot is addressed to it); None when it cannot be fetched."""
    resp = await client.room_get_event(room_id, event_id)
    return str(resp.event.sender) if isinstance(resp, RoomGetEventResponse) else None


async def fetch_event(client: AsyncClient, room_id: str, event_id: str) -> dict[str, Any] | None:
    """The JSON of `event_id` in `room_id` as its members read it: decrypted in an encrypted
    room. None when it cannot be fetched or decrypted (no key), or names another room: a
    reply's file is only ever taken from the room the reply is in (and only when the replier
    sent it: turn_files asks file_owner)."""
    resp = await client.room_get_event(room_id, event_id)
    if not isinstance(resp, RoomGetEventResponse):
        return None
    event: Any = resp.event
    if isinstance(event, MegolmEvent):
        event.room_id = room_id  # nio decrypts with the room id the event says it is in
        try:
            event = client.decrypt_event(event)
        except EncryptionError:
            log.info("replied_event_undecryptable", event_id=event_id)
            return None
        if isinstance(event, MegolmEvent):
            return None
    source = getattr(event, "source", None)
    if not isinstance(source, dict) or source.get("room_id", room_id) != room_id:
        return None
    return source
