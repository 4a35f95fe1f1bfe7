"""What a media event (`m.file`, `m.image`, `m.audio`, `m.video`) says, and which files the bot
takes: pure rules over the raw event content, so the routing and the refusals are unit-tested
without a homeserver.

Nothing here is trusted for more than a hint: the declared type and size only let the bot
refuse early; the bytes decide (`vagent_shared.attachments.sniff_mime`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from vagent_shared.attachments import Kind, clean_name, kind_of

FILE, IMAGE, AUDIO, VIDEO = "m.file", "m.image", "m.audio", "m.video"
MEDIA_MSGTYPES = frozenset({FILE, IMAGE, AUDIO, VIDEO})
#: MSC3245: an `m.audio` recorded as a voice message (Element: OGG/Opus).
VOICE_KEY = "org.matrix.msc3245.voice"
#: What a file sent as a document or image may turn out to be; what a voice message may be.
FILE_KINDS: frozenset[Kind] = frozenset({"document", "image"})
VOICE_KINDS: frozenset[Kind] = frozenset({"audio"})
#: The longest transcript quoted back to the user (the whole one goes to the agent).
HEARD_MAX_CHARS = 300

MediaKind = Literal["file", "audio", "video"]

# mxc://<server name (host, port, IPv6 literal)>/<media id> (spec: "Matrix Content URIs")
_MXC = re.compile(r"mxc://([A-Za-z0-9.\-]+(?::\d{1,5})?|\[[0-9A-Fa-f:.]+\](?::\d{1,5})?)/([A-Za-z0-9_\-]+)")


@dataclass(frozen=True)
class EncryptedFile:
    """How to decrypt a file of an encrypted room (the event's `file`): AES-CTR key (JWK `k`),
    IV and the SHA-256 of the ciphertext, all unpadded base64."""

    key: str
    iv: str
    sha256: str


@dataclass(frozen=True)
class Media:
    """One media event's file. `url` is the mxc URI of the bytes (the ciphertext when
    `encrypted` is set); `caption` is the text sent with it (MSC2530), None when the body is
    only the file name."""

    msgtype: str
    name: str
    caption: str | None
    mimetype: str | None
    size: int | None
    url: str
    encrypted: EncryptedFile | None = None
    is_voice: bool = False

    @property
    def kind(self) -> MediaKind:
        """`audio` is heard (transcribed), `video` refused, anything else read as a file."""
        if self.msgtype == AUDIO:
            return "audio"
        if self.msgtype == VIDEO:
            return "video"
        return "file"


def parse_media(content: dict[str, Any]) -> Media | None:
    """The file of a media event's content; None for other msgtypes, or without a usable mxc
    URI (plain `url`, or the encrypted `file` with its key, IV and hash)."""
    msgtype = content.get("msgtype")
    body = content.get("body")
    if msgtype not in MEDIA_MSGTYPES or not isinstance(body, str):
        return None
    encrypted = None
    file = content.get("file")
    if isinstance(file, dict):
        url, encrypted = file.get("url"), _encrypted(file)
        if encrypted is None:
            return None
    else:
        url = content.get("url")
    if not isinstance(url, str) or mxc_parts(url) is None:
        return None
    filename = content.get("filename")
    if not isinstance(filename, str) or not filename.strip():
        filename = None
    caption = body.strip() if filename is not None and filename != body else None
    info = content.get("info")
    info = info if isinstance(info, dict) else {}
    mimetype, size = info.get("mimetype"), info.get("size")
    return Media(
        msgtype=str(msgtype),
        name=clean_name(filename or body),
        caption=caption or None,
        mimetype=mimetype if isinstance(mimetype, str) else None,
        size=size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
        url=url,
        encrypted=encrypted,
        is_voice=msgtype == AUDIO and VOICE_KEY in content,
    )


def media_of_event(event: dict[str, Any]) -> Media | None:
    """The file of a whole raw event (one fetched because a message replies to it)."""
    content = event.get("content")
    if event.get("type") != "m.room.message" or not isinstance(content, dict):
        return None
    return parse_media(content)


def mxc_parts(url: str) -> tuple[str, str] | None:
    """(server name, media id) of an mxc URI; None when it is not one."""
    m = _MXC.fullmatch(url)
    return (m.group(1), m.group(2)) if m else None


def _encrypted(file: dict[str, Any]) -> EncryptedFile | None:
    key, hashes, iv = file.get("key"), file.get("hashes"), file.get("iv")
    k = key.get("k") if isinstance(key, dict) else None
    sha = hashes.get("sha256") if isinstance(hashes, dict) else None
    if isinstance(k, str) and isinstance(iv, str) and isinstance(sha, str) and k and iv and sha:
        return EncryptedFile(key=k, iv=iv, sha256=sha)
    return None


# ---- what the bot takes, in words the user reads ---------------------------------------------
def human_size(n: int) -> str:
    """1536 -> "1.5 KB", 20971520 -> "20 MB" (binary units, as clients show them)."""
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def too_large(name: str, limit: int, size: int | None = None) -> str:
    """The size is named only when it reads differently from the limit ("2 MB is larger than
    the 2 MB" would be nonsense to the user)."""
    shown = human_size(size) if size is not None else None
    what = f" ({shown})" if shown is not None and shown != human_size(limit) else ""
    return f"{name}{what} is larger than the {human_size(limit)} I can take."


def declared_size_refusal(media: Media, limit: int) -> str | None:
    """Refused before downloading: the event says the file is too large."""
    if media.size is not None and media.size > limit:
        return too_large(media.name, limit, media.size)
    return None


def type_refusal(name: str, mime: str | None, accept: frozenset[Kind]) -> str | None:
    """The downloaded bytes are not a kind the agent takes (`FILE_KINDS`, `VOICE_KINDS`)."""
    if kind_of(mime) in accept:
        return None
    if accept == VOICE_KINDS:
        return f"{name} is not a voice recording I can listen to."
    return (
        f"I can't read {name}: I take PDF, Word, text, Markdown, HTML and CSV documents "
        "and PNG, JPEG, GIF and WebP images."
    )


def kind_refusal(media: Media) -> str | None:
    """A file replied to that the agent cannot take with a question at all."""
    if media.kind == "video":
        return video_refusal(media.name)
    if media.kind == "audio":
        return f"I can only listen to voice messages sent to me, not to {media.name} in a reply."
    return None


def video_refusal(name: str) -> str:
    return f"🎬 Sorry, videos are not supported yet, so I can't look at {name}."


def heard_line(transcript: str) -> str:
    """The quoted line an answer to a voice message starts with: what the bot understood, on one
    line, shortened, so a wrong transcript is noticed at once."""
    said = " ".join(transcript.split())
    if len(said) > HEARD_MAX_CHARS:
        said = said[: HEARD_MAX_CHARS - 1].rstrip() + "…"
    return f'> 🎤 "{said}"\n\n'


def with_transcript(caption: str, transcript: str) -> str:
    """The question of a voice message: the transcript, after the caption if there is one."""
    return f"{caption}\n\n{transcript}" if caption else transcript
