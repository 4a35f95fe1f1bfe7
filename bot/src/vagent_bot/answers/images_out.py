"""Posting an image a tool returned (the graph's `ImageOut` event) into the room, after the
answer text, in the same thread or reply chain.

Encrypted in an encrypted room, plain otherwise (`uploads`). The graph has checked the image
already; the bot checks again what it is about to publish (size, type from the bytes) and
skips, with a log line, anything else.
"""

from __future__ import annotations

import binascii
from base64 import b64decode

import structlog
from nio import AsyncClient

from vagent_bot.answers.event_content import image_content
from vagent_bot.matrix import client as matrix
from vagent_bot.matrix.uploads import upload
from vagent_shared.attachments import clean_name, kind_of, sniff_mime
from vagent_shared.events import ImageOut

log = structlog.get_logger(__name__)


async def post_image(
    client: AsyncClient,
    room_id: str,
    image: ImageOut,
    *,
    thread_root: str | None,
    reply_to: str | None,
    max_bytes: int,
) -> str | None:
    """Upload and post one image; its event id, or None when it was skipped or failed."""
    name = clean_name(image.name)
    try:
        data = b64decode("".join(image.data.split()), validate=True)  # line breaks allowed
    except (binascii.Error, ValueError):
        log.warning("image_out_skipped", reason="not_base64")
        return None
    if len(data) > max_bytes:
        log.warning("image_out_skipped", reason="too_large", bytes=len(data), max_bytes=max_bytes)
        return None
    mime = sniff_mime(data, name)
    if mime is None or kind_of(mime) != "image":
        log.warning("image_out_skipped", reason="not_an_image", sniffed=mime)
        return None
    uploaded = await upload(client, room_id, data, mime, name)
    if uploaded is None:
        return None
    content = image_content(
        name,
        mime,
        len(data),
        url=uploaded.url,
        file=uploaded.file,
        width=image.width,
        height=image.height,
        thread_root=thread_root,
        reply_to=reply_to,
    )
    event_id = await matrix.send(client, room_id, content)
    encrypted = uploaded.file is not None
    log.info("image_out_posted", bytes=len(data), mimetype=mime, encrypted=encrypted, ok=event_id is not None)
    return event_id
