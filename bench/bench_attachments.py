#!/usr/bin/env python3
"""Files in a conversation: do other conversations keep streaming while a large PDF and a
large image are read, and what memory does reading them take?

One ``vagent-graph`` (one uvicorn worker, ``LOG_LEVEL=INFO``, ``ATTACHMENT_MAX_BYTES``
``--max-mib``, ``LLM_VISION=true``) in front of the paced model stand-in
(``bench/paced_llm.py``). ``--conversations`` plain conversations (the bot's GraphClient,
in a process of their own) ask question after question the whole run. The run alternates
two kinds of block, ``--rounds`` of each, the order flipping every other round so drift on
the machine hits both:

* **A**: nothing else happens (the baseline, same run, same process).
* **B**: a ``--pdf-mib`` PDF of text pages (``tests/support/files.py``'s ``pdf_of_size``) and
  a ``--image-mib`` noisy image (JPEG by default) are sent one after the other by a third
  process, as the bot sends them (``attachments: [{name, data}]``, base64): on even rounds
  each file alone (the graph keeps it: "Got X — what should I do with it?", no model call),
  on odd rounds each with a question (the model gets the text or the image). More pairs
  follow until the block has lasted a few turns.

Printed: per file, the upload (POST to the graph's ``progress`` event: the body received,
parsed and validated, the run started), the read (``progress`` to the reply; with a
question, to the first text minus the model's own first-token time) and the total; the
peak RSS of the worker process that read it (its own VmHWM, from the graph's
``attachment_read`` log line, and from sampling the graph's children in /proc every
10 ms) against a worker that read a tiny file of the same kind; the graph process's
own peak RSS growth while it handled the file (its VmHWM, reset through
/proc/<pid>/clear_refs just before the request, minus its RSS then). Then the first-token
latency of the plain conversations in A and in B (ms added to the model's own first token),
B minus A, and the longest gap between two text writes of a stream; "stalls" (many streams
stopped at once: the graph's event loop was busy) and the B turns, each placed in the stage
of the file being handled then (upload, read, reply). Targets: the added p99 grows by at
most 100 ms in B; peak RSS grows by at most 3x the file's size. A MISS never makes the exit
code non-zero. The worker's peak is also the larger of the log's and the sampler's: it
measures itself before writing its answer. The sampler counts a child only once it has
exec'd the worker (before that it is a copy of the graph and shows the graph's RSS).

    .venv/bin/python bench/bench_attachments.py            # or: make bench-attachments
    .venv/bin/python bench/bench_attachments.py --quick    # seconds, for smoke tests
    .venv/bin/python bench/bench_attachments.py --worker-nice 19   # experiment: reniced workers
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass, field, fields
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.bench_capacity import (  # noqa: E402
    TURN_TIMEOUT_S,
    git_state,
    graph_client,
    paced_standin,
    standin_stats,
    start_redis,
)
from bench.common import (  # noqa: E402
    INTERRUPTED,
    BenchError,
    default_results_path,
    fork_child,
    machine_info,
    make_results,
    print_log_tail,
    print_machine,
    run_main,
    stop_child,
    summary,
    verdict,
)
from tests.support.factories import ac, message_body, new_session  # noqa: E402
from tests.support.files import jpeg, pdf_of_size, pdf_with_text, png  # noqa: E402
from tests.support.graph_process import GraphProcess  # noqa: E402
from vagent_bot.clients.graph_client import GraphClient  # noqa: E402
from vagent_shared.attachments import Attachment  # noqa: E402
from vagent_shared.events import Done, ErrorEvent, Progress, TextChunk, TextFinal  # noqa: E402
from vagent_shared.wire import ProcessMessageRequest  # noqa: E402

MIB = 1024 * 1024
#: The issue's targets.
P99_DELTA_TARGET_MS = 100.0
RSS_FACTOR_TARGET = 3.0
#: A conversation starts a new session after this many turns (its history stays realistic).
SESSION_TURNS = 10
#: The graph's children are sampled this often (worker peak RSS, cross-check of the log).
SAMPLE_S = 0.01
#: How the worker shows in its command line (reading.py: `python -m <module> ...`).
WORKER_MODULE = b"vagent_graph.attachments.worker"
#: A gap between two text chunks this long is a stall (three times the graph's 50 ms write interval).
STALL_S = 0.15
#: A B block sends files until it has lasted at least this many plain turns.
MIN_BLOCK_TURNS = 3
QUESTION = "What is in this file? Summarise it in a few sentences."
PDF_LINES = [
    f"Line {i}: the quarterly report lists revenue, costs and the orders of customer {i} in York."
    for i in range(45)
]
DEFAULTS: dict[str, Any] = {
    "conversations": 20,
    "rounds": 8,
    "pdf_mib": 20.0,
    "image_mib": 10.0,
    "ttft_ms": 300.0,
    "chunk_ms": 25.0,
    "chunks": 120,
}
QUICK: dict[str, Any] = {
    "conversations": 4,
    "rounds": 2,
    "pdf_mib": 1.0,
    "image_mib": 0.5,
    "ttft_ms": 50.0,
    "chunk_ms": 10.0,
    "chunks": 10,
}
VERSIONS_OF = ("pypdf", "pillow", "fastapi", "uvicorn", "pydantic", "aiohttp")


@dataclass
class Config:
    conversations: int
    rounds: int
    pdf_mib: float
    image_mib: float
    ttft_ms: float
    chunk_ms: float
    chunks: int
    image_format: str
    max_mib: int
    quick: bool
    log_level: str
    json_path: Path
    worker_nice: int | None = None

    @property
    def turn_s(self) -> float:
        """The model's own time for a whole plain turn."""
        return (self.ttft_ms + (self.chunks - 1) * self.chunk_ms) / 1000


# ------------------------------------------------------------------------------ the files


def noisy_image(target: int, fmt: str, seed: int = 7) -> tuple[bytes, int, int]:
    """A 4:3 image of random pixels of about `target` bytes (JPEG quality 92, or PNG): noise
    does not compress, so the file really is that large, and decoding it is the worst case
    for its size. Returns the bytes and the size in pixels."""
    from PIL import Image

    rng = random.Random(seed)

    def build(width: int, height: int) -> bytes:
        image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
        out = io.BytesIO()
        if fmt == "png":
            image.save(out, "PNG")
        else:
            image.save(out, "JPEG", quality=92)
        return out.getvalue()

    width, height = 800, 600
    for _ in range(3):  # bytes per pixel from a first try, then two corrections
        data = build(width, height)
        scale = math.sqrt(target / len(data))
        if abs(scale - 1) < 0.01:
            break
        width, height = max(64, round(width * scale / 4) * 4), max(48, round(height * scale / 3) * 3)
    return data, width, height


@dataclass
class FileSpec:
    """One file the sender process holds, as the bot would forward it."""

    key: str
    name: str
    kind: str  # "PDF", "JPEG", "PNG"
    size: int
    detail: str
    attachment: Attachment | None = None


def build_files(cfg: Config) -> tuple[list[FileSpec], float]:
    """The big PDF and image, and a tiny file of each kind (the worker's baseline)."""
    t0 = time.perf_counter()
    pdf = pdf_of_size(int(cfg.pdf_mib * MIB), PDF_LINES)
    pages = pdf.count(b"/Type /Page ")
    img, width, height = noisy_image(int(cfg.image_mib * MIB), cfg.image_format)
    kind = cfg.image_format.upper()
    ext = "png" if cfg.image_format == "png" else "jpg"
    tiny_img = png(64, 48) if cfg.image_format == "png" else jpeg(64, 48)
    specs = [
        FileSpec("pdf", "report.pdf", "PDF", len(pdf), f"{pages:,} pages of text"),
        FileSpec("image", f"photo.{ext}", kind, len(img), f"{width}×{height} random pixels"),
        FileSpec("tiny-pdf", "note.pdf", "PDF", 0, "1 page"),
        FileSpec("tiny-image", f"icon.{ext}", kind, 0, "64×48"),
    ]
    datas = [pdf, img, pdf_with_text(["A short note."]), tiny_img]
    for spec, data in zip(specs, datas, strict=True):
        spec.size = len(data)
        spec.attachment = Attachment(name=spec.name, data=base64.b64encode(data))  # as the bot does
    return specs, time.perf_counter() - t0


# ------------------------------------------------------------ the conversations' process


@dataclass
class ConvJob:
    url: str
    conversations: int
    turn_s: float
    seed: int = 11


@dataclass
class Turn:
    """One plain turn as its client saw it: absolute time.perf_counter() values (one clock
    for every process of the machine), so the parent can place it in its blocks."""

    conv: int
    start: float
    first: float = math.nan
    end: float = math.nan
    chunks: int = 0
    #: longest time between two received text chunks after the first (s)
    max_gap: float = 0.0
    #: when that gap began (the chunk before it)
    gap_at: float = math.nan
    error: str = ""


async def plain_turn(client: GraphClient, req: ProcessMessageRequest, turn: Turn) -> None:
    last = math.nan
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            async for ev in client.process_message(req):
                if isinstance(ev, TextChunk):
                    now = time.perf_counter()
                    turn.chunks += 1
                    if math.isnan(turn.first):
                        turn.first = now
                    else:
                        if now - last > turn.max_gap:
                            turn.max_gap, turn.gap_at = now - last, last
                    last = now
                elif isinstance(ev, ErrorEvent):
                    turn.error = f"error event: {ev.message}"[:200]
                elif isinstance(ev, Done):
                    turn.end = time.perf_counter()
    except Exception as exc:  # counted, never fatal: the report says how many and which
        turn.error = f"{type(exc).__name__}: {exc}"[:200]
    if not turn.error and (math.isnan(turn.end) or math.isnan(turn.first)):
        turn.error = "stream ended without text or without done"


async def conversations(job: ConvJob, conn: Connection) -> dict[str, Any]:
    """`job.conversations` conversations asking question after question until the parent
    says stop; "ready" once each has finished a turn. Also this loop's own lag (a 50 ms
    probe), so a slow client is told apart from a slow graph."""
    rng = random.Random(job.seed)
    turns: list[Turn] = []
    lags: list[tuple[float, float]] = []
    stop = asyncio.Event()
    warm = 0
    ready = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.05)
            lags.append((t, (time.perf_counter() - t - 0.05) * 1000))

    async def conversation(i: int, client: GraphClient) -> None:
        nonlocal warm
        user = f"@conv{i}:localhost"
        who = ac(user)
        await asyncio.sleep(rng.uniform(0, job.turn_s))  # a steady arrival, not a burst
        k = 0
        session = new_session(user=user)
        while not stop.is_set():
            if k and k % SESSION_TURNS == 0:
                session = new_session(user=user)
            k += 1
            req = ProcessMessageRequest.model_validate(
                message_body(session, f"How are the orders going? ({k})", who)
            )
            t = Turn(i, time.perf_counter())
            await plain_turn(client, req, t)
            turns.append(t)
            if k == 1:
                warm += 1
                if warm == job.conversations:
                    ready.set()
            if t.error:
                await asyncio.sleep(0.5)

    async def tell_ready() -> None:
        await ready.wait()
        conn.send("ready")

    async def wait_stop() -> None:
        await asyncio.to_thread(conn.recv)
        stop.set()

    async with graph_client(job.url) as client:
        lag = asyncio.create_task(probe())
        helpers = [asyncio.create_task(tell_ready()), asyncio.create_task(wait_stop())]
        await asyncio.gather(*(conversation(i, client) for i in range(job.conversations)))
        stop.set()
        for h in helpers:
            h.cancel()
        await lag
    return {"turns": turns, "lags": lags}


def _serve_conversations(conn: Connection) -> None:
    loop = _new_loop()
    try:
        job = conn.recv()
        if job is not None:
            try:
                conn.send(loop.run_until_complete(conversations(job, conn)))
            except Exception as exc:  # the parent raises it
                conn.send(BenchError(f"conversations: {type(exc).__name__}: {exc}"))
    except (EOFError, OSError):
        pass
    finally:
        loop.close()


# --------------------------------------------------------------------- the files' process


@dataclass
class SendJob:
    url: str
    key: str
    question: bool
    user: str


@dataclass
class FileRun:
    """One file sent, as the sender saw it (absolute perf_counter times) and as measured."""

    key: str
    name: str
    kind: str
    size: int
    question: bool
    session_id: str = ""
    post: float = math.nan
    progress: float = math.nan
    first_text: float = math.nan
    done: float = math.nan
    reply: str = ""
    error: str = ""
    block: int = -1
    #: filled in by the parent
    graph_rss_before: int = 0
    graph_peak: int = 0
    graph_peak_sampled: int = 0
    worker_peak_logged: int = 0
    worker_peak_sampled: int = 0
    worker_cpu_s: float = math.nan
    extras: dict[str, Any] = field(default_factory=dict)


async def send_file(job: SendJob, spec: FileSpec) -> FileRun:
    """POST one file (alone, or with a question) the way the bot does, read the stream to done."""
    assert spec.attachment is not None
    run = FileRun(spec.key, spec.name, spec.kind, spec.size, job.question)
    session = new_session(user=job.user)  # a fresh session: each file costs what one file costs
    run.session_id = session.format()
    body = message_body(session, QUESTION if job.question else "", ac(job.user))
    req = ProcessMessageRequest.model_validate({**body, "attachments": [spec.attachment]})
    async with graph_client(job.url) as client:
        run.post = time.perf_counter()
        try:
            async with asyncio.timeout(TURN_TIMEOUT_S * 2):
                async for ev in client.process_message(req):
                    now = time.perf_counter()
                    if isinstance(ev, Progress) and math.isnan(run.progress):
                        run.progress = now
                    elif isinstance(ev, TextChunk | TextFinal):
                        if math.isnan(run.first_text):
                            run.first_text = now
                        if isinstance(ev, TextFinal):
                            run.reply = ev.content[:300]
                    elif isinstance(ev, ErrorEvent):
                        run.error = f"error event: {ev.message}"[:200]
                    elif isinstance(ev, Done):
                        run.done = now
        except Exception as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:200]
    if not run.error and run.reply.startswith("⚠️"):
        run.error = f"refused: {run.reply}"
    if not run.error and (math.isnan(run.done) or math.isnan(run.first_text)):
        run.error = "stream ended without a reply or without done"
    return run


def _serve_files(conn: Connection) -> None:
    """Child process: build the files when asked (so the parent never holds them), then send
    them one at a time as the parent says."""
    loop = _new_loop()
    specs: dict[str, FileSpec] = {}
    try:
        while (job := conn.recv()) is not None:
            try:
                if isinstance(job, Config):
                    built, seconds = build_files(job)
                    specs = {s.key: s for s in built}
                    conn.send(([FileSpec(s.key, s.name, s.kind, s.size, s.detail) for s in built], seconds))
                else:
                    conn.send(loop.run_until_complete(send_file(job, specs[job.key])))
            except Exception as exc:
                conn.send(BenchError(f"file sender: {type(exc).__name__}: {exc}"))
    except (EOFError, OSError):
        pass
    finally:
        loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is in the dev requirements
        return asyncio.new_event_loop()


class Child:
    """A forked helper process and its pipe (fork before any thread exists)."""

    def __init__(self, target: Callable[[Connection], None], name: str) -> None:
        self.conn, self.proc = fork_child(target, name)
        self.name = name

    def ask(self, job: Any, timeout: float) -> Any:
        self.conn.send(job)
        return self.recv(timeout)

    def recv(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise BenchError(f"the {self.name} process did not answer within {timeout:.0f} s")
        try:
            result = self.conn.recv()
        except EOFError:
            raise BenchError(f"the {self.name} process exited (code {self.proc.exitcode})") from None
        if isinstance(result, Exception):
            raise result
        return result

    def stop(self) -> None:
        stop_child(self.conn, self.proc, None, 10)


# ------------------------------------------------------------------------ /proc readings


def _status(pid: int, field_name: str) -> int:
    """A `kB` line of /proc/<pid>/status in bytes (0 when the process is gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/status", "rb") as status:
            key = field_name.encode() + b":"
            for line in status:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    return 0


def reset_peak(pid: int) -> bool:
    """Reset VmHWM of `pid` to its current RSS (Linux >= 4.0; our own child process)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_of(pid: int) -> tuple[float, float]:
    """(utime+stime of `pid`, utime+stime of its children it has waited for), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tck, (int(fields[13]) + int(fields[14])) / tck


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def is_worker(pid: int) -> bool:
    """A reading worker once it has exec'd. Between fork and exec a child is a copy of the
    graph, whose RSS it shows (counted in both), and VmHWM starts afresh at exec."""
    try:
        return WORKER_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Sampler(threading.Thread):
    """Every SAMPLE_S: the graph's VmRSS and the VmHWM of each worker it has started."""

    def __init__(self, pid: int, worker_nice: int | None = None) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid = pid
        #: --worker-nice (an experiment): each new worker's nice value, set when first seen
        self.worker_nice = worker_nice
        self.reniced: set[int] = set()
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.graph_max = 0
        self.child_max: dict[int, int] = {}
        self.samples = 0

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            rss = _status(self.pid, "VmRSS")
            kids = {c: _status(c, "VmHWM") for c in children_of(self.pid) if is_worker(c)}
            if self.worker_nice is not None:
                for c in kids.keys() - self.reniced:
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, c, self.worker_nice)
                    self.reniced.add(c)
            with self.lock:
                self.samples += 1
                self.graph_max = max(self.graph_max, rss)
                for c, hwm in kids.items():
                    self.child_max[c] = max(self.child_max.get(c, 0), hwm)

    def take(self) -> tuple[int, int]:
        """(max graph VmRSS, max VmHWM of a child) since the last take."""
        with self.lock:
            out = self.graph_max, max(self.child_max.values(), default=0)
            self.graph_max, self.child_max = 0, {}
        return out


# --------------------------------------------------------------------------------- the run


@dataclass
class Block:
    index: int
    phase: str  # "A" (no files) or "B" (files)
    start: float
    end: float
    question: bool = False
    files: list[str] = field(default_factory=list)
    graph_cpu_s: float = math.nan
    llm_first_late_p99_ms: float = math.nan
    rss_end: int = 0


def send_one(
    files: Child, graph: GraphProcess, sampler: Sampler, spec: FileSpec, question: bool, n: int
) -> FileRun:
    """One file, with the graph's memory readings around it."""
    pid = graph.proc.pid if graph.proc else 0
    sampler.take()
    before = _status(pid, "VmRSS")
    peak_reset = reset_peak(pid)
    _, kids0 = cpu_of(pid)
    run: FileRun = files.ask(
        SendJob(graph.url, spec.key, question, f"@files{n}:localhost"), TURN_TIMEOUT_S * 2 + 30
    )
    _, kids1 = cpu_of(pid)
    graph_max, child_max = sampler.take()
    run.graph_rss_before = before
    run.graph_peak = _status(pid, "VmHWM") if peak_reset else graph_max
    run.graph_peak_sampled = graph_max
    run.worker_peak_sampled = child_max
    run.worker_cpu_s = kids1 - kids0
    run.extras["peak_from"] = "VmHWM" if peak_reset else "sampled VmRSS"
    return run


def file_block(
    cfg: Config,
    files: Child,
    graph: GraphProcess,
    sampler: Sampler,
    specs: dict[str, FileSpec],
    index: int,
    question: bool,
    pdf_first: bool,
    runs: list[FileRun],
) -> Block:
    """Send the PDF and the image one after the other (more pairs until the block has lasted
    MIN_BLOCK_TURNS plain turns)."""
    order = ["pdf", "image"] if pdf_first else ["image", "pdf"]
    block = Block(index, "B", time.perf_counter(), math.nan, question)
    while True:
        for key in order:
            run = send_one(files, graph, sampler, specs[key], question, len(runs))
            run.block = index
            runs.append(run)
            block.files.append(key)
            if run.error:
                print(f"      {run.name}: {run.error}", flush=True)
        if time.perf_counter() - block.start >= MIN_BLOCK_TURNS * cfg.turn_s:
            break
    block.end = time.perf_counter()
    return block


def attach_logs(graph: GraphProcess, runs: Sequence[FileRun]) -> None:
    """The worker's own peak RSS, from the graph's `attachment_read` line of that session."""
    by_session: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        for rec in graph.log_records():
            if rec.get("event") == "attachment_read" and isinstance(rec.get("worker_peak_rss"), int):
                by_session[str(rec.get("session_id"))] = rec["worker_peak_rss"]
    for run in runs:
        run.worker_peak_logged = by_session.get(run.session_id, 0)


def worker_peak(run: FileRun) -> int:
    """The worker logs its VmHWM before it writes its answer (megabytes of JSON for a long
    document); the sampler may see it later, so the larger of the two."""
    return max(run.worker_peak_logged, run.worker_peak_sampled)


def file_times(cfg: Config, run: FileRun) -> dict[str, float]:
    """Milliseconds: upload (POST -> progress), read (progress -> reply; with a question,
    minus the model's own first-token time), total (POST -> done)."""
    read = (run.first_text - run.progress) * 1000 - (cfg.ttft_ms if run.question else 0.0)
    return {
        "upload_ms": (run.progress - run.post) * 1000,
        "read_ms": read,
        "total_ms": (run.done - run.post) * 1000,
    }


def counted_turns(phase: str, blocks: Sequence[Block], turns: Sequence[Turn]) -> tuple[list[Turn], list[str]]:
    """The plain turns whose start AND first text fall inside one block of `phase`, and the
    errors of those that started in one."""
    mine = [b for b in blocks if b.phase == phase]
    counted: list[Turn] = []
    errors: list[str] = []
    for t in turns:
        for b in mine:
            if b.start <= t.start < b.end:
                if t.error:
                    errors.append(t.error)
                elif t.first <= b.end:
                    counted.append(t)
                break
    return counted, errors


#: What the graph was doing with a file, in the order a turn is put in one (the first it overlaps).
STAGES = ("upload", "reply", "read", "between")


def stage_spans(r: FileRun) -> dict[str, tuple[float, float]]:
    """When each stage of a file's handling ran (absolute perf_counter seconds)."""
    return {
        "upload": (r.post, r.progress),
        "read": (r.progress, r.first_text),
        "reply": (r.first_text, r.done),
    }


def stage_of(t: Turn, runs: Sequence[FileRun]) -> str:
    """Which stage of a file's handling the turn's wait for its first text overlapped: upload
    (POST to progress: the body received, parsed, validated), read (the worker reads), reply
    (the worker's answer taken in, the reply or the model's answer, the checkpoint), or none."""
    hit: set[str] = set()
    for r in runs:
        for stage, (s0, s1) in stage_spans(r).items():
            if t.start < s1 and t.first > s0:
                hit.add(stage)
    return next((s for s in STAGES if s in hit), "between")


def by_stage(
    cfg: Config, blocks: Sequence[Block], turns: Sequence[Turn], runs: Sequence[FileRun]
) -> dict[str, Any]:
    """The B turns' added first-token latency, grouped by stage_of."""
    counted, _ = counted_turns("B", blocks, turns)
    groups: dict[str, list[float]] = {s: [] for s in STAGES}
    for t in counted:
        groups[stage_of(t, runs)].append((t.first - t.start) * 1000 - cfg.ttft_ms)
    return {s: {"turns": len(v), **summary(v)} for s, v in groups.items()}


def block_figures(cfg: Config, block: Block, turns: Sequence[Turn]) -> dict[str, Any]:
    """One block's plain turns: added first-token p50/p99/max and the longest gap."""
    counted, errors = counted_turns(block.phase, [block], turns)
    added = summary([(t.first - t.start) * 1000 - cfg.ttft_ms for t in counted])
    return {
        "turns": len(counted),
        "errors": len(errors),
        "added_first_ms": added,
        "max_gap_ms": max((t.max_gap * 1000 for t in counted), default=math.nan),
    }


@dataclass
class Stall:
    """A moment when many streams stopped at once: the graph's event loop was busy."""

    start: float  # the earliest last chunk before it
    resumed: float  # when the streams went on (median)
    streams: int
    gap_ms: float  # the median gap of those streams
    phase: str = ""
    block: int = -1
    stage: str = ""
    file: str = ""


def find_stalls(
    cfg: Config, turns: Sequence[Turn], blocks: Sequence[Block], runs: Sequence[FileRun]
) -> list[Stall]:
    """Gaps over STALL_S that at least a quarter of the conversations' streams (2 at least)
    had at the same moment, each placed in its block and in the stage of a file that was
    being handled when the streams went on (the loop had just been given back)."""
    events = sorted((t.gap_at, t.max_gap) for t in turns if not t.error and t.max_gap > STALL_S)
    groups: list[list[tuple[float, float]]] = []
    for at, gap in events:
        if groups and at - groups[-1][0][0] < STALL_S:
            groups[-1].append((at, gap))
        else:
            groups.append([(at, gap)])
    found: list[Stall] = []
    for g in groups:
        if len(g) < max(2, cfg.conversations // 4):
            continue
        resumed = statistics.median(at + gap for at, gap in g)
        stall = Stall(g[0][0], resumed, len(g), statistics.median(gap for _, gap in g) * 1000)
        for b in blocks:
            if b.start <= resumed < b.end:
                stall.phase, stall.block = b.phase, b.index
        moment = resumed - 0.005
        for r in runs:
            for stage, (s0, s1) in stage_spans(r).items():
                if s0 <= moment < s1:
                    stall.stage, stall.file = stage, r.name
        found.append(stall)
    return found


def phase_figures(cfg: Config, phase: str, blocks: Sequence[Block], turns: Sequence[Turn]) -> dict[str, Any]:
    """The figures of the plain turns counted in `phase` (counted_turns)."""
    mine = [b for b in blocks if b.phase == phase]
    counted, errors = counted_turns(phase, blocks, turns)
    added = [((t.first - t.start) * 1000 - cfg.ttft_ms) for t in counted]
    # gaps only of streams that ended in the block too: a stream that runs on into the next
    # block would carry that block's stalls
    gaps = [
        t.max_gap * 1000
        for t in counted
        if t.chunks > 1 and any(b.start <= t.start and t.end <= b.end for b in mine)
    ]
    seconds = sum(b.end - b.start for b in mine)
    cpu = sum(b.graph_cpu_s for b in mine)
    return {
        "phase": phase,
        "blocks": len(mine),
        "seconds": seconds,
        "turns": len(counted),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "added_first_ms": summary(added),
        "max_gap_ms": summary(gaps),
        "graph_cpu_share": cpu / seconds if seconds else math.nan,
        "llm_first_late_p99_ms": max((b.llm_first_late_p99_ms for b in mine), default=math.nan),
    }


def run(cfg: Config) -> dict[str, Any]:
    info = machine_info(VERSIONS_OF)
    started = datetime.now(UTC)
    print_machine("vagent attachments benchmark", info, started)
    with contextlib.ExitStack() as stack:
        convs = Child(_serve_conversations, "conversations")  # fork before any thread exists
        stack.callback(convs.stop)
        files = Child(_serve_files, "file-sender")
        stack.callback(files.stop)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-attachments-")))
        redis = start_redis(stack, tmp / "redis")
        llm_url, _ = stack.enter_context(paced_standin(cfg.ttft_ms, cfg.chunk_ms, cfg.chunks))
        env = {
            "LOG_LEVEL": cfg.log_level,
            "ATTACHMENT_MAX_BYTES": str(cfg.max_mib * MIB),
            "LLM_VISION": "true",
        }
        graph = GraphProcess(redis.url, tmp / "graph", llm_url, **env)
        stack.callback(graph.stop)
        graph.start()
        assert graph.proc is not None
        pid = graph.proc.pid
        built, build_s = files.ask(cfg, 600)
        specs: dict[str, FileSpec] = {s.key: s for s in built}
        for s in specs.values():
            if s.size > cfg.max_mib * MIB:
                raise BenchError(f"{s.name} is {s.size / MIB:.1f} MiB, over --max-mib {cfg.max_mib}")
        conf: dict[str, Any] = {
            "conversations": cfg.conversations,
            "rounds": cfg.rounds,
            "ttft_ms": cfg.ttft_ms,
            "chunk_ms": cfg.chunk_ms,
            "chunks": cfg.chunks,
            "image_format": cfg.image_format,
            "graph_env": env,
            "quick": cfg.quick,
            "worker_nice": cfg.worker_nice,
            "commit": git_state(),
            "placement": "left to the kernel (the reading worker, a child of the graph, may run on any core)",
            "p99_delta_target_ms": P99_DELTA_TARGET_MS,
            "rss_factor_target": RSS_FACTOR_TARGET,
            "files": {k: asdict(s) | {"attachment": None} for k, s in specs.items()},
        }
        p, im = specs["pdf"], specs["image"]
        print(
            f"   files   : {p.name} {p.size / MIB:.1f} MiB ({p.detail}), {im.name} {im.size / MIB:.1f} MiB "
            f"({im.kind}, {im.detail}); built in {build_s:.1f} s"
        )
        print(
            f"   model   : first token {cfg.ttft_ms:.0f} ms, then {cfg.chunks} chunks {cfg.chunk_ms:.0f} ms "
            f"apart ({cfg.turn_s:.2f} s a turn)"
        )
        print(
            f"   graph   : {conf['commit']}; ATTACHMENT_MAX_BYTES {cfg.max_mib} MiB, LLM_VISION true, "
            f"LOG_LEVEL {cfg.log_level}; placement left to the kernel"
            + (f"; EXPERIMENT: workers reniced to {cfg.worker_nice}" if cfg.worker_nice is not None else "")
        )
        print(
            f"   plan    : {cfg.conversations} plain conversations the whole run; {cfg.rounds} rounds of "
            "A (nothing else) and B (the PDF and the image, one after the other), alternating",
            flush=True,
        )
        sampler = Sampler(pid, cfg.worker_nice)
        sampler.start()
        stack.callback(sampler.halt.set)
        try:
            results = measure(cfg, convs, files, graph, sampler, specs, llm_url)
        except Exception:
            if not INTERRUPTED.is_set():
                print_log_tail("graph service", graph.logs(), 30)
            raise
        conf["sampler_samples"] = sampler.samples
    info["loadavg_at_end"] = list(os.getloadavg())
    print(f"   load average at the end: {', '.join(f'{x:.2f}' for x in info['loadavg_at_end'])}")
    return make_results(started, info, conf, **results)


def measure(
    cfg: Config,
    convs: Child,
    files: Child,
    graph: GraphProcess,
    sampler: Sampler,
    specs: dict[str, FileSpec],
    llm_url: str,
) -> dict[str, Any]:
    assert graph.proc is not None
    pid = graph.proc.pid
    # warm-up (unmeasured): the conversations' first turns, a tiny file of each kind (the
    # worker's baseline peak RSS), then the big ones once (first-use imports and allocations)
    convs.conn.send(ConvJob(graph.url, cfg.conversations, cfg.turn_s))
    convs.recv(TURN_TIMEOUT_S + 60)
    runs: list[FileRun] = []
    warm: list[FileRun] = []
    for key in ("tiny-pdf", "tiny-image", "pdf", "image"):
        w = send_one(files, graph, sampler, specs[key], False, len(warm))
        if w.error:
            raise BenchError(f"warm-up: {w.name}: {w.error}")
        warm.append(w)
    block_s = max(MIN_BLOCK_TURNS * cfg.turn_s, (warm[-1].done - warm[-2].post))
    rss_start = _status(pid, "VmRSS")
    print(
        f"\n   warm-up done: graph RSS {rss_start / MIB:.0f} MiB; A blocks last as long as the B "
        f"block before them (first {block_s:.1f} s)",
        flush=True,
    )
    blocks: list[Block] = []
    for r in range(cfg.rounds):
        question = r % 2 == 1
        phases = ("A", "B") if (r // 2) % 2 == 0 else ("B", "A")
        for phase in phases:
            standin_stats(llm_url, reset=True)
            cpu0, _ = cpu_of(pid)
            if phase == "A":
                t0 = time.perf_counter()
                time.sleep(block_s)
                block = Block(len(blocks), "A", t0, time.perf_counter())
            else:
                block = file_block(cfg, files, graph, sampler, specs, len(blocks), question, r % 2 == 0, runs)
                block_s = block.end - block.start
            block.graph_cpu_s = cpu_of(pid)[0] - cpu0
            block.llm_first_late_p99_ms = float(
                standin_stats(llm_url, reset=True)["first_chunk_late_ms"]["p99"]
            )
            block.rss_end = _status(pid, "VmRSS")
            blocks.append(block)
            what = (
                f"{' + '.join(block.files)} {'with a question' if block.question else 'alone'}"
                if phase == "B"
                else "no files"
            )
            print(
                f"   round {r + 1}/{cfg.rounds} block {phase}: {block.end - block.start:5.1f} s, {what}; "
                f"graph RSS {block.rss_end / MIB:.0f} MiB",
                flush=True,
            )
    convs.conn.send("stop")
    out = convs.recv(TURN_TIMEOUT_S + 60)
    turns: list[Turn] = out["turns"]
    attach_logs(graph, warm + runs)
    rss_end = _status(pid, "VmRSS")
    return report(cfg, specs, warm, runs, blocks, turns, out["lags"], rss_start, rss_end, graph)


# ------------------------------------------------------------------------------ the report


def report(
    cfg: Config,
    specs: dict[str, FileSpec],
    warm: list[FileRun],
    runs: list[FileRun],
    blocks: list[Block],
    turns: list[Turn],
    lags: list[tuple[float, float]],
    rss_start: int,
    rss_end: int,
    graph: GraphProcess,
) -> dict[str, Any]:
    baseline = {specs[r.key].kind: worker_peak(r) for r in warm if r.key.startswith("tiny-")}
    print("\n1) Each file, sent as the bot sends it (base64 in the JSON body), one at a time")
    print(
        f"   {'block':>5} {'file':<11} {'with':<9} {'MiB':>5} {'upload':>7} {'read':>7} {'total':>7} "
        f"{'worker':>7} {'idle':>5} {'growth':>7} {'x':>5} {'w cpu':>6} | {'graph':>6} {'peak':>6} "
        f"{'growth':>7} {'x':>5}"
    )
    print(
        f"   {'':>5} {'':<11} {'':<9} {'':>5} {'ms':>7} {'ms':>7} {'ms':>7} {'peak':>7} {'MiB':>5} "
        f"{'MiB':>7} {'size':>5} {'s':>6} | {'before':>6} {'MiB':>6} {'MiB':>7} {'size':>5}"
    )
    rows: list[dict[str, Any]] = []
    for r in runs:
        times = file_times(cfg, r)
        wpeak = worker_peak(r)
        idle = baseline.get(r.kind, 0)
        row = {
            **{k: v for k, v in asdict(r).items() if k != "extras"},
            **times,
            "worker_peak": wpeak,
            "worker_idle_peak": idle,
            "worker_growth": wpeak - idle,
            "worker_growth_x": (wpeak - idle) / r.size if r.size else math.nan,
            "worker_peak_x": wpeak / r.size if r.size else math.nan,
            "graph_growth": r.graph_peak - r.graph_rss_before,
            "graph_growth_x": (r.graph_peak - r.graph_rss_before) / r.size if r.size else math.nan,
            "graph_peak_from": r.extras.get("peak_from", ""),
        }
        rows.append(row)
        print(
            f"   {r.block:>5} {r.name:<11} {'question' if r.question else 'nothing':<9} {r.size / MIB:>5.1f} "
            f"{times['upload_ms']:>7.0f} {times['read_ms']:>7.0f} {times['total_ms']:>7.0f} "
            f"{wpeak / MIB:>7.1f} {idle / MIB:>5.1f} {row['worker_growth'] / MIB:>7.1f} "
            f"{row['worker_growth_x']:>5.2f} {r.worker_cpu_s:>6.2f} | {r.graph_rss_before / MIB:>6.0f} "
            f"{r.graph_peak / MIB:>6.0f} {row['graph_growth'] / MIB:>7.1f} {row['graph_growth_x']:>5.2f}"
            + (f"   ERROR {r.error}" if r.error else ""),
            flush=True,
        )
    print(
        "   (upload: POST to the graph's progress event; read: progress to the reply, with a question "
        f"minus the model's {cfg.ttft_ms:.0f} ms; worker peak: VmHWM of the process that read it, "
        "idle: of one that read a tiny file of the same kind; graph: its RSS before, its VmHWM during)"
    )
    per_kind: dict[str, Any] = {}
    for key in ("pdf", "image"):
        mine = [x for x in rows if x["key"] == key and not x["error"]]
        spec = specs[key]
        cross = [x for x in mine if x["worker_peak_logged"] and x["worker_peak_sampled"]]
        per_kind[key] = {
            "name": spec.name,
            "kind": spec.kind,
            "size": spec.size,
            "sent": len([x for x in rows if x["key"] == key]),
            "errors": len([x for x in rows if x["key"] == key and x["error"]]),
            "upload_ms": summary([x["upload_ms"] for x in mine]),
            "read_ms": summary([x["read_ms"] for x in mine]),
            "read_alone_ms": summary([x["read_ms"] for x in mine if not x["question"]]),
            "total_ms": summary([x["total_ms"] for x in mine]),
            "worker_cpu_s": summary([x["worker_cpu_s"] for x in mine]),
            "worker_peak": max((x["worker_peak"] for x in mine), default=0),
            "worker_idle_peak": baseline.get(spec.kind, 0),
            "worker_growth_x": max((x["worker_growth_x"] for x in mine), default=math.nan),
            "worker_peak_x": max((x["worker_peak_x"] for x in mine), default=math.nan),
            "worker_sampled_vs_logged": min(
                (x["worker_peak_sampled"] / x["worker_peak_logged"] for x in cross), default=math.nan
            ),
            "graph_growth": max((x["graph_growth"] for x in mine), default=0),
            "graph_growth_x": max((x["graph_growth_x"] for x in mine), default=math.nan),
        }
    phases = {ph: phase_figures(cfg, ph, blocks, turns) for ph in ("A", "B")}
    for ph, fig in phases.items():
        spans = [(bl.start, bl.end) for bl in blocks if bl.phase == ph]
        in_phase = [lag for t, lag in lags if any(t0 <= t < t1 for t0, t1 in spans)]
        fig["client_lag_p99_ms"] = summary(in_phase)["p99"]
    a, b = phases["A"], phases["B"]
    print(
        f"\n2) The {cfg.conversations} plain conversations: ms added to the model's own first token "
        f"({cfg.ttft_ms:.0f} ms), turns that started and got their first text inside a block"
    )
    print(
        f"   {'phase':<15} {'blocks':>6} {'s':>6} {'turns':>6} {'err':>4} {'add p50':>8} {'add p99':>8} "
        f"{'add max':>8} {'gap p99':>8} {'gap max':>8} {'graph':>6} {'llm':>5} {'cl':>5}"
    )
    print(
        f"   {'':<15} {'':>6} {'':>6} {'':>6} {'':>4} {'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} {'ms':>8} "
        f"{'cpu':>6} {'lag':>5} {'lag':>5}"
    )
    for label, fig in (("A (no files)", a), ("B (files)", b)):
        s, g = fig["added_first_ms"], fig["max_gap_ms"]
        print(
            f"   {label:<15} {fig['blocks']:>6} {fig['seconds']:>6.0f} {fig['turns']:>6} {fig['errors']:>4} "
            f"{s['p50']:>8.1f} {s['p99']:>8.1f} {s['max']:>8.1f} {g['p99']:>8.1f} {g['max']:>8.1f} "
            f"{100 * fig['graph_cpu_share']:>5.0f}% {fig['llm_first_late_p99_ms']:>5.1f} "
            f"{fig['client_lag_p99_ms']:>5.1f}"
        )
        if fig["error_samples"]:
            print(f"      errors: {fig['error_samples']}")
    print(
        "   (gap: the longest time between two text chunks of one answer, the model sends one every "
        f"{cfg.chunk_ms:.0f} ms and the graph writes at most every 50 ms; graph cpu: its own, not the "
        "workers'; llm lag: how late the stand-in's first chunks were, p99; cl lag: the clients' loop)"
    )
    stages = by_stage(cfg, blocks, turns, runs)
    print("   B turns by what the graph was doing with a file while they waited for their first text:")
    for stage, fig in stages.items():
        print(
            f"      {stage:<8} {fig['turns']:>5} turns  add p50 {fig['p50']:>7.1f}  p99 {fig['p99']:>7.1f}  "
            f"max {fig['max']:>7.1f} ms"
        )
    print(
        "      (upload: POST to progress, the graph receives, parses and validates the body; read: the "
        "worker reads; reply: the worker's answer taken in, the reply written; between: none of these)"
    )
    stalls = find_stalls(cfg, turns, blocks, runs)
    print(
        f"   stalls: moments when at least {max(2, cfg.conversations // 4)} of the {cfg.conversations} "
        f"streams had a gap over {STALL_S * 1000:.0f} ms at once (the graph's event loop was busy)"
    )
    for ph in ("A", "B"):
        seen = [x for x in stalls if x.phase == ph]
        at = Counter(x.stage or "no file" for x in seen)
        longest = max((x.gap_ms for x in seen), default=0.0)
        print(
            f"      {ph}: {len(seen):>3} stalls, longest gap {longest:.0f} ms"
            + (f"; a file was at its {', '.join(f'{k} {v}' for k, v in sorted(at.items()))}" if seen else "")
            + (" (the stage when the streams went on)" if seen else "")
        )
    delta = b["added_first_ms"]["p99"] - a["added_first_ms"]["p99"]
    p99_ok = bool(delta <= P99_DELTA_TARGET_MS) and not a["errors"] and not b["errors"]
    print(
        f"   B - A first-token p99: {delta:+.1f} ms (p50 "
        f"{b['added_first_ms']['p50'] - a['added_first_ms']['p50']:+.1f} ms; longest gap "
        f"{b['max_gap_ms']['max'] - a['max_gap_ms']['max']:+.1f} ms)   "
        f"target <= {P99_DELTA_TARGET_MS:.0f} ms: {'PASS' if p99_ok else 'MISS'}"
    )
    print(
        f"\n3) Memory against the file's size (target: peak RSS grows by at most {RSS_FACTOR_TARGET:.0f}x it)"
    )
    rss_verdicts: dict[str, bool] = {}
    for key, k in per_kind.items():
        wx, gx = k["worker_growth_x"], k["graph_growth_x"]
        rss_verdicts[f"{key}_worker"] = bool(wx <= RSS_FACTOR_TARGET)
        rss_verdicts[f"{key}_graph"] = bool(gx <= RSS_FACTOR_TARGET)
        print(
            f"   {k['name']:<11} {k['size'] / MIB:5.1f} MiB: worker peak {k['worker_peak'] / MIB:.0f} MiB "
            f"= {k['worker_idle_peak'] / MIB:.0f} idle + "
            f"{(k['worker_peak'] - k['worker_idle_peak']) / MIB:.0f} ({wx:.2f}x the file) "
            f"{verdict(wx, RSS_FACTOR_TARGET)}; graph {k['graph_growth'] / MIB:+.0f} MiB "
            f"({gx:.2f}x) {verdict(gx, RSS_FACTOR_TARGET)}; read {k['read_ms']['p50'] / 1000:.2f} s "
            f"(p50 of {k['sent']}), upload {k['upload_ms']['p50']:.0f} ms, worker CPU "
            f"{k['worker_cpu_s']['p50']:.2f} s"
        )
    print(
        f"   graph RSS: {rss_start / MIB:.0f} MiB after the warm-up, {rss_end / MIB:.0f} MiB at the end; "
        "worker peak sampled every 10 ms / logged: "
        + ", ".join(f"{k['name']} {k['worker_sampled_vs_logged']:.2f}" for k in per_kind.values())
    )
    errors = [r for r in warm + runs if r.error]
    if errors:
        print(f"   {len(errors)} files failed: {sorted({r.error for r in errors})[:3]}")
    return {
        "files": rows,
        "warmup_files": [asdict(r) for r in warm],
        "per_file": per_kind,
        "blocks": [asdict(bl) | block_figures(cfg, bl, turns) for bl in blocks],
        "phases": phases,
        "b_turns_by_stage": stages,
        "stalls": [asdict(x) for x in stalls],
        "p99_delta_ms": delta,
        "p99_pass": p99_ok,
        "rss_pass": rss_verdicts,
        "graph_rss_start": rss_start,
        "graph_rss_end": rss_end,
        "turns_recorded": len(turns),
        "clock_zero": blocks[0].start if blocks else math.nan,
        "turns": [astuple(t) for t in turns],
        "turn_fields": [f.name for f in fields(Turn)],
    }


# -------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    p.add_argument("--conversations", type=int, help=f"plain conversations (default {d['conversations']})")
    p.add_argument("--rounds", type=int, help=f"rounds of one A and one B block (default {d['rounds']})")
    p.add_argument("--pdf-mib", type=float, help=f"the PDF's size in MiB (default {d['pdf_mib']:.0f})")
    p.add_argument("--image-mib", type=float, help=f"the image's size in MiB (default {d['image_mib']:.0f})")
    p.add_argument(
        "--image", choices=["jpeg", "png"], default="jpeg", help="the image's format (default jpeg)"
    )
    p.add_argument("--ttft-ms", type=float, help=f"the model's first-token time (default {d['ttft_ms']:.0f})")
    p.add_argument(
        "--chunk-ms", type=float, help=f"ms between the model's chunks (default {d['chunk_ms']:.0f})"
    )
    p.add_argument("--chunks", type=int, help=f"chunks of a text answer (default {d['chunks']})")
    p.add_argument(
        "--max-mib", type=int, default=32, help="the graph's ATTACHMENT_MAX_BYTES in MiB (default 32)"
    )
    p.add_argument("--quick", action="store_true", help="tiny numbers for a smoke test: " + str(QUICK))
    p.add_argument(
        "--worker-nice",
        type=int,
        help="an experiment, not what the graph does: give every reading worker this nice value "
        "(set by the sampler within ~10 ms of the worker's start)",
    )
    p.add_argument("--log-level", default="INFO", help="the service's LOG_LEVEL (default INFO, as deployed)")
    p.add_argument(
        "--json", type=Path, help="results file (default bench/results/attachments-<timestamp>.json)"
    )
    a = p.parse_args(argv)
    base = QUICK if a.quick else DEFAULTS
    val = {k: getattr(a, k) if getattr(a, k) is not None else base[k] for k in DEFAULTS}
    if val["conversations"] < 1 or val["rounds"] < 1 or val["chunks"] < 2:
        p.error("--conversations and --rounds must be at least 1, --chunks at least 2")
    if val["pdf_mib"] <= 0 or val["image_mib"] <= 0 or val["ttft_ms"] < 0 or val["chunk_ms"] < 0:
        p.error("sizes must be positive, times not negative")
    return Config(
        conversations=val["conversations"],
        rounds=val["rounds"],
        pdf_mib=val["pdf_mib"],
        image_mib=val["image_mib"],
        ttft_ms=val["ttft_ms"],
        chunk_ms=val["chunk_ms"],
        chunks=val["chunks"],
        image_format=a.image,
        max_mib=a.max_mib,
        quick=a.quick,
        log_level=a.log_level,
        json_path=a.json or default_results_path("attachments"),
        worker_nice=a.worker_nice,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    return run_main(lambda: run(cfg), cfg.json_path)


if __name__ == "__main__":
    sys.exit(main())
