"""Run the project's console commands as subprocesses for end-to-end tests.

A real process per service, real ports on 127.0.0.1, logs to a file the test can read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
from procutil import read_log, stop_process, wait_until

from redis_local import free_port

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


class ServiceProcess:
    """One console command of the venv (`vagent-bot`, `vagent-acp`, ...) with its env and log.

    `env` is added to this process's environment; with `inherit_env=False` it is the whole
    environment, for callers that must leave variables out (GraphProcess drops OPENAI_*).
    """

    def __init__(
        self,
        command: str,
        env: dict[str, str],
        log_path: Path,
        health_url: str,
        healthy: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
        *,
        inherit_env: bool = True,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.command, self.env, self.log_path = command, env, log_path
        self.health_url, self.healthy = health_url, healthy
        self.inherit_env = inherit_env
        #: The command line, when it is not the venv's console script `command` alone.
        self.argv = list(argv) if argv is not None else [str(BIN / command)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Self:
        """Start and wait until the health URL says healthy; RuntimeError with the log if it exits."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.inherit_env else dict(self.env)
        self.proc = proc = subprocess.Popen(
            self.argv, env=env, stdout=log, stderr=subprocess.STDOUT
        )

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.command} exited {proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                return self.healthy(httpx.get(self.health_url, timeout=2))
            except httpx.HTTPError:
                return False

        if wait_until(healthy, timeout):
            return self
        self.stop()
        raise TimeoutError(f"{self.command} did not become healthy:\n{self.logs()[-3000:]}")

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM and wait: the graceful path."""
        code = stop_process(self.proc, timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash, nothing is cleaned up."""
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> Self:
        """Stop gracefully and start again, on the same port and log file."""
        self.stop()
        return self.start()

    def logs(self) -> str:
        return read_log(self.log_path)

    def log_records(self) -> list[dict[str, Any]]:
        """The service's JSON log lines, parsed (anything else it printed is skipped)."""
        return [json.loads(ln) for ln in self.logs().splitlines() if ln.startswith("{")]

    @property
    def base_url(self) -> str:
        """Where the service answers: its health URL without `/health`."""
        return self.health_url.removesuffix("/health")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


#: The dev Credential Registry's policy (`make run`'s demo users and their keys).
DEV_CREDENTIALS_POLICY = ROOT / "deploy" / "dev" / "credentials.yaml"


def credential_registry(
    tmp: Path, policy: Path = DEV_CREDENTIALS_POLICY, log_name: str = "credentials.log", **env: str
) -> ServiceProcess:
    """The dev Credential Registry (`vagent-credentials`) on a free port, serving `policy`."""
    port = free_port()
    return ServiceProcess(
        "vagent-credentials",
        {"CREDENTIALS_PORT": str(port), "CREDENTIALS_POLICY_FILE": str(policy), **env},
        tmp / log_name,
        f"http://127.0.0.1:{port}/health",
    )


def ticket_service(tmp: Path, seed: Path, db_name: str = "t.db") -> ServiceProcess:
    """The demo ticket service (`vagent-tickets`) on a free port, seeded from `seed`."""
    port = free_port()
    return ServiceProcess(
        "vagent-tickets",
        {"TICKETS_PORT": str(port), "TICKETS_SEED_FILE": str(seed), "TICKETS_DB_PATH": str(tmp / db_name)},
        tmp / "tickets.log",
        f"http://127.0.0.1:{port}/health",
    )


def run_bench_quick(script: str, json_path: Path, timeout: float, *args: str) -> tuple[str, dict[str, Any]]:
    """Run `bench/<script> --quick --json <json_path> [args]` as `make` would; its stdout and
    results.

    Why here: both benchmark smoke tests need the same run and the same exit-code check, with
    the output in the failure message because the benchmark starts many services.
    """
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", "--json", str(json_path), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results: dict[str, Any] = json.loads(json_path.read_text())
    return proc.stdout, results
