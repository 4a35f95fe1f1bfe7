"""Uploading a file the bot posts (an image a tool returned, a question too long for one
message), encrypted in an encrypted room.

In an encrypted room the bytes are uploaded as ciphertext and the key travels in the
Megolm-encrypted event's `file` (the server learns neither the content nor the name); in a
plain room the bytes are uploaded as they are, under their name.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from typing import Any

import structlog
from nio import AsyncClient, UploadResponse
from nio.crypto.attachments import encrypt_attachment

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Uploaded:
    """Where the event points: `url` in a plain room, `file` (url, key, iv, hashes) in an
    encrypted one."""

    url: str | None
    file: dict[str, Any] | None


async def upload(client: AsyncClient, room_id: str, data: bytes, mime: str, name: str) -> Uploaded | None:
    """Upload `data` for `room_id`; None (logged) when the homeserver refused it."""
    room = client.rooms.get(room_id)
    encrypted = bool(room is not None and room.encrypted)
    payload, file_info = (await asyncio.to_thread(encrypt_attachment, data)) if encrypted else (data, None)
    resp, _ = await client.upload(
        io.BytesIO(payload),
        content_type="application/octet-stream" if encrypted else mime,
        filename=None if encrypted else name,  # the name of an encrypted file stays in the event
        filesize=len(payload),
    )
    if not isinstance(resp, UploadResponse):
        log.error("upload_failed", error=getattr(resp, "status_code", type(resp).__name__))
        return None
    if file_info is not None:
        return Uploaded(None, {**file_info, "url": resp.content_uri})
    return Uploaded(resp.content_uri, None)
