"""Files people send with a message (`m.file`, `m.image`, `m.audio`): the wire form the bot
sends to the graph, and what a file really is (`sniff_mime`: from its bytes, never from the
event, whose `mimetype` anyone can set).

Both services decide with the same rules: the bot refuses what the graph would refuse
before it downloads the rest, and the graph never trusts the bot's word for a type either.
"""

from __future__ import annotations

import base64
import binascii
import re
import zipfile
from io import BytesIO
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
)

#: What the agent does with a file: reads its text, looks at it, or (audio) hears it.
Kind = Literal["document", "image", "audio", "video", "unknown"]

#: Document types the graph reads (text extracted), by sniffed MIME type.
DOCUMENT_TYPES = frozenset(
    {
        "application/pdf",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "text/plain",
        "text/markdown",
        "text/html",
        "text/csv",
    }
)
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
AUDIO_TYPES = frozenset({"audio/ogg", "audio/wav", "audio/mpeg", "audio/mp4", "audio/webm", "audio/flac"})
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
#: Text types told apart by the file name's extension once the bytes are known to be text.
_TEXT_BY_EXTENSION = {
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".csv": "text/csv",
}
#: Longest file name kept (Matrix allows anything; the model and the reply need no more).
MAX_NAME_CHARS = 200


_SPACE = re.compile(rb"\s+")


def _from_base64(value: object) -> bytes:
    """Strict base64 (standard alphabet, padding; line breaks allowed): anything else is a
    422, not a file that silently decodes to less. What the bot sends (no line breaks) is
    decoded in one pass straight from the JSON string: a 20 MB file is ~60 ms of the
    graph's event loop, where stripping white space first cost ~220 ms more
    (bench/README.md, bench-attachments)."""
    if not isinstance(value, str | bytes | bytearray):
        raise ValueError("must be a base64 string")
    try:
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        pass
    raw = value.encode("ascii", errors="replace") if isinstance(value, str) else bytes(value)
    try:
        return binascii.a2b_base64(_SPACE.sub(b"", raw), strict_mode=True)
    except binascii.Error:
        raise ValueError("is not valid base64") from None


#: Bytes that travel as one base64 string (no line breaks) in the JSON.
Base64Data = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]


class Attachment(BaseModel):
    """One file as the bot forwards it with `POST /api/v1/process_message` (docs/api.md):
    the decrypted bytes, base64 in the JSON. `name` is what the user sees and what the
    answer cites; `declared_type` is only what the sender's client claimed."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    data: Base64Data
    declared_type: str | None = Field(default=None, max_length=200)
    #: The Matrix event that carried the file (the question's own, or the one replied to).
    event_id: str | None = Field(default=None, max_length=255)

    @field_validator("name")
    @classmethod
    def _clean_name(cls, v: str) -> str:
        return clean_name(v)


def clean_name(name: str) -> str:
    """A file name safe to show and to put in a prompt: the last path part, no control
    characters, at most MAX_NAME_CHARS; "file" when nothing is left."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(c if c.isprintable() else " " for c in base).strip()
    if len(base) > MAX_NAME_CHARS:
        _, dot, ext = base.rpartition(".")
        keep = ext if dot and len(ext) <= 10 else ""
        base = base[: MAX_NAME_CHARS - len(keep) - 2] + "…" + ("." + keep if keep else "")
    return base or "file"


def kind_of(mime: str | None) -> Kind:
    if mime in DOCUMENT_TYPES:
        return "document"
    if mime in IMAGE_TYPES:
        return "image"
    if mime in AUDIO_TYPES:
        return "audio"
    if mime is not None and mime.startswith("video/"):
        return "video"
    return "unknown"


def sniff_mime(data: bytes, name: str = "") -> str | None:
    """The file's type from its first bytes (and, for text, the name's extension to tell
    Markdown, HTML and CSV apart); None when it is nothing the agent knows."""
    head = data[:64]
    if head.startswith(b"%PDF-"):
        return "application/pdf"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "audio/wav"
    if head.startswith(b"OggS"):
        return "audio/ogg"
    if head.startswith(b"fLaC"):
        return "audio/flac"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "audio/mpeg"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        return "audio/mp4" if brand in (b"M4A ", b"M4B ") else "video/mp4"
    if head.startswith(b"\x1aE\xdf\xa3"):
        return "audio/webm" if b"webm" in data[:4096] and b"V_" not in data[:4096] else "video/webm"
    if head.startswith(b"PK\x03\x04"):
        return DOCX if _is_docx(data) else None
    return _sniff_text(data, name)


def _is_docx(data: bytes) -> bool:
    """A zip whose directory names word/document.xml (only the directory is read)."""
    try:
        with zipfile.ZipFile(BytesIO(data)) as zf:
            return "word/document.xml" in zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def _sniff_text(data: bytes, name: str) -> str | None:
    """Text: no NUL bytes and valid UTF-8 (or UTF-16 with a BOM) in the first 64 KiB."""
    sample = data[:65536]
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")):
        return _text_type(name, sample.decode("utf-16", errors="ignore"))
    if b"\x00" in sample:
        return None
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(sample) - 4:  # not just a character cut at the 64 KiB mark
            return None
        text = sample[: exc.start].decode("utf-8")
    return _text_type(name, text)


def _text_type(name: str, text: str) -> str:
    lower = name.lower()
    for ext, mime in _TEXT_BY_EXTENSION.items():
        if lower.endswith(ext):
            return mime
    start = text.lstrip()[:100].lower()
    if start.startswith(("<!doctype html", "<html")):
        return "text/html"
    return "text/plain"
