"""The process that reads one attached file: `python -m vagent_graph.attachments.worker
MEMORY_MB CPU_SECONDS`, started by reading.py for every file.

Why a process: parsers are large C and Python code fed with bytes anyone can send. Here a
zip bomb hits RLIMIT_AS and ends as a MemoryError (or a dead process), an endless PDF hits
RLIMIT_CPU or the parent's timeout, a parser crash kills this process only; the graph's
event loop only ever waits on a pipe. A parser bug that runs code meets sandbox.py's walls,
put up before anything is read: no network, no processes, no way into the graph.

Protocol: stdin is one JSON line ({"mime", "max_side", "max_chars"}) and then the file's bytes; stdout is
one JSON object: {"ok": true, ...what was read} or {"ok": false, "reason": ...}, with
"peak_rss" (bytes) and "sandbox" (which walls held, sandbox.confine) either way. A reason
is a short phrase the user reads. Anything else on
stdout or stderr (a library printing) goes to stderr, which the parent logs, never shows.

Why so few imports here: the parsers are imported only for the file's type (parsing.py
imports its libraries where they are used too). Measured on the development machine
(Python 3.11, 2 cores; median of 20 runs on a tiny file, from spawn to the JSON answer;
a bare `python -c pass` takes 10 ms): 52 ms for text or CSV, 68 ms for Markdown, 90 ms
for HTML, 52 ms for a small PNG (Pillow; decoding a 12-megapixel photo adds ~200 ms),
105 ms for a Word document (python-docx, lxml), 123 ms for a PDF (pypdf). Importing
everything up front would take 300 ms for every file.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import resource
import sys
from typing import TYPE_CHECKING, Any

from vagent_graph.attachments.sandbox import confine

if TYPE_CHECKING:
    from collections.abc import Sequence

    from PIL.Image import Image as PILImage

    from vagent_graph.knowledge.parsing import ParsedDocument
    from vagent_shared.knowledge import DocumentFormat

#: Images larger than this many pixels are refused before they are decoded (64 MP: a
#: 48-megapixel phone photo passes; decoded as RGBA it takes 256 MB).
MAX_PIXELS = 64_000_000
#: Word (python-docx) and PDF (pypdf) are parsed with knowledge/parsing.py, like ingestion;
#: CSV is read as text.
_FORMATS: dict[str, DocumentFormat] = {
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "text/plain": "text",
    "text/csv": "text",
    "text/markdown": "markdown",
    "text/html": "html",
}
_PIL_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}
#: The name parse_document gets (messages start with it; the user's file name never comes here).
_LABEL = "attachment"
TOO_MUCH_MEMORY = "reading it needed too much memory"
DAMAGED_IMAGE = "the image is damaged or not really an image"
#: How a PDF's pages are marked in the text the model reads (content.py finds them again).
PAGE_LINE = "[page {n}]"


class Refusal(Exception):
    """A file this process will not or cannot read; the reason is shown to the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def main() -> int:
    memory_mb, cpu_seconds = int(sys.argv[1]), int(sys.argv[2])
    walls = confine(memory_mb, cpu_seconds)  # before a byte of the request or the file is read
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever a library prints lands in stderr, never in the answer
    request = json.loads(sys.stdin.buffer.readline())
    data = sys.stdin.buffer.read()
    try:
        result = _read(str(request["mime"]), int(request["max_side"]), int(request["max_chars"]), data)
    except Refusal as refusal:
        result = {"ok": False, "reason": refusal.reason}
    except MemoryError:
        result = {"ok": False, "reason": TOO_MUCH_MEMORY}
    del data
    result["peak_rss"] = _peak_rss()
    result["sandbox"] = walls
    json.dump(result, answer, ensure_ascii=False)
    answer.flush()
    return 0


def _peak_rss() -> int:
    """This process's own peak RSS in bytes: VmHWM belongs to the memory map exec created.
    (ru_maxrss is no good: Linux carries the parent's peak over a vfork+exec.)"""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _read(mime: str, max_side: int, max_chars: int, data: bytes) -> dict[str, Any]:
    if mime in _FORMATS:
        return _document(mime, data, max_chars)
    if mime in _PIL_FORMATS:
        return _image(mime, max_side, data)
    raise Refusal("this kind of file is not supported")


# --- documents --------------------------------------------------------------------------------


def _document(mime: str, data: bytes, max_chars: int) -> dict[str, Any]:
    """The text, at most `max_chars` + 1 characters of it (what the model can be shown at
    most, and one more so a cut is still seen as one): a PDF's pages are extracted only
    that far, other text is cut after parsing."""
    from vagent_graph.knowledge.parsing import DocumentError, parse_document, quiet_parsers

    quiet_parsers()
    try:
        doc = parse_document(data, _FORMATS[mime], _LABEL, max_chars=max_chars)
    except DocumentError as exc:
        if _caused_by_memory(exc):
            raise MemoryError from exc
        raise Refusal(str(exc).removeprefix(f"{_LABEL}: ")) from exc
    return document_answer(doc, max_chars)


def document_answer(doc: ParsedDocument, max_chars: int) -> dict[str, Any]:
    """The answer for a parsed document, its text cut to `max_chars` + 1 characters on every
    path: a PDF read to its end or stopped early (the page that reached the budget may hold
    millions of characters by itself), a page or the whole. `chars` is the whole text's
    length when known, `pages_read` how many of a PDF's pages were read."""
    pdf = doc.format == "pdf"
    parts: list[str] = []
    previous: tuple[str, ...] = ()
    for number, section in enumerate(doc.sections, start=1):
        if pdf:
            parts.append(PAGE_LINE.format(n=number))
        elif section.headings and section.headings != previous:
            parts.append("#" * len(section.headings) + " " + section.headings[-1])
        previous = section.headings
        if section.text:
            parts.append(section.text)
    text, whole = joined_within(parts, max_chars + 1)
    read = len(doc.sections)
    if pdf and doc.total_pages is not None:  # stopped early: the whole length is unknown
        return {"ok": True, "text": text, "pages": doc.total_pages, "pages_read": read, "chars": None}
    return {
        "ok": True,
        "text": text,
        "pages": read if pdf else None,
        "pages_read": read if pdf else None,
        "chars": whole,
    }


def joined_within(parts: Sequence[str], limit: int) -> tuple[str, int]:
    """`"\n\n".join(parts)` cut to `limit` characters, without building the whole (a part
    may be huge); and the whole's length."""
    kept: list[str] = []
    size = whole = 0
    for n, part in enumerate(parts):
        sep = "\n\n" if n else ""
        whole += len(sep) + len(part)
        room = limit - size
        if room > 0:
            kept += [sep[:room], part[: max(0, room - len(sep))]]
            size += min(room, len(sep) + len(part))
    return "".join(kept), whole


def _caused_by_memory(exc: BaseException) -> bool:
    """parsing.py turns every parser exception into a DocumentError, MemoryError too."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, MemoryError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# --- images -----------------------------------------------------------------------------------


def _image(mime: str, max_side: int, data: bytes) -> dict[str, Any]:
    from PIL import Image

    formats = [_PIL_FORMATS[mime]]  # only the decoder of the type the bytes say
    try:
        Image.MAX_IMAGE_PIXELS = None  # checked below with the size in the message...
        with Image.open(io.BytesIO(data), formats=formats) as probe:  # reads the header only
            width, height = probe.size
            if width * height > MAX_PIXELS:
                raise Refusal(
                    f"the image is too large ({width}×{height} pixels, at most "
                    f"{MAX_PIXELS // 1_000_000} megapixels): send a smaller one"
                )
            probe.verify()
        Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # ...and Pillow's own guard stays for the rest
        return _scaled(Image.open(io.BytesIO(data), formats=formats), mime, max_side)
    except (Refusal, MemoryError):
        raise
    except Exception as exc:  # Pillow raises OSError, ValueError, SyntaxError... on damage
        raise Refusal(DAMAGED_IMAGE) from exc


def _scaled(image: PILImage, mime: str, max_side: int) -> dict[str, Any]:
    """At most max_side on the longer side, upright, without metadata; the size reported
    is the original's as the user sees it (a quarter turn in EXIF swaps it)."""
    from PIL import Image, ImageOps

    width, height = image.size
    if image.getexif().get(0x0112) in (5, 6, 7, 8):
        width, height = height, width
    if mime == "image/jpeg":
        # Decode at 1/2, 1/4 or 1/8 size when the result still covers the thumbnail: the box
        # must be the thumbnail's own (a square box keeps a 4:3 photo at full size, 32 MB of
        # RGB for 12 megapixels; bench/README.md, bench-attachments).
        scale = max_side / max(image.size)
        if scale < 1:
            image.draft("RGB", (max(1, int(image.size[0] * scale)), max(1, int(image.size[1] * scale))))
    image.load()
    ImageOps.exif_transpose(image, in_place=True)
    keep_png = mime == "image/png"
    image = _convert(image, png=keep_png)
    image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    image.info.clear()  # no EXIF (location), ICC profile or text chunks in the copy
    out = io.BytesIO()
    if keep_png:
        image.save(out, "PNG")
    else:
        image.save(out, "JPEG", quality=85)
    return {
        "ok": True,
        "image": base64.b64encode(out.getvalue()).decode("ascii"),
        "image_mime": "image/png" if keep_png else "image/jpeg",
        "width": width,
        "height": height,
    }


_SIXTEEN_BIT = re.compile(r"I(;16.*)?$")


def _convert(image: PILImage, *, png: bool) -> PILImage:
    """Modes the output format and the model take: PNG keeps transparency; JPEG gets
    transparent parts on white; palettes, CMYK and 16-bit grey become RGB or 8-bit grey."""
    from PIL import Image

    mode = image.mode
    if _SIXTEEN_BIT.match(mode) or mode == "F":
        image = image.convert("I").point(lambda v: v * (1 / 256)).convert("L")
        mode = "L"
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in image.info)
    if png:
        if mode in ("1", "L", "RGB", "RGBA", "LA"):
            return image
        return image.convert("RGBA" if has_alpha else "RGB")
    if has_alpha:
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image if mode in ("L", "RGB") else image.convert("RGB")


if __name__ == "__main__":
    sys.exit(main())
