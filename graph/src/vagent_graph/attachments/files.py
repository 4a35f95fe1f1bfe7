"""A file as it was read (reading.py makes it, content.py shows it to the model): the one
type both sides share, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

#: Characters a token, the estimate observability/tokens.py uses for the whole conversation.
CHARS_PER_TOKEN: Final = 4


@dataclass(frozen=True)
class ReadFile:
    """A file as the model gets it. `mime` is the type its bytes have (never the sender's word)."""

    name: str
    mime: str
    kind: Literal["document", "image"]
    size: int  # the original file's bytes
    text: str = ""  # a document's text, as much as the model may be shown (content.py cuts it)
    pages: int | None = None  # a PDF's pages
    #: A PDF's pages read: fewer than `pages` when the text budget was reached first.
    pages_read: int | None = None
    #: The whole text's length, when known (a PDF read only in part: None).
    chars: int | None = None
    image: bytes = b""  # an image scaled down: longer side <= image_max_side; PNG stays PNG, else JPEG
    image_mime: str = ""
    width: int = 0  # the original image's size, as the user sees it
    height: int = 0
    #: Peak resident memory of the process that read it (bytes; benchmarks and logs).
    worker_peak_rss: int = 0
