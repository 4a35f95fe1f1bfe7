"""Reading one attached file: its size and real type checked here, its content read in a
process of its own (worker.py) under memory, CPU and time limits, walled in by sandbox.py.

Why a process and not a thread: a thread cannot be stopped, shares the graph's memory and
holds the GIL while a parser loops in Python. A hostile file (a zip bomb, a decompression
bomb, a PDF that never ends, one that crashes a C parser) can only end that process; the
graph's event loop awaits a pipe meanwhile, and reads no more of it than an answer can
hold. Every way it can go wrong ends as Refused, whose reason the user reads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import math
import os
import signal
import sys
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog

from vagent_graph.attachments.files import CHARS_PER_TOKEN, ReadFile
from vagent_graph.attachments.sandbox import harden_parent
from vagent_graph.attachments.worker import TOO_MUCH_MEMORY
from vagent_shared.attachments import clean_name, kind_of, sniff_mime

if TYPE_CHECKING:
    from vagent_shared.settings import GraphSettings

log = structlog.get_logger(__name__)

_WORKER: Final = "vagent_graph.attachments.worker"
#: What the user is told the agent reads.
SUPPORTED: Final = (
    "PDF, Word (.docx), text, Markdown, HTML and CSV documents, and PNG, JPEG, GIF and WebP images"
)
#: A name's extension that promises a type the bytes must then have (images may be one
#: another: a PNG saved as .jpg is common and harmless).
_PROMISED: Final[dict[str, tuple[str, str]]] = {
    ".pdf": ("PDF", "application/pdf"),
    ".docx": ("Word document", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    ".png": ("PNG image", "image/png"),
    ".jpg": ("JPEG image", "image/jpeg"),
    ".jpeg": ("JPEG image", "image/jpeg"),
    ".gif": ("GIF image", "image/gif"),
    ".webp": ("WebP image", "image/webp"),
}
#: Text files whose bytes are not text as the agent reads it (UTF-8 or UTF-16 with a BOM).
_TEXT_EXTENSIONS: Final = frozenset({".txt", ".text", ".md", ".markdown", ".csv", ".html", ".htm"})
#: Formats people often send that are not read, and what to do instead.
_SAVE_AS: Final = {
    ".doc": "old Word .doc files are not supported: save it as .docx or PDF",
    ".odt": "OpenDocument text is not supported: save it as .docx or PDF",
    ".rtf": "RTF is not supported: save it as .docx or PDF",
    ".xls": "spreadsheets are not supported: save the sheet as CSV",
    ".xlsx": "spreadsheets are not supported: save the sheet as CSV",
    ".ods": "spreadsheets are not supported: save the sheet as CSV",
    ".ppt": "presentations are not supported: save it as PDF",
    ".pptx": "presentations are not supported: save it as PDF",
    ".odp": "presentations are not supported: save it as PDF",
    ".heic": "HEIC photos are not supported: send it as JPEG or PNG",
    ".svg": "SVG images are not supported: send it as PNG",
}
_DAMAGED: Final = "it could not be read (the file may be damaged)"
_STDERR_LOG_CHARS: Final = 2000
_BIG_ANSWER: Final = 256 * 1024
#: Room in an answer for everything but the text or the image (keys, numbers, a reason).
_ANSWER_SLACK: Final = 64 * 1024


@dataclass(frozen=True)
class ReadLimits:
    """What one file may cost: its size, and the reading process's time and memory."""

    max_bytes: int
    timeout: float
    memory_mb: int
    image_max_side: int
    #: The most text of one document the model can be shown (ATTACHMENT_MAX_TOKENS): the
    #: worker reads no further.
    max_chars: int = 32_000

    @classmethod
    def from_settings(cls, s: GraphSettings) -> ReadLimits:
        return cls(
            max_bytes=s.ATTACHMENT_MAX_BYTES,
            timeout=s.ATTACHMENT_PARSE_TIMEOUT_SECONDS,
            memory_mb=s.ATTACHMENT_PARSE_MEMORY_MB,
            image_max_side=s.IMAGE_MAX_SIDE,
            max_chars=s.ATTACHMENT_MAX_TOKENS * CHARS_PER_TOKEN,
        )


class Refused(Exception):
    """A file the agent does not use, with one short reason the user reads after its name."""

    def __init__(self, name: str, reason: str, *, worker_peak_rss: int = 0) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason
        self.worker_peak_rss = worker_peak_rss


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _workers() -> asyncio.Semaphore:
    """At most one worker per core at once in this process: each may use
    ATTACHMENT_PARSE_MEMORY_MB, and more than the cores only share them (files wait their
    turn; conversations without files are not affected)."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = asyncio.Semaphore(max(1, os.cpu_count() or 1))
        _SLOTS[loop] = slots
    return slots


async def read_attachment(name: str, data: bytes, limits: ReadLimits) -> ReadFile:
    """The file's content for the model, or Refused. `name` is cleaned here (clean_name)."""
    name = clean_name(name)
    size = len(data)
    if size == 0:
        raise Refused(name, "the file is empty")
    if size > limits.max_bytes:
        limit = _size(limits.max_bytes).replace(".0 ", " ")
        raise Refused(name, f"the file is {_size(size)}, over the {limit} limit for files")
    kind, mime = _readable(name, sniff_mime(data, name))
    async with _workers():
        result = await _run_worker(name, kind, mime, data, limits)
    peak = _int(result.get("peak_rss"))
    if result.get("ok") is not True:
        reason = result.get("reason")
        raise Refused(name, _one_line(reason) if isinstance(reason, str) else _DAMAGED, worker_peak_rss=peak)
    if kind == "document":
        text = result.get("text")
        pages = result.get("pages")
        return ReadFile(
            name,
            mime,
            kind,
            size,
            text=text[: limits.max_chars + 1] if isinstance(text, str) else "",  # whatever the worker says
            pages=pages if isinstance(pages, int) else None,
            pages_read=_int(result.get("pages_read")) or None,
            chars=_int(result.get("chars")) if result.get("chars") is not None else None,
            worker_peak_rss=peak,
        )
    try:
        image = base64.b64decode(str(result.get("image", "")), validate=True)
    except (binascii.Error, ValueError):
        image = b""
    if not image:
        raise Refused(name, _DAMAGED, worker_peak_rss=peak)
    return ReadFile(
        name,
        mime,
        kind,
        size,
        image=image,
        image_mime=str(result.get("image_mime") or "image/jpeg"),
        width=_int(result.get("width")),
        height=_int(result.get("height")),
        worker_peak_rss=peak,
    )


def _readable(name: str, mime: str | None) -> tuple[Literal["document", "image"], str]:
    """The kind and type the worker reads, or Refused saying why not (from the bytes' type)."""
    kind = kind_of(mime)
    if kind == "audio":
        raise Refused(name, "voice and audio messages are transcribed by the bot, not read as files")
    if kind == "video":
        raise Refused(name, "videos are not supported yet")
    extension = os.path.splitext(name)[1].lower()
    promised, promised_mime = _PROMISED.get(extension, ("", ""))
    same_kind = promised_mime == mime or (kind == "image" and promised_mime.startswith("image/"))
    if promised and not same_kind:
        raise Refused(name, f"it is named {extension} but is not a {promised} (a damaged or renamed file?)")
    if (kind == "document" or kind == "image") and mime is not None:
        return kind, mime
    if mime is None and extension in _TEXT_EXTENSIONS:
        raise Refused(name, "it is not UTF-8 text: save it as UTF-8 and try again")
    if extension in _SAVE_AS:
        raise Refused(name, _SAVE_AS[extension])
    raise Refused(name, f"this kind of file is not supported; I read {SUPPORTED}")


async def _run_worker(
    name: str, kind: Literal["document", "image"], mime: str, data: bytes, limits: ReadLimits
) -> dict[str, Any]:
    """Run worker.py on the bytes; its JSON answer, or Refused when it died or overran (or
    said more than an answer of its kind can hold: a worker running someone's code)."""
    _harden()
    cpu_seconds = math.ceil(limits.timeout) + 1  # the wall-clock timeout below is the tighter one
    request = json.dumps(
        {"mime": mime, "max_side": limits.image_max_side, "max_chars": limits.max_chars}
    ).encode()
    request += b"\n"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",  # the graph's working directory is not on the worker's import path
        "-m",
        _WORKER,
        str(limits.memory_mb),
        str(cpu_seconds),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_worker_env(),
    )
    try:
        out, err = await asyncio.wait_for(
            _exchange(proc, request, data, answer_limit(kind, limits)), limits.timeout
        )
    except TimeoutError:
        log.info("attachment_worker_timeout", mime=mime, size=len(data), timeout=limits.timeout)
        raise Refused(name, f"reading it took too long (over {limits.timeout:g} seconds)") from None
    finally:
        if proc.returncode is None:  # timed out, or the turn was cancelled
            with contextlib.suppress(ProcessLookupError):  # it ended just now
                proc.kill()
            await proc.wait()
    returncode = proc.returncode
    if out is None:
        log.warning("attachment_worker_answer_too_large", mime=mime, limit=answer_limit(kind, limits))
        raise Refused(name, _DAMAGED)
    try:  # a long document's answer is megabytes of JSON: parsed off the event loop
        result = (
            await asyncio.to_thread(json.loads, out) if len(out) > _BIG_ANSWER else json.loads(out or b"null")
        )
    except ValueError:
        result = None
    if returncode == 0 and isinstance(result, dict):
        if err.strip():
            log.debug("attachment_worker_stderr", mime=mime, stderr=_tail(err))
        _log_sandbox(result.get("sandbox"))
        return result
    log.warning("attachment_worker_failed", mime=mime, returncode=returncode, stderr=_tail(err))
    if returncode == -signal.SIGXCPU:
        raise Refused(name, f"reading it took too long (over {limits.timeout:g} seconds)")
    if returncode == -signal.SIGKILL:  # not ours (we kill only after the timeout): the OOM killer
        raise Refused(name, TOO_MUCH_MEMORY)
    raise Refused(name, _DAMAGED)


def answer_limit(kind: Literal["document", "image"], limits: ReadLimits) -> int:
    """The most bytes a worker's answer can take: for a document, its text at the cap (one
    character more) with every character escaped (6 bytes); for an image, the scaled copy
    in base64 at 4.1 bytes a pixel (PNG of RGBA noise: 4.006). The graph reads no more."""
    if kind == "document":
        return 6 * (limits.max_chars + 1) + _ANSWER_SLACK
    image = limits.image_max_side * limits.image_max_side * 41 // 10 + _ANSWER_SLACK
    return 4 * (image // 3 + 1) + _ANSWER_SLACK


_hardened = False
_sandbox_seen: dict[str, Any] | None = None


def _harden() -> None:
    """The graph goes non-dumpable before its first worker (vagent-graph does it at start-up
    too): a worker must not read its keys from /proc/<graph>/environ."""
    global _hardened
    if not _hardened:
        _hardened = True
        if not harden_parent():
            log.warning("attachment_parent_dumpable", platform=sys.platform)


def _log_sandbox(walls: object) -> None:
    """What the worker's walls are on this host, logged once (and again if it changes): an
    operator sees when there is no network namespace or no seccomp filter."""
    global _sandbox_seen
    if not isinstance(walls, dict):
        return
    seen = {  # only ints and booleans: a worker running someone's code may say anything
        "uid": _int(walls.get("uid")),
        "net_namespace": walls.get("net_namespace") is True,
        "seccomp": walls.get("seccomp") is True,
        "capabilities": walls.get("capabilities") is not False,
    }
    if seen == _sandbox_seen:
        return
    _sandbox_seen = seen
    weak = seen["capabilities"] or not seen["seccomp"]
    (log.warning if weak else log.info)("attachment_worker_sandbox", **seen)


#: The file goes to the worker in pieces this large, each written out before the next: the
#: pipe's buffer never holds a copy of the whole file.
_FEED_CHUNK = 1 << 20
#: The worker's answer and stderr are read in pieces this large.
_READ_CHUNK = 1 << 16


async def _exchange(
    proc: asyncio.subprocess.Process, request: bytes, data: bytes, max_answer: int
) -> tuple[bytes | None, bytes]:
    """Like communicate(request + data), without its two copies of the file (the sum, then
    the transport's buffer of what the pipe did not take at once), and reading at most
    `max_answer` bytes of the answer (None past it: the worker is killed) and only the end
    of stderr."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

    async def feed() -> None:
        try:
            stdin.write(request)
            view = memoryview(data)
            for start in range(0, len(view), _FEED_CHUNK):
                stdin.write(view[start : start + _FEED_CHUNK])
                await stdin.drain()
            stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker ended early (a limit): its exit status says why

    async def answer() -> bytes | None:
        out = await _read_at_most(stdout, max_answer)
        if out is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        return out

    feeding = asyncio.ensure_future(feed())
    try:
        out, err = await asyncio.gather(answer(), _read_tail(stderr, _STDERR_LOG_CHARS))
        await feeding
    finally:
        feeding.cancel()
    await proc.wait()
    return out, err


async def _read_at_most(stream: asyncio.StreamReader, limit: int) -> bytes | None:
    """Everything up to EOF, or None as soon as it is more than `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(_READ_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    """Read to EOF, keeping only the last `keep` bytes (a worker may print without end)."""
    tail = b""
    while chunk := await stream.read(_READ_CHUNK):
        tail = (tail + chunk)[-keep:]
    return tail


def _worker_env() -> dict[str, str]:
    """Only what Python needs to start: the worker never sees the graph's secrets (API keys,
    tokens) in its environment."""
    keep = ("PATH", "PYTHONPATH", "PYTHONHOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "HOME")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _tail(err: bytes) -> str:
    """The end of the worker's stderr (a traceback's last lines say most), bounded."""
    return err[-_STDERR_LOG_CHARS:].decode("utf-8", errors="replace")


def _one_line(reason: str) -> str:
    return " ".join(reason.split())[:300] or _DAMAGED


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _size(n: int) -> str:
    """20.0 MB, 1.5 MB, 300.0 KB: one decimal, so a file just over a limit reads larger."""
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MB"
    return f"{n / 1024:.1f} KB"
