"""What both benchmarks share: the LLM stand-in, statistics, starting and stopping services
together, the split placement, the report header, the results file and the Ctrl-C/SIGTERM
handling.

Why one module: bench_graph.py and bench_bot.py must measure, describe the machine and
behave on Ctrl-C the same way, or their numbers and their runs could not be compared.
Import it as `bench.common` once the repository root is on sys.path (each benchmark puts it
there first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib import metadata
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from tests.support.llm_server import JSON, PlannedResponse, ScriptedLLMServer, TextResponse, split_text

ROOT = Path(__file__).resolve().parent.parent
#: 20 words; the stand-in streams it in exactly CHUNKS pieces (checked when it starts).
ANSWER = (
    "The records database holds twelve customers and thirty orders; "
    "the largest order was placed on Tuesday by Ada in York."
)
CHUNKS = 20
QUESTION = "What is in the records database?"
#: Set on Ctrl-C; errors after it are consequences of Ctrl-C, not failures.
INTERRUPTED = threading.Event()


class BenchError(RuntimeError):
    """Something did not answer the way it should; the numbers would be wrong."""


# ---------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), so p99 of a few hundred samples is
    stable. NaNs (a step that could not be placed) are left out."""
    s = sorted(v for v in values if not math.isnan(v))
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50/p99/mean/min/max of milliseconds, as printed and stored (all NaN without values)."""
    xs = [v for v in values if not math.isnan(v)]
    if not xs:
        return {k: math.nan for k in ("p50", "p99", "mean", "min", "max")}
    return {
        "p50": percentile(xs, 0.50),
        "p99": percentile(xs, 0.99),
        "mean": sum(xs) / len(xs),
        "min": min(xs),
        "max": max(xs),
    }


# --------------------------------------------------------------------- the LLM stand-in


def answer_responder(request: JSON) -> PlannedResponse:
    """Every chat completion gets the same 20-chunk text answer (no tool calls, no delay)."""
    return TextResponse(ANSWER, chunks=CHUNKS)


def disable_nagle(server: ScriptedLLMServer) -> bool:
    """Set TCP_NODELAY on the stand-in's listening socket; accepted sockets inherit it (Linux).

    Why: older ScriptedLLMServers bound ``socket.socket(AF_INET, SOCK_STREAM)`` (proto 0), so
    asyncio did not set TCP_NODELAY on accepted connections. On a keep-alive connection the
    response body then waits for the client's delayed ACK of the header segment: ~40 ms per
    LLM call, an artefact a real LLM API does not have, which would pad the measured side
    and hide the overhead being measured. Reaches into the private uvicorn server; returns
    False if that ever changes.
    """
    uv = getattr(server, "_server", None)
    done = False
    for srv in getattr(uv, "servers", None) or []:
        for sock in srv.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            done = True
    return done


def _child_main(target: Callable[[Connection], None], conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent tears us down on Ctrl-C
    target(conn)


def fork_child(target: Callable[[Connection], None], name: str) -> tuple[Connection, BaseProcess]:
    """Start `target(conn)` in a forked child (enter before any thread exists: spawn would
    re-import everything); the parent talks to it through the returned end of a pipe."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    sys.stdout.flush()
    proc = ctx.Process(target=_child_main, args=(target, child), name=name, daemon=True)
    proc.start()
    child.close()
    return parent, proc


def stop_child(conn: Connection, proc: BaseProcess, goodbye: object, timeout: float) -> None:
    """Say `goodbye`, then wait `timeout` seconds before terminating the child."""
    with contextlib.suppress(OSError):
        conn.send(goodbye)
    conn.close()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)


class Service(Protocol):
    """A child service that `start(timeout)`s, returning once healthy, and `stop()`s
    (tests.support.procs.ServiceProcess and its kin)."""

    def start(self, timeout: float = ...) -> Any: ...

    def stop(self) -> Any: ...


def start_together(services: Sequence[Service], timeout: float = 60) -> None:
    """Start `services` at once and return when every one is healthy: their start-ups (mostly
    imports) overlap instead of adding up. Every start has returned before this does, also
    on an error or Ctrl-C, so none is left starting behind the caller's clean-up; then the
    first failure is raised. Services that share a Redis must not create its indexes at the
    same moment: start the first one alone."""
    pool = ThreadPoolExecutor(max_workers=max(1, len(services)))
    try:
        futures = [pool.submit(s.start, timeout) for s in services]
        for f in futures:
            f.result()
    finally:
        pool.shutdown(wait=True)


def stop_together(services: Sequence[Service]) -> None:
    """Stop `services` at once (each: SIGTERM, wait, SIGKILL if it must): the shutdowns
    overlap. Every stop is tried; the first failure is raised after."""
    with ThreadPoolExecutor(max_workers=max(1, len(services))) as pool:
        futures = [pool.submit(s.stop) for s in services]
    for f in futures:
        f.result()


def _serve_llm(conn: Connection) -> None:
    """Child process: run the stand-in until the parent says stop or goes away (EOF)."""
    server = ScriptedLLMServer(keep_alive=True).start()
    try:
        server.set_default(answer_responder)
        conn.send((server.port, disable_nagle(server)))
        with contextlib.suppress(EOFError, OSError):
            conn.recv()
    finally:
        server.stop()


@contextlib.contextmanager
def llm_standin(in_thread: bool = False) -> Iterator[tuple[str, bool]]:
    """The stand-in's base URL and whether TCP_NODELAY could be set.

    A separate process by default, so it never competes for the GIL with the code being
    timed; it forks, so enter this before any thread exists. `in_thread` runs it in this
    process instead.
    """
    if len(split_text(ANSWER, CHUNKS)) != CHUNKS:
        raise BenchError(f"ANSWER does not split into exactly {CHUNKS} chunks")
    if in_thread:
        with ScriptedLLMServer(keep_alive=True) as server:
            server.set_default(answer_responder)
            yield server.base_url, disable_nagle(server)
        return
    parent, proc = fork_child(_serve_llm, "llm-standin")
    try:
        try:
            if not parent.poll(15):
                raise BenchError("the LLM stand-in did not start within 15 s")
            port, nodelay = parent.recv()
        except EOFError:
            raise BenchError(f"the LLM stand-in exited (code {proc.exitcode})") from None
        yield f"http://127.0.0.1:{int(port)}/v1", bool(nodelay)
    finally:
        stop_child(parent, proc, "stop", 5)


# ---------------------------------------------------------------------------- placement


class HasProc(Protocol):
    """A started child service: its `subprocess.Popen` (None once stopped)."""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None: ...


def child_pids() -> list[int]:
    """PIDs of this process's children (Linux /proc)."""
    me, out = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    out.append(int(entry.name))
    return out


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid`; a process that is gone meanwhile is skipped."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cpus)


def place_processes(placement: str, services: Sequence[HasProc]) -> str:
    """With "split", pin the measured code to the first usable CPU: this thread (which
    runs BARE, and so every thread it starts from now on) and the services. The load and
    the fixtures (the client, the LLM stand-in, Redis) go to the others. Both modes are
    placed alike. Left to the kernel, the placement changes from run to run, and a mode
    that happens to share a core with the stand-in loses its caches: the c=1 ratio then
    spreads about three times wider (bench/README.md)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if placement == "kernel" or len(cpus) < 2:
        return "left to the kernel" + ("" if placement == "kernel" else " (fewer than 2 usable CPUs)")
    measured, rest = {cpus[0]}, set(cpus[1:])
    service_pids = {s.proc.pid for s in services if s.proc is not None}
    try:
        os.sched_setaffinity(0, measured)
    except OSError as exc:  # e.g. a container that forbids it
        return f"left to the kernel (pinning refused: {exc})"
    for pid in child_pids():
        pin_threads(pid, measured if pid in service_pids else rest)
    return (
        f"split: bare (this process) and the service on CPU {cpus[0]}; "
        f"client, LLM stand-in and Redis on CPU {','.join(map(str, cpus[1:]))}"
    )


# ------------------------------------------------------------------------------ report


def machine_info(dists: Sequence[str]) -> dict[str, Any]:
    """What the numbers depend on: cores, CPU, Python, and the versions of `dists`."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for dist in dists:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else [],
        "versions": versions,
    }


def print_machine(title: str, info: dict[str, Any], started: datetime) -> None:
    """The header's first lines, the machine; printed first so a pasted result explains itself."""
    print(f"{title} - {started:%Y-%m-%d %H:%M:%S} UTC")
    cpu = info["cpu"] or "unknown CPU"
    print(f"   machine : {info['cores']} cores ({info['usable_cores']} usable), {cpu}")
    print(f"   system  : {info['platform']}, load {', '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}")
    print(f"   python  : {info['python']}")
    print("   versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))


def verdict(ratio: float, target: float) -> str:
    """PASS/MISS label; informational only, never the exit code."""
    return "PASS" if ratio <= target else "MISS"


def print_log_tail(name: str, text: str, lines: int) -> None:
    """The end of a service's log after a failed run: usually where the reason is."""
    print(f"\n--- last lines of the {name} log ---\n" + "\n".join(text.splitlines()[-lines:]))


def make_results(
    started: datetime, info: dict[str, Any], conf: dict[str, Any], **figures: Any
) -> dict[str, Any]:
    """The results file's content: the same head in every benchmark (schema, start, duration,
    machine, configuration), then that benchmark's figures."""
    return {
        "schema": 1,
        "started": started.isoformat(),
        "seconds": (datetime.now(UTC) - started).total_seconds(),
        "machine": info,
        "config": conf,
        **figures,
    }


def finite(value: Any) -> Any:
    """NaN -> None, recursively: the results file stays strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


# -------------------------------------------------------------------------------- main


def resolve_counts(
    args: argparse.Namespace, defaults: dict[str, int], quick: dict[str, int]
) -> dict[str, int]:
    """The numeric options named by the keys of `defaults`: explicit flag > --quick > default."""
    base = quick if args.quick else defaults
    return {k: getattr(args, k) if getattr(args, k) is not None else base[k] for k in defaults}


def default_results_path(kind: str) -> Path:
    """bench/results/<kind>-<UTC timestamp>.json: where a run's results go unless --json says."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return ROOT / "bench" / "results" / f"{kind}-{stamp}.json"


def cancel_on_sigint() -> None:
    """Inside the event loop, Ctrl-C cancels the calling task: that unwinds every request and
    client cleanly, unlike a KeyboardInterrupt raised in the middle of an await."""
    main_task = asyncio.current_task()

    def interrupt() -> None:
        INTERRUPTED.set()
        if main_task is not None:
            main_task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupt)


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM -> SystemExit so every `finally` and the ExitStack still tear down."""
    raise SystemExit(128 + signum)


def _on_sigint(_signum: int, _frame: FrameType | None) -> None:
    """Ctrl-C outside the event loop (inside it, cancel_on_sigint cancels the task instead).
    It reaches the services too (same process group), so a request or a wait may fail
    first: remember it was Ctrl-C."""
    INTERRUPTED.set()
    raise KeyboardInterrupt


def run_main(run: Callable[[], dict[str, Any]], json_path: Path) -> int:
    """Run a benchmark and write its results file: exit 0 after a complete run, MISS or not;
    130 on Ctrl-C, 1 when a run fails."""
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGINT, _on_sigint)  # asyncio.run keeps a handler that is not the default
    try:
        results = run()
    except BaseException as exc:
        if INTERRUPTED.is_set() or isinstance(exc, KeyboardInterrupt):
            print("\ninterrupted; everything started was stopped", file=sys.stderr)
            return 130
        if isinstance(exc, BenchError):
            print(f"\nbenchmark failed: {exc}", file=sys.stderr)
            return 1
        raise
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(finite(results), indent=2, allow_nan=False) + "\n")
    print(f"\nresults: {json_path}  ({results['seconds']:.0f} s)")
    return 0
