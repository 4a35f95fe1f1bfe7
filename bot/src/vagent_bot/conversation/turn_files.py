"""The files of one turn: the message's own (a file, or a voice message heard as text) and the
one it replies to, downloaded and checked, at most ATTACHMENT_MAX_PER_TURN.

Only called once the sender may use the agent at all (a denied user's file is never
downloaded), from the session's own worker (a download never holds up the sync loop or other
sessions). A reply's file is fetched from the reply's own room, never from another, and only
if the requester sent it themselves (`file_owner`): a reply to someone else's file ends the
turn with NOT_YOURS before anything is downloaded; so does a new thread started on one.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import structlog
from nio import AsyncClient

from vagent_bot.access.file_owner import NOT_YOURS, file_use
from vagent_bot.clients.transcribe import NOT_CONFIGURED, Transcriber, TranscriptionFailed
from vagent_bot.conversation.routing import IncomingMessage
from vagent_bot.matrix import rooms
from vagent_bot.matrix.downloads import MediaDownloader, MediaRefused
from vagent_bot.matrix.media import (
    FILE_KINDS,
    VOICE_KINDS,
    Media,
    kind_refusal,
    media_of_event,
    video_refusal,
    with_transcript,
)
from vagent_shared.attachments import Attachment

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class TurnInput:
    """What goes to the graph: the question (a voice message's transcript included), its files,
    and `heard`, the transcript the answer quotes back (None for a typed question)."""

    message: str
    attachments: list[Attachment] = field(default_factory=list)
    heard: str | None = None


class TurnFiles:
    """Downloads and transcription for the turns of all sessions."""

    def __init__(
        self,
        client: AsyncClient,
        downloader: MediaDownloader,
        transcriber: Transcriber,
        *,
        max_per_turn: int,
    ) -> None:
        self.client, self.downloader, self.transcriber = client, downloader, transcriber
        self.max_per_turn = max_per_turn

    async def aclose(self) -> None:
        await self.downloader.aclose()
        await self.transcriber.aclose()

    async def prepare(
        self,
        msg: IncomingMessage,
        text: str,
        replied_event: dict[str, Any] | None = None,
        *,
        thread_file: str | None = None,
    ) -> TurnInput:
        """`text`: what routing kept of the message (a caption, or ""); `replied_event`: the event
        it replies to if already fetched; `thread_file`: a thread root whose file (a document
        or an image; anything else is ignored) the question is about. Files that are not the
        message's own are checked first, so a refused turn downloads nothing. Raises
        MediaRefused or TranscriptionFailed (each with a `user_message` naming the file)."""
        replied = None
        if msg.in_reply_to is not None:
            replied = await self.others_file(msg, msg.in_reply_to, replied_event)
        attachments: list[Attachment] = []
        heard = None
        media = msg.media
        if media is not None and media.kind == "audio":
            heard = await self.hear(media)
            text = with_transcript(text, heard)
        elif media is not None:
            attachments.append(await self.attachment(media, msg.event_id))
        if replied is not None and len(attachments) < self.max_per_turn:
            refusal = kind_refusal(replied)
            if refusal is not None:
                raise MediaRefused(replied.kind, refusal)
            attachments.append(await self.attachment(replied, msg.in_reply_to))
        if thread_file is not None and not attachments:
            root = await self.others_file(msg, thread_file, documents_only=True)
            if root is not None:
                attachments.append(await self.attachment(root, thread_file))
        return TurnInput(text, attachments[: self.max_per_turn], heard)

    async def attachment(self, media: Media, event_id: str | None) -> Attachment:
        """A document or image, downloaded and checked; raises MediaRefused."""
        if media.kind == "video":
            raise MediaRefused("video", video_refusal(media.name))
        got = await self.downloader.fetch(media, FILE_KINDS)
        data = base64.b64encode(got.data)  # Attachment.data takes base64 (its wire form)
        return Attachment(name=media.name, data=data, declared_type=media.mimetype, event_id=event_id)

    async def hear(self, media: Media) -> str:
        """A voice message's words; raises TranscriptionFailed (nothing is downloaded when no
        speech service is configured) or MediaRefused."""
        if not self.transcriber.configured:
            raise TranscriptionFailed("not_configured", NOT_CONFIGURED)
        got = await self.downloader.fetch(media, VOICE_KINDS)
        return await self.transcriber.transcribe(got.data, media.name, got.mimetype)

    async def others_file(
        self,
        msg: IncomingMessage,
        event_id: str,
        event: dict[str, Any] | None = None,
        *,
        documents_only: bool = False,
    ) -> Media | None:
        """The file of another event of the message's room (the one it replies to, its thread's
        root) if the requester sent it; None when there is none (with `documents_only`: no
        document or image), or the bot posted it; raises MediaRefused (NOT_YOURS) when someone
        else did."""
        if event is None:
            event = await rooms.fetch_event(self.client, msg.room_id, event_id)
        if event is None or event.get("event_id", event_id) != event_id:
            return None
        media = media_of_event(event)
        if media is None or (documents_only and media.kind != "file"):
            return None
        use = file_use(event.get("sender"), msg.sender, str(self.client.user_id))
        if use == "refuse":
            log.info("file_not_theirs", replied_to=event_id)
            raise MediaRefused("not_yours", NOT_YOURS)
        return media if use == "use" else None
