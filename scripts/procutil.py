"""Child-process helpers shared by the local-service scripts, the test harness and the benchmarks.

Why one module: every launcher (Redis, Synapse, the vagent services, the echo bot) stops its
child and waits for it to come up the same way; one copy keeps them behaving alike.
Import it as the top-level module `procutil` (scripts/ is on sys.path wherever these run).
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float) -> int | None:
    """SIGTERM, wait up to `timeout` s, then SIGKILL; the exit code of a graceful stop.

    Why None otherwise: when the process had already exited (or there was none) or had to be
    killed, a caller checking for a clean shutdown must not mistake that for one.
    """
    if proc is None or proc.poll() is not None:
        return None
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def read_log(path: Path) -> str:
    """A child's log file so far; empty before the child has written one (not an error)."""
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def wait_until(ready: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `ready` every `interval` s: True once it is, False after `timeout` s.

    Why a plain predicate: each caller has its own readiness check and its own error for a
    child that died while starting; `ready` raises that error itself to stop the wait early.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(interval)
    return False
