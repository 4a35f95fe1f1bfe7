"""Small deterministic files for tests and benchmarks: PDFs with real text, Word documents,
images, WAV audio, and hostile ones (a corrupt PDF, a zip bomb, a decompression-bomb PNG).

Every builder returns the same bytes for the same arguments (no timestamps, no randomness
beyond a fixed seed), so a test that fails fails the same way again. The bombs are built
from repeated deflate blocks, never by compressing gigabytes: they take milliseconds.
"""

from __future__ import annotations

import functools
import io
import math
import struct
import wave
import zipfile
import zlib
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime

from PIL import Image, ImageDraw

#: ZIP entries' fixed timestamp (the earliest a zip can hold), so a rebuilt file is identical.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_LINES_PER_PAGE = 45
_FIXED_DATE = datetime(2024, 1, 1, tzinfo=UTC)


# --- PDF --------------------------------------------------------------------------------------


def pdf_with_text(lines: list[str], *, title: str | None = None) -> bytes:
    """A valid PDF whose text pypdf extracts line by line (Helvetica, 45 lines a page).
    Characters outside Latin-1 become "?" (the standard font has no others)."""
    pages = [lines[i : i + _LINES_PER_PAGE] for i in range(0, len(lines), _LINES_PER_PAGE)] or [[]]
    return _pdf([_page_stream(page) for page in pages], title)


def pdf_of_size(n_bytes: int, lines: list[str]) -> bytes:
    """A valid PDF of at least `n_bytes`: `lines` repeated on as many text pages as it takes
    (so reading it costs what a real text PDF of that size costs), each page numbered."""
    lines = lines or ["Lorem ipsum dolor sit amet."]
    per_page = [lines[i % len(lines)] for i in range(_LINES_PER_PAGE)]
    one = len(_page_stream(per_page)) + 200  # the page's objects around its content stream
    count = max(1, -(-n_bytes // one))
    streams = [_page_stream([f"Page {n}", *per_page[1:]]) for n in range(1, count + 1)]
    data = _pdf(streams, None)
    while len(data) < n_bytes:  # the estimate was short: one more page each round
        streams.append(_page_stream([f"Page {len(streams) + 1}", *per_page[1:]]))
        data = _pdf(streams, None)
    return data


def encrypted_pdf(lines: list[str], password: str = "secret") -> bytes:  # noqa: S107
    """pdf_with_text locked with a user password (RC4: no extra library needed)."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_with_text(lines))))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def corrupt_pdf() -> bytes:
    """Starts like a PDF (so every type check calls it one) and is nothing but damage after."""
    return b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R\n" + bytes(range(256)) * 4


def _page_stream(lines: Sequence[str]) -> bytes:
    ops = ["BT", "/F1 11 Tf", "14 TL", "56 790 Td"]
    for line in lines:
        ops.append(f"({_pdf_string(line)}) Tj T*")
    ops.append("ET")
    return "\n".join(ops).encode("latin-1")


def _pdf_string(text: str) -> str:
    text = text.encode("latin-1", errors="replace").decode("latin-1")
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _pdf(streams: list[bytes], title: str | None) -> bytes:
    """Objects: 1 catalog, 2 pages, 3 font, 4 info, then a page and its content per stream."""
    n = len(streams)
    kids = " ".join(f"{5 + 2 * i} 0 R" for i in range(n))
    info = f"<< /Title ({_pdf_string(title)}) >>" if title else "<< /Producer (tests) >>"
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
        info.encode("latin-1"),
    ]
    for i, stream in enumerate(streams):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents {6 + 2 * i} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    return pdf_file(objects, b"/Info 4 0 R")


def pdf_file(objects: Sequence[bytes], trailer: bytes = b"") -> bytes:
    """`objects` (numbered from 1, the catalog first) as a PDF file with its xref table;
    `trailer`: more trailer entries (`/Info 4 0 R`)."""
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    extra = trailer + b" " if trailer else b""
    out.write(b"trailer\n<< /Size %d /Root 1 0 R %s>>\n" % (len(objects) + 1, extra))
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


# --- Word -------------------------------------------------------------------------------------


def docx_with_text(paragraphs: list[str], *, table: Sequence[Sequence[str]] | None = None) -> bytes:
    """A Word document made by python-docx: one paragraph each; a paragraph written "# Title"
    or "## Sub" becomes a Heading 1 or 2 (like Markdown); `table` (rows of cells) follows."""
    from docx import Document

    document = Document()
    for text in paragraphs:
        level = len(text) - len(text.lstrip("#"))
        if 1 <= level <= 9 and text[level : level + 1] == " ":
            document.add_heading(text[level + 1 :], level=level)
        else:
            document.add_paragraph(text)
    if table:
        grid = document.add_table(rows=len(table), cols=max(len(row) for row in table))
        for r, row in enumerate(table):
            for c, cell in enumerate(row):
                grid.cell(r, c).text = cell
    props = document.core_properties
    props.created = props.modified = props.last_printed = _FIXED_DATE
    props.revision = 1
    out = io.BytesIO()
    document.save(out)
    return _rezip(out.getvalue())


def zip_bomb_docx(unpacked_gib: int = 1) -> bytes:
    """A well-formed .docx of about 1 MB a GiB (deflate's best ratio is ~1030:1) whose
    word/document.xml inflates to `unpacked_gib` GiB of spaces inside one paragraph: what
    reading it without looking at the zip directory first would have to hold in memory."""
    return _zip_bomb_docx(unpacked_gib)


@functools.cache
def _zip_bomb_docx(unpacked_gib: int) -> bytes:
    head = (
        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        b"<w:body><w:p><w:r><w:t>"
    )
    tail = b"</w:t></w:r></w:p></w:body></w:document>"
    mib = 1024 * 1024
    block = b" " * mib
    # After a full flush the compressor forgets everything: the same input then always
    # gives the same byte-aligned output, and such pieces can be concatenated.
    packed_block = _deflate_piece(block)
    count = unpacked_gib * 1024
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(tail, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = _deflate_piece(head) + packed_block * count + end.compress(tail) + end.flush()
    size = len(head) + count * mib + len(tail)
    members = [(name, _stored(body)) for name, body in _DOCX_PARTS.items()]
    members.append(("word/document.xml", (zipfile.ZIP_DEFLATED, deflated, crc, size)))
    return _zip_raw(members)


def _deflate_piece(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


_DOCX_PARTS = {
    "[Content_Types].xml": (
        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        b'<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        b'<Default Extension="xml" ContentType="application/xml"/>'
        b'<Override PartName="/word/document.xml" ContentType="application/'
        b'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
    ),
    "_rels/.rels": (
        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        b'<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        b'<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        b'relationships/officeDocument" Target="word/document.xml"/></Relationships>'
    ),
}


def _stored(body: bytes) -> tuple[int, bytes, int, int]:
    return (zipfile.ZIP_STORED, body, zlib.crc32(body), len(body))


def _zip_raw(members: list[tuple[str, tuple[int, bytes, int, int]]]) -> bytes:
    """A zip from members already compressed: (name, (method, data, crc32, unpacked size))."""
    out = io.BytesIO()
    central = io.BytesIO()
    for name, (method, data, crc, size) in members:
        offset = out.tell()
        encoded = name.encode()
        fields = struct.pack("<HHHHHIII", 20, 0, method, 0, 0x21, crc, len(data), size)
        out.write(b"PK\x03\x04" + fields + struct.pack("<HH", len(encoded), 0) + encoded + data)
        central.write(
            b"PK\x01\x02"
            + struct.pack("<H", 20)
            + fields
            + struct.pack("<HHHHHII", len(encoded), 0, 0, 0, 0, 0, offset)
            + encoded
        )
    start = out.tell()
    directory = central.getvalue()
    out.write(directory)
    out.write(
        b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, len(members), len(members), len(directory), start, 0)
    )
    return out.getvalue()


def _rezip(data: bytes) -> bytes:
    """The same zip with fixed timestamps (python-docx stamps the current time)."""
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for info in source.infolist():
            target.writestr(
                zipfile.ZipInfo(info.filename, _ZIP_TIME), source.read(info), zipfile.ZIP_DEFLATED
            )
    return out.getvalue()


def zip_of(files: dict[str, bytes]) -> bytes:
    """A plain zip archive (not a Word document unless it holds word/document.xml)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in files.items():
            archive.writestr(zipfile.ZipInfo(name, _ZIP_TIME), body, zipfile.ZIP_DEFLATED)
    return out.getvalue()


# --- images -----------------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    """An RGB PNG: a blue background with an orange rectangle and a diagonal line, so a
    scaled copy still looks like something."""
    return _save(_picture(width, height), "PNG")


def jpeg(width: int, height: int) -> bytes:
    return _save(_picture(width, height), "JPEG", quality=85)


def png_bomb(width: int = 30_000, height: int = 30_000, *, rgba: bool = False) -> bytes:
    """A valid 8-bit grayscale (or RGBA: 4 bytes a pixel once decoded) PNG of width×height
    black pixels (900 megapixels by default, 900 MB once decoded) in a few hundred KB: a
    decompression bomb."""
    channels = 4 if rgba else 1
    row = width * channels + 1  # a filter byte and the pixels: the whole image is zeros
    raw_size = row * height
    piece = _deflate_piece(bytes(1024 * 1024))
    whole, rest = divmod(raw_size, 1024 * 1024)
    end = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = piece * whole + end.compress(bytes(rest)) + end.flush()
    adler = ((raw_size % 65521) << 16) | 1  # Adler-32 of `raw_size` zero bytes
    idat = b"\x78\xda" + stream + struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", width, height, 8, 6 if rgba else 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _picture(width: int, height: int) -> Image.Image:
    image = Image.new("RGB", (width, height), (30, 90, 200))
    draw = ImageDraw.Draw(image)
    draw.rectangle((width // 4, height // 4, width * 3 // 4, height * 3 // 4), fill=(250, 140, 20))
    draw.line((0, 0, width - 1, height - 1), fill=(255, 255, 255), width=max(1, min(width, height) // 50))
    return image


def _save(image: Image.Image, fmt: str, **options: int) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


# --- audio ------------------------------------------------------------------------------------


def wav(seconds: float, comment: str | None = None) -> bytes:
    """16 kHz mono 16-bit PCM: a quiet 440 Hz tone. With `comment`, a RIFF LIST/INFO chunk
    carries it as ICMT (a speech-to-text stand-in can answer with it as the transcript)."""
    rate = 16_000
    frames = int(seconds * rate)
    step = 2 * math.pi * 440 / rate
    samples = array("h", (int(3000 * math.sin(step * i)) for i in range(frames)))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    data = out.getvalue()
    if comment is None:
        return data
    text = comment.encode() + b"\x00"
    if len(text) % 2:
        text += b"\x00"  # RIFF chunks are padded to an even size
    icmt = b"ICMT" + struct.pack("<I", len(text)) + text
    info = b"LIST" + struct.pack("<I", 4 + len(icmt)) + b"INFO" + icmt
    data += info
    return data[:4] + struct.pack("<I", len(data) - 8) + data[8:]
