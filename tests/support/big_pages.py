"""PDFs whose pages hold as much text as a test asks, in a few kilobytes: each page is one
deflated content stream (a million equal characters pack into about a kilobyte), so a file
far under ATTACHMENT_MAX_BYTES can put millions of characters on one page."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from tests.support.files import pdf_file


def pdf_of_pages(texts: Sequence[str]) -> bytes:
    """One page per text, its text on one line (Helvetica; Latin-1 letters and digits only:
    no escaping is done)."""
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"",  # the page tree, once the pages' numbers are known
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    kids: list[bytes] = []
    for text in texts:
        page = len(objects) + 1
        stream = zlib.compress(b"BT /F1 11 Tf 56 790 Td (" + text.encode("latin-1") + b") Tj ET", 9)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents %d 0 R "
            b"/Resources << /Font << /F1 3 0 R >> >> >>" % (page + 1)
        )
        objects.append(
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream"
        )
        kids.append(b"%d 0 R" % page)
    objects[1] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % len(texts)
    return pdf_file(objects)
