"""Reading attached files with real worker processes (attachments/reading.py, worker.py):
what a user's file gives the model, the one clear reason for every file that cannot be
used, and that no file (bombs, endless or damaged ones) can hurt or block the graph."""

from __future__ import annotations

import asyncio
import io
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from tests.support.big_pages import pdf_of_pages
from tests.support.files import (
    corrupt_pdf,
    docx_with_text,
    encrypted_pdf,
    jpeg,
    pdf_of_size,
    pdf_with_text,
    png,
    png_bomb,
    wav,
    zip_bomb_docx,
    zip_of,
)
from vagent_graph.attachments import ReadFile, ReadLimits, Refused, read_attachment, turn_content
from vagent_shared.settings import GraphSettings

LIMITS = ReadLimits(max_bytes=2 * 1024 * 1024, timeout=30, memory_mb=1024, image_max_side=1568)
REPORT = ["Quarterly report Q3", "Revenue grew 12% to 4.2 million.", "Churn (net) fell to 3%."]
ELF = b"\x7fELF\x02\x01\x01" + bytes(200)


async def refusal(name: str, data: bytes, limits: ReadLimits = LIMITS) -> str:
    """The reason the user reads; it names nothing of the worker's insides."""
    with pytest.raises(Refused) as error:
        await read_attachment(name, data, limits)
    assert error.value.name == name
    assert str(error.value) == f"{name}: {error.value.reason}"
    assert "Traceback" not in error.value.reason and "Error" not in error.value.reason
    return error.value.reason


def opened(read: ReadFile) -> Image.Image:
    return Image.open(io.BytesIO(read.image))


# --- documents --------------------------------------------------------------------------------


async def test_a_pdf_gives_its_text_and_pages() -> None:
    read = await read_attachment("report.pdf", pdf_with_text(REPORT * 20), LIMITS)
    assert (read.name, read.mime, read.kind, read.pages) == ("report.pdf", "application/pdf", "document", 2)
    assert read.text.startswith("[page 1]\n\nQuarterly report Q3\nRevenue grew 12% to 4.2 million.\n")
    assert "[page 2]" in read.text and "Churn (net) fell to 3%." in read.text
    assert 10_000_000 < read.worker_peak_rss < 500_000_000  # the worker's own memory, not the graph's


async def test_a_word_document_gives_headings_paragraphs_and_tables() -> None:
    data = docx_with_text(
        ["# Minutes", "Ship on Friday.", "## Budget"], table=[["Item", "EUR"], ["Cloud", "120"]]
    )
    read = await read_attachment("notes.docx", data, LIMITS)
    assert read.kind == "document" and read.pages is None and read.size == len(data)
    assert read.text == "# Minutes\n\nShip on Friday.\n\n## Budget\n\nItem | EUR\nCloud | 120"


@pytest.mark.parametrize(
    ("name", "data", "mime", "text"),
    [
        ("todo.txt", b"buy milk\r\nsend invoice\n", "text/plain", "buy milk\nsend invoice"),
        ("prices.csv", b"plan,price\nbasic,10\n", "text/csv", "plan,price\nbasic,10"),
        (
            "page.html",
            b"<title>T</title><h1>Plans</h1><p>Basic is 10 EUR.</p>",
            "text/html",
            "# Plans\n\nBasic is 10 EUR.",
        ),
        ("README.md", b"# Setup\n\nRun `make`.\n", "text/markdown", "# Setup\n\nRun `make`."),
    ],
)
async def test_text_files_give_their_text(name: str, data: bytes, mime: str, text: str) -> None:
    read = await read_attachment(name, data, LIMITS)
    assert (read.mime, read.text) == (mime, text)


# --- images -----------------------------------------------------------------------------------


async def test_a_large_png_is_scaled_down_as_png_and_its_original_size_reported() -> None:
    read = await read_attachment("screenshot.png", png(3000, 1000), LIMITS)
    assert (read.kind, read.mime, read.image_mime) == ("image", "image/png", "image/png")
    assert (read.width, read.height) == (3000, 1000)
    assert opened(read).format == "PNG" and opened(read).size == (1568, 523)


async def test_a_small_jpeg_keeps_its_size_and_stays_a_jpeg() -> None:
    read = await read_attachment("photo.jpg", jpeg(640, 480), LIMITS)
    assert read.image_mime == "image/jpeg" and opened(read).size == (640, 480)


async def test_photos_lose_their_metadata_and_are_turned_upright() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: the camera was held on its side
    exif[0x010F] = "SecretCam"  # the camera maker (GPS would be here too)
    out = io.BytesIO()
    Image.open(io.BytesIO(jpeg(400, 300))).save(out, "JPEG", exif=exif.tobytes())
    read = await read_attachment("IMG_0001.JPG", out.getvalue(), LIMITS)
    assert (read.width, read.height) == (300, 400)  # as the user sees it
    image = opened(read)
    assert image.size == (300, 400)
    assert b"SecretCam" not in read.image and not image.getexif()


async def test_transparent_images_become_jpeg_on_white_unless_png() -> None:
    clear = Image.new("RGBA", (50, 40), (0, 0, 0, 0))
    out = io.BytesIO()
    clear.save(out, "WEBP", lossless=True)
    read = await read_attachment("sticker.webp", out.getvalue(), LIMITS)
    assert read.image_mime == "image/jpeg"
    assert opened(read).convert("RGB").getpixel((25, 20)) == (255, 255, 255)
    out = io.BytesIO()
    clear.save(out, "PNG")
    read = await read_attachment("clear.png", out.getvalue(), LIMITS)
    assert opened(read).mode == "RGBA"


async def test_a_png_saved_as_jpg_is_read_as_what_it_is() -> None:
    read = await read_attachment("chart.jpg", png(200, 100), LIMITS)
    assert read.mime == "image/png" and read.image_mime == "image/png"


# --- what is refused, and why -----------------------------------------------------------------


async def test_a_file_over_the_limit_is_refused_before_it_is_read() -> None:
    reason = await refusal("big.pdf", b"%PDF-1.4\n" + bytes(LIMITS.max_bytes))
    assert reason == "the file is 2.0 MB, over the 2 MB limit for files"


async def test_the_operators_settings_are_the_limits() -> None:
    limits = ReadLimits.from_settings(GraphSettings(ATTACHMENT_MAX_BYTES=4096, IMAGE_MAX_SIDE=100))
    reason = await refusal("notes.txt", b"x" * 5000, limits)
    assert reason == "the file is 4.9 KB, over the 4 KB limit for files"
    read = await read_attachment("wide.png", png(400, 200), limits)
    assert opened(read).size == (100, 50)


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("tool.pdf", ELF, "it is named .pdf but is not a PDF (a damaged or renamed file?)"),
        ("archive.docx", zip_of({"notes.txt": b"hi"}), "it is named .docx but is not a Word document"),
        ("setup.exe", ELF, "this kind of file is not supported; I read PDF, Word (.docx), text, Markdown"),
        ("photos.zip", zip_of({"a.jpg": b"x"}), "this kind of file is not supported"),
        (
            "budget.xlsx",
            zip_of({"xl/workbook.xml": b"<x/>"}),
            "spreadsheets are not supported: save the sheet as CSV",
        ),
        ("voice.wav", wav(0.2), "voice and audio messages are transcribed by the bot, not read as files"),
        ("clip.mp4", b"\x00\x00\x00\x18ftypisom" + bytes(100), "videos are not supported yet"),
        ("empty.txt", b"", "the file is empty"),
    ],
)
async def test_files_of_the_wrong_type_are_refused_by_their_bytes(
    name: str, data: bytes, expected: str
) -> None:
    assert (await refusal(name, data)).startswith(expected)


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("broken.pdf", corrupt_pdf(), "not a readable PDF (the file is damaged or not a PDF)"),
        (
            "locked.pdf",
            encrypted_pdf(REPORT),
            "the PDF is encrypted (password-protected); remove the password",
        ),
        (
            "scan.pdf",
            pdf_with_text([]),
            "the PDF has no text layer (a scanned document?); OCR is not supported",
        ),
        ("cut.png", png(300, 200)[:400], "the image is damaged or not really an image"),
        ("latin1.txt", "Café crème".encode("latin-1"), "it is not UTF-8 text: save it as UTF-8"),
    ],
)
async def test_damaged_or_unreadable_files_say_what_is_wrong(name: str, data: bytes, expected: str) -> None:
    assert (await refusal(name, data)).startswith(expected)


async def test_a_zip_bomb_is_refused_without_being_unpacked() -> None:
    reason = await refusal("bomb.docx", zip_bomb_docx())  # 1 MB that inflates to 1 GiB
    assert reason == "it looks like a zip bomb (it would unpack to 1,024 MB from 1.0 MB; at most 256 MB)"


async def test_a_decompression_bomb_image_is_refused_from_its_header() -> None:
    reason = await refusal("bomb.png", png_bomb())  # 900 megapixels in 0.9 MB
    assert reason == "the image is too large (30000×30000 pixels, at most 64 megapixels): send a smaller one"


async def test_a_file_needing_more_memory_than_allowed_ends_the_worker_not_the_graph() -> None:
    tight = ReadLimits(max_bytes=LIMITS.max_bytes, timeout=30, memory_mb=128, image_max_side=1568)
    data = png_bomb(7000, 7000, rgba=True)  # 49 megapixels: allowed, but 196 MB once decoded
    assert await refusal("huge.png", data, tight) == "reading it needed too much memory"
    read = await read_attachment("ok.png", png(64, 64), tight)  # the next file is read as usual
    assert read.width == 64


async def test_a_reading_that_takes_too_long_is_stopped() -> None:
    hurried = ReadLimits(max_bytes=LIMITS.max_bytes, timeout=0.01, memory_mb=1024, image_max_side=1568)
    before = _children()  # the session's servers
    started = time.perf_counter()
    reason = await refusal("report.pdf", pdf_with_text(REPORT), hurried)
    assert reason == "reading it took too long (over 0.01 seconds)"
    assert time.perf_counter() - started < 1
    assert _children() == before  # killed and reaped


# --- the graph is never blocked nor left with processes ---------------------------------------


async def test_the_event_loop_keeps_running_while_a_big_file_is_read() -> None:
    big = pdf_of_size(1_500_000, ["The quick brown fox jumps over the lazy dog, again and again."])
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    started = time.perf_counter()
    read = await read_attachment("big.pdf", big, replace(LIMITS, max_chars=10**9))  # every page
    took = time.perf_counter() - started
    done.set()
    await ticking
    assert read.pages is not None and read.pages > 300 and "Page 300" in read.text
    assert took > 0.3  # a real parse, long enough for the ticker to notice a blocked loop
    assert len(gaps) > took / 0.05  # it ticked all along
    assert max(gaps) < 0.25, max(gaps)  # never stalled for the parse's length


async def test_a_long_pdf_is_read_only_as_far_as_the_model_can_be_shown() -> None:
    big = pdf_of_size(1_500_000, ["The quick brown fox jumps over the lazy dog, again and again."])
    read = await read_attachment("big.pdf", big, replace(LIMITS, max_chars=4000))
    assert read.pages is not None and read.pages > 300 and read.pages_read is not None
    assert read.pages_read < 10 and "Page 1\n" in read.text and "Page 300" not in read.text
    content = turn_content("summarise", [read], vision=False, max_tokens=1000)
    assert isinstance(content, str)
    assert re.search(rf"only its first \d of its {read.pages} pages are shown", content), content[:600]


@pytest.mark.parametrize(
    ("pages", "pages_read"),
    [
        (["a" * 300_000, "b" * 300_000, "c" * 300_000], 1),  # reading stops after a huge first page
        (["a" * 100, "b" * 300_000], 2),  # read to the end, the last page huge
    ],
)
async def test_a_pdf_with_huge_pages_gives_the_graph_no_more_than_the_cap(
    pages: list[str], pages_read: int
) -> None:
    data = pdf_of_pages(pages)
    assert len(data) < 10_000  # a few kilobytes on the wire
    read = await read_attachment("dense.pdf", data, LIMITS)  # the cap: 32,000 characters
    assert len(read.text) == LIMITS.max_chars + 1 and read.text.startswith("[page 1]\n\n" + pages[0][:50])
    assert (read.pages, read.pages_read) == (len(pages), pages_read)
    content = turn_content("summarise", [read], vision=False, max_tokens=LIMITS.max_chars // 4)
    assert isinstance(content, str) and len(content) < LIMITS.max_chars + 2000
    assert "The file is too long to show whole" in content


async def test_several_files_are_read_at_once() -> None:
    files = [
        ("a.pdf", pdf_with_text(["alpha"])),
        ("b.docx", docx_with_text(["beta"])),
        ("c.png", png(100, 50)),
    ]
    reads = await asyncio.gather(*(read_attachment(name, data, LIMITS) for name, data in files))
    assert [r.name for r in reads] == ["a.pdf", "b.docx", "c.png"]
    assert "alpha" in reads[0].text and "beta" in reads[1].text and reads[2].width == 100


async def test_a_cancelled_turn_leaves_no_worker_behind() -> None:
    big = pdf_of_size(1_500_000, ["Lorem ipsum dolor sit amet, consectetur adipiscing elit."])
    before = _children()  # the session's servers
    every_page = replace(LIMITS, max_chars=10**9)  # a long read, not the budget's first pages
    task = asyncio.create_task(read_attachment("big.pdf", big, every_page))
    await asyncio.sleep(0.2)
    assert _children() - before, "the worker should be running"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _children() == before


def _children() -> set[int]:
    """This process's live child processes, from /proc (every thread's list)."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    return pids
