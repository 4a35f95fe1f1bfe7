"""The files of `make chat` (`vagent-chat`): `/file PATH [caption]` and `/voice PATH`, and how
the bot's own files are shown. Pure parts only (no Matrix client), so they are unit-tested.

Why the type comes from the bytes (`vagent_shared.attachments.sniff_mime`): the bot decides
from the bytes too, so the chat sends what the bot will see (an image as `m.image`, a
recording as `m.audio`), whatever the file is called.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vagent_dev.audio_files import audio_duration
from vagent_shared.attachments import clean_name, kind_of, sniff_mime
from vagent_shared.settings import CommonSettings

#: MSC3245: an `m.audio` that is a voice message; MSC1767: its duration (ms) for clients.
VOICE_KEY = "org.matrix.msc3245.voice"
AUDIO_KEY = "org.matrix.msc1767.audio"
_FIELD = CommonSettings.model_fields["ATTACHMENT_MAX_BYTES"]
DEFAULT_MAX_BYTES: int = _FIELD.default
#: What a file type is sent as (MSC: clients show each kind its own way).
_MSGTYPES = {"image": "m.image", "audio": "m.audio", "video": "m.video"}
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}

HELP = """\
  /file PATH [caption]   send a file (PDF, Word, text, image, ...); the caption is the question
  /voice PATH            send a recording as a voice message (e.g. deploy/dev/samples/voice.wav)
  /why                   react 🔍 to the last answer: how it came about (tools, sources, tokens, time);
                         prints the answer's event id for `vagent trace show`
  /help                  this help;  !help  the bot's own help;  Ctrl-D quits"""


class CommandError(Exception):
    """A `/file` or `/voice` that cannot be sent; the message says why, for the person."""


@dataclass(frozen=True)
class FileCommand:
    """`/file PATH [caption]` (voice False) or `/voice PATH [caption]` (voice True)."""

    path: Path
    caption: str | None
    voice: bool


@dataclass(frozen=True)
class OutgoingFile:
    """A file read and checked, ready to upload: its bytes, the type sniffed from them and the
    Matrix msgtype it goes as."""

    name: str
    data: bytes
    mimetype: str
    msgtype: str
    width: int | None = None
    height: int | None = None
    duration_ms: int | None = None


def max_bytes_from_env(env: dict[str, str] | None = None) -> int:
    """ATTACHMENT_MAX_BYTES as the bot reads it (its default when unset or not a number)."""
    value = (os.environ if env is None else env).get("ATTACHMENT_MAX_BYTES", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_BYTES


def parse_command(line: str) -> FileCommand | None:
    """The file command of an input line; None when the line is not one (it is sent as text).
    CommandError for `/file` or `/voice` without a path. A path with spaces is quoted."""
    word, _, rest = line.strip().partition(" ")
    if word not in ("/file", "/voice"):
        return None
    rest = rest.strip()
    if not rest:
        raise CommandError(f"usage: {word} PATH" + (" [caption]" if word == "/file" else ""))
    if rest[0] in "\"'":
        end = rest.find(rest[0], 1)
        if end < 0:
            raise CommandError(f"{word}: no closing quotation mark after the path")
        path, caption = rest[1:end], rest[end + 1 :]
    else:
        path, _, caption = rest.partition(" ")
    return FileCommand(Path(path).expanduser(), caption.strip() or None, voice=word == "/voice")


def load_file(command: FileCommand, max_bytes: int) -> OutgoingFile:
    """Read and check the file of a command; CommandError says what is wrong with it."""
    path = command.path
    if not path.exists():
        raise CommandError(f"{path}: no such file")
    if not path.is_file():
        raise CommandError(f"{path}: not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise CommandError(
            f"{path}: {human_size(size)} is larger than the {human_size(max_bytes)} the bot takes "
            "(ATTACHMENT_MAX_BYTES)"
        )
    if size == 0:
        raise CommandError(f"{path}: the file is empty")
    data = path.read_bytes()
    return outgoing(clean_name(path.name), data, voice=command.voice)


def outgoing(name: str, data: bytes, *, voice: bool = False) -> OutgoingFile:
    """The msgtype and details of `data`: `m.image` with its size in pixels, `m.audio` with its
    duration, `m.video`, else `m.file`. CommandError for a voice message that is not audio."""
    mime = sniff_mime(data, name)
    kind = kind_of(mime)
    if voice and kind != "audio":
        raise CommandError(f"{name}: not an audio recording ({mime or 'unknown type'}); use /file")
    msgtype = _MSGTYPES.get(kind, "m.file")
    mimetype = mime or "application/octet-stream"
    if kind == "image":
        size = image_size(data)
        return OutgoingFile(name, data, mimetype, msgtype, *(size or (None, None)))
    if kind == "audio":
        seconds = audio_duration(data)
        ms = round(seconds * 1000) if seconds is not None else None
        return OutgoingFile(name, data, mimetype, msgtype, duration_ms=ms)
    return OutgoingFile(name, data, mimetype, msgtype)


def media_content(
    file: OutgoingFile,
    *,
    caption: str | None = None,
    voice: bool = False,
    url: str | None = None,
    encrypted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `m.room.message` content of an uploaded file: `url` in a plain room, or `encrypted`
    (the EncryptedFile: url, key, iv, hashes, v) in an encrypted one. With a caption, `body`
    is the caption and `filename` the name (MSC2530); without one both are the name."""
    if (url is None) == (encrypted is None):
        raise ValueError("give exactly one of url and encrypted")
    info: dict[str, Any] = {"mimetype": file.mimetype, "size": len(file.data)}
    if file.width is not None and file.height is not None:
        info["w"], info["h"] = file.width, file.height
    if file.duration_ms is not None:
        info["duration"] = file.duration_ms
    content: dict[str, Any] = {
        "msgtype": file.msgtype,
        "body": caption or file.name,
        "filename": file.name,
        "info": info,
    }
    if encrypted is not None:
        content["file"] = encrypted
    else:
        content["url"] = url
    if voice:
        content[VOICE_KEY] = {}
        content[AUDIO_KEY] = {} if file.duration_ms is None else {"duration": file.duration_ms}
    return content


def describe_media(content: dict[str, Any]) -> str | None:
    """How a file the bot sent is shown in the terminal, e.g. "[image: chart.png, 640x480,
    12 KB]"; None for a message that is not a file."""
    msgtype = content.get("msgtype")
    if msgtype not in ("m.image", "m.file", "m.audio", "m.video"):
        return None
    name = content.get("filename") or content.get("body") or "file"
    info = content.get("info")
    if not isinstance(info, dict):
        info = {}
    parts = [clean_name(str(name))]
    w, h = info.get("w"), info.get("h")
    if isinstance(w, int) and isinstance(h, int):
        parts.append(f"{w}x{h}")
    duration = info.get("duration")
    if isinstance(duration, int) and duration >= 0:
        parts.append(f"{duration / 1000:.1f} s")
    size = info.get("size")
    if isinstance(size, int) and size >= 0:
        parts.append(human_size(size))
    text = f"[{str(msgtype).removeprefix('m.')}: {', '.join(parts)}]"
    caption = content.get("body")
    if content.get("filename") and isinstance(caption, str) and caption != content.get("filename"):
        text += f" {caption}"
    return text


def saved_path(directory: Path, name: str) -> Path:
    """Where a file the bot sent is saved: its clean name in `directory`, numbered if taken."""
    name = clean_name(name)
    stem, dot, ext = name.rpartition(".")
    if not dot:
        stem, ext = name, ""
    candidate, n = directory / name, 1
    while candidate.exists():
        n += 1
        candidate = directory / (f"{stem}-{n}.{ext}" if ext else f"{stem}-{n}")
    return candidate


def human_size(n: int) -> str:
    """1536 -> "1.5 KB" (binary units, as the bot and Matrix clients show sizes)."""
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF, JPEG or WebP header; None when it does not say."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return int(w), int(h)
    if data.startswith((b"GIF87a", b"GIF89a")) and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return int(w), int(h)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The size in the first start-of-frame segment."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD9:  # fill byte / no length
            pos += 1 if marker == 0xFF else 2
            continue
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if marker in _JPEG_SOF and pos + 9 <= len(data):
            h, w = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return int(w), int(h)
        pos += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return int(w) & 0x3FFF, int(h) & 0x3FFF
    return None
