"""Run the project's console commands as subprocesses for end-to-end tests.

A real process per service, real ports on 127.0.0.1, logs to a file the test can read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


class ServiceProcess:
    def __init__(
        self,
        command: str,
        env: dict[str, str],
        log_path: Path,
        health_url: str,
        healthy: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
    ) -> None:
        self.command, self.env, self.log_path = command, env, log_path
        self.health_url, self.healthy = health_url, healthy
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> ServiceProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(BIN / self.command)], env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.command} exited {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                if self.healthy(httpx.get(self.health_url, timeout=2)):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.command} did not become healthy:\n{self.logs()[-3000:]}")

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM and wait: the graceful path."""
        code = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, nothing is cleaned up."""
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
