"""Which images a tool returned are shown in the room, and what the model reads about them.

An image goes to the room only if its bytes are an image type the bot posts (sniffed, never
the type a tool or an MCP server claims) and it is at most TOOL_IMAGE_MAX_BYTES; the model
reads one line per image: shown, or not shown and why. The pixel size is read from the
header only (Pillow does not decode the image for it), so a hostile image costs nothing
here; the bot re-checks the type before it uploads.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO

from vagent_graph.tools.base import ToolImage
from vagent_shared.attachments import IMAGE_TYPES, clean_name, sniff_mime
from vagent_shared.events import ImageOut

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}


@dataclass(frozen=True)
class Shown:
    """The images for the room, and the text that tells the model about every image."""

    images: tuple[ImageOut, ...]
    note: str


def shown_images(images: Sequence[ToolImage], tool: str, max_bytes: int) -> Shown:
    out: list[ImageOut] = []
    notes: list[str] = []
    for n, image in enumerate(images, 1):
        mime = sniff_mime(image.data)
        name = _name(image.name, mime, tool, n)
        if mime not in IMAGE_TYPES:
            notes.append(
                f"[{tool} returned an image ({name}) that is not a PNG, JPEG, GIF or WebP: not shown]"
            )
        elif len(image.data) > max_bytes:
            notes.append(f"[{tool} returned an image ({name}, {len(image.data)} bytes) too large to show]")
        elif (size := _size(image.data)) is None:
            notes.append(
                f"[{tool} returned an image ({name}) that cannot be read or has too many pixels: not shown]"
            )
        else:
            assert mime is not None
            width, height = size
            out.append(
                ImageOut(
                    name=name,
                    mimetype=mime,
                    data=base64.b64encode(image.data).decode("ascii"),
                    width=width,
                    height=height,
                )
            )
            notes.append(
                f"[{tool} returned an image ({name}); it is shown to the user in the room after your answer]"
            )
    return Shown(tuple(out), "\n".join(notes))


def _name(name: str, mime: str | None, tool: str, n: int) -> str:
    """A file name with an extension matching the bytes: "image" from a tool says little."""
    base = clean_name(name)
    ext = _EXTENSIONS.get(mime or "")
    if base in ("image", "file"):
        base = f"{tool}-{n}"
    if ext and not base.lower().endswith("." + ext):
        base = f"{base}.{ext}"
    return base


#: Larger images are not posted: a client decoding one could run out of memory.
MAX_PIXELS = 50_000_000


def _size(data: bytes) -> tuple[int, int] | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(BytesIO(data)) as img:  # reads the header; decodes nothing
            width, height = img.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None
    return (width, height) if 0 < width * height <= MAX_PIXELS else None
