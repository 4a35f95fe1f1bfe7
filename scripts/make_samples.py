#!/usr/bin/env python3
"""Write the demo files of deploy/dev/samples/, which `make chat` sends with `/file` and
`/voice`: report.pdf (a short quarterly report), notes.docx (meeting notes with action
items), screenshot.png (an error dialog) and voice.wav (a 1.5-second tone whose RIFF comment,
"What is on my calendar today?", is what the speech-to-text stand-in `vagent-stt` answers).

Why a script: the files are committed, and each must be small, real (the graph reads them
with its PDF and Word parsers) and reproducible. The PDF, DOCX and WAV are written by hand
(stdlib only, no timestamps: the same bytes every run); the PNG is drawn with Pillow when it
is installed (text needs a font), plain shapes otherwise.

    .venv/bin/python scripts/make_samples.py [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import io
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from xml.sax.saxutils import escape

from vagent_dev.audio_files import make_wav

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "deploy" / "dev" / "samples"
#: Every sample stays below this (they are committed, and sent in demos).
MAX_SAMPLE_BYTES = 50 * 1024
VOICE_QUESTION = "What is on my calendar today?"

REPORT_TITLE = "Quarterly report Q4 2026 - Northwind Demo Ltd (draft)"
REPORT_LINES = [
    "Revenue: 5.1 M EUR (up 9% on Q3).",
    "Operating costs: 3.6 M EUR, of which cloud hosting 0.4 M EUR.",
    "Net margin: 29%. Headcount at quarter end: 52.",
    "Highlights: Project Aurora shipped its first release; two new enterprise customers.",
    "Risks: a supplier delay may push the hardware refresh into Q1 2027.",
    "Outlook: Q1 2027 revenue expected between 5.0 and 5.4 M EUR.",
]
NOTES_TITLE = "Project Aurora - kickoff meeting notes"
NOTES = [
    ("p", "Date: 2026-11-20. Attendees: Alice, Bob, Carol."),
    ("h", "Decisions"),
    ("p", "The public API is REST with JSON; the first release is due on 2027-01-15."),
    ("p", "Design reviews happen every second Tuesday."),
    ("h", "Action items"),
    ("p", "Bob: draft the API specification by 2026-12-04."),
    ("p", "Alice: book the first design review with Bob."),
    ("p", "Carol: update the onboarding guide for new team members."),
]


# --------------------------------------------------------------------------- PDF


def _pdf_text(text: str) -> str:
    """A PDF literal string (Helvetica, WinAnsi: Latin-1 is enough for these lines)."""
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def make_pdf(title: str, lines: list[str]) -> bytes:
    """One A4 page: a bold title and the lines below it, text a PDF parser extracts as written."""
    ops = ["BT", "/F2 16 Tf", "72 770 Td", f"{_pdf_text(title)} Tj", "/F1 11 Tf", "16 TL", "0 -12 Td"]
    for line in lines:
        ops += ["T*", f"{_pdf_text(line)} Tj"]
    ops.append("ET")
    stream = zlib.compress("\n".join(ops).encode("latin-1"), 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R /F2 6 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica-Bold /Encoding /WinAnsiEncoding >>",
        b"<< /Title " + _pdf_text(title).encode("latin-1") + b" /Producer (vagent make_samples) >>",
    ]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\n" % (len(objects) + 1, len(objects))
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


# --------------------------------------------------------------------------- DOCX

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_XML = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
_DOCX_PARTS = {
    "[Content_Types].xml": _XML
    + '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/word/document.xml" ContentType="application/'
    'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
    '<Override PartName="/word/styles.xml" ContentType="application/'
    'vnd.openxmlformats-officedocument.wordprocessingml.styles+xml"/>'
    '<Override PartName="/docProps/core.xml" '
    'ContentType="application/vnd.openxmlformats-package.core-properties+xml"/>'
    "</Types>",
    "_rels/.rels": _XML
    + '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
    'relationships/officeDocument" Target="word/document.xml"/>'
    '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/package/2006/relationships/'
    'metadata/core-properties" Target="docProps/core.xml"/>'
    "</Relationships>",
    "word/_rels/document.xml.rels": _XML
    + '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
    'relationships/styles" Target="styles.xml"/>'
    "</Relationships>",
    "word/styles.xml": _XML + f'<w:styles xmlns:w="{_W}">'
    '<w:style w:type="paragraph" w:default="1" w:styleId="Normal"><w:name w:val="Normal"/></w:style>'
    '<w:style w:type="paragraph" w:styleId="Title"><w:name w:val="Title"/><w:basedOn w:val="Normal"/>'
    '<w:rPr><w:b/><w:sz w:val="36"/></w:rPr></w:style>'
    '<w:style w:type="paragraph" w:styleId="Heading1"><w:name w:val="heading 1"/>'
    '<w:basedOn w:val="Normal"/><w:pPr><w:outlineLvl w:val="0"/></w:pPr>'
    '<w:rPr><w:b/><w:sz w:val="28"/></w:rPr></w:style>'
    "</w:styles>",
}


def make_docx(title: str, paragraphs: list[tuple[str, str]]) -> bytes:
    """A minimal valid Word document: a Title, then Heading 1 ("h") and body ("p") paragraphs."""
    styles = {"t": "Title", "h": "Heading1"}
    body = ""
    for kind, text in [("t", title), *paragraphs]:
        style = f'<w:pPr><w:pStyle w:val="{styles[kind]}"/></w:pPr>' if kind in styles else ""
        body += f'<w:p>{style}<w:r><w:t xml:space="preserve">{escape(text)}</w:t></w:r></w:p>'
    parts = {
        **_DOCX_PARTS,
        "word/document.xml": _XML + f'<w:document xmlns:w="{_W}"><w:body>{body}</w:body></w:document>',
        "docProps/core.xml": _XML
        + '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/'
        'core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/">'
        f"<dc:title>{escape(title)}</dc:title><dc:creator>vagent make_samples</dc:creator>"
        "</cp:coreProperties>",
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in parts.items():  # fixed dates: the same bytes every run
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text.encode())
    return buffer.getvalue()


# --------------------------------------------------------------------------- PNG


def _png(width: int, height: int, pixel: Callable[[int, int], tuple[int, int, int]]) -> bytes:
    """An 8-bit RGB PNG, one filter byte per row."""
    rows = b"".join(b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


SCREEN = (480, 270)
DIALOG_TEXT = [
    "Payment service unavailable",
    "Error 503 while saving invoice INV-2026-0412.",
    "The request timed out after 30 s. Try again later.",
]


def make_screenshot() -> bytes:
    """A small application window with an error dialog (text when Pillow is installed)."""
    width, height = SCREEN
    dialog = (90, 70, 390, 200)
    try:
        from PIL import Image, ImageDraw
    except ImportError:

        def pixel(x: int, y: int) -> tuple[int, int, int]:
            if y < 24:
                return (40, 44, 52)  # title bar
            if dialog[0] <= x < dialog[2] and dialog[1] <= y < dialog[3]:
                return (200, 40, 40) if y < dialog[1] + 22 else (250, 250, 250)
            return (225, 228, 232)

        return _png(width, height, pixel)
    image = Image.new("RGB", SCREEN, (225, 228, 232))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, width, 23), fill=(40, 44, 52))
    draw.text((8, 6), "Northwind Billing - Invoices", fill=(235, 235, 235))
    draw.rectangle(dialog, fill=(250, 250, 250), outline=(120, 120, 120))
    draw.rectangle((dialog[0], dialog[1], dialog[2], dialog[1] + 22), fill=(200, 40, 40))
    draw.text((dialog[0] + 8, dialog[1] + 6), DIALOG_TEXT[0], fill=(255, 255, 255))
    for i, line in enumerate(DIALOG_TEXT[1:]):
        draw.text((dialog[0] + 10, dialog[1] + 38 + 18 * i), line, fill=(30, 30, 30))
    draw.rectangle((dialog[2] - 70, dialog[3] - 34, dialog[2] - 12, dialog[3] - 10), outline=(90, 90, 90))
    draw.text((dialog[2] - 52, dialog[3] - 28), "OK", fill=(30, 30, 30))
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


# --------------------------------------------------------------------------- main


def samples() -> dict[str, bytes]:
    """File name -> bytes of every sample."""
    return {
        "report.pdf": make_pdf(REPORT_TITLE, REPORT_LINES),
        "notes.docx": make_docx(NOTES_TITLE, NOTES),
        "screenshot.png": make_screenshot(),
        "voice.wav": make_wav(1.5, rate=8000, frequency=440.0, comment=VOICE_QUESTION),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write the demo files of deploy/dev/samples/.")
    p.add_argument("--out", type=Path, default=SAMPLES, help="where to write them")
    p.add_argument("--check", action="store_true", help="only say whether the files are up to date")
    args = p.parse_args(argv)
    stale = []
    for name, data in samples().items():
        if len(data) > MAX_SAMPLE_BYTES:
            print(f"make_samples: {name} is {len(data)} bytes (limit {MAX_SAMPLE_BYTES})", file=sys.stderr)
            return 1
        path = args.out / name
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(name)
        if not args.check:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            print(f"wrote {path} ({len(data)} bytes)")
    if args.check and stale:
        print(f"make_samples: out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
