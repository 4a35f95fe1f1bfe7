"""The real graph service as a subprocess (`vagent-graph`), so tests cross real HTTP and
can kill and restart it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx

TOKEN = "test-service-token-7f3a"
BIN = Path(sys.executable).parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GraphProcess:
    def __init__(
        self, redis_url: str, data_dir: Path, llm_base_url: str | None = None, **extra_env: str
    ) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.log_path = data_dir / f"graph-{self.port}.log"
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "HTTP_HOST": "127.0.0.1",
            "HTTP_PORT": str(self.port),
            "GRAPH_API_TOKEN": TOKEN,
            "RECORDS_DB_PATH": str(data_dir / "records.db"),
            "LOG_LEVEL": "DEBUG",
            **extra_env,
        }
        for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "LLM_MODEL"):
            self.env.pop(k, None)
        if llm_base_url:
            self.env.update(OPENAI_BASE_URL=llm_base_url, OPENAI_API_KEY="test-key", LLM_MODEL="test-model")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def start(self, timeout: float = 30) -> GraphProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(BIN / "vagent-graph")], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vagent-graph exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code in (200, 503):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"vagent-graph did not start:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: nothing gets a chance to clean up, as in a crash."""
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> GraphProcess:
        self.stop()
        return self.start()

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> GraphProcess:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        self.stop()
