"""The real graph service as a subprocess (`vagent-graph`), so tests cross real HTTP and
can kill and restart it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

from procutil import free_port

from tests.support.procs import ServiceProcess

TOKEN = "test-service-token-7f3a"


class GraphProcess(ServiceProcess):
    """`vagent-graph` on a free loopback port with the test token, its own records DB and,
    given `llm_base_url`, that OpenAI-compatible LLM (else the offline model).

    `env` is the service's complete environment (OPENAI_* and LLM_MODEL of this process are
    left out so a developer's real key is never used); tests may edit it before start().
    """

    def __init__(
        self, redis_url: str, data_dir: Path, llm_base_url: str | None = None, **extra_env: str
    ) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        env = {
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
            env.pop(k, None)
        if llm_base_url:
            env.update(OPENAI_BASE_URL=llm_base_url, OPENAI_API_KEY="test-key", LLM_MODEL="test-model")
        super().__init__(
            "vagent-graph",
            env,
            data_dir / f"graph-{self.port}.log",
            f"{self.url}/health",
            healthy=lambda r: r.status_code in (200, 503),  # 503: up, but Redis is not (yet)
            inherit_env=False,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def start(self, timeout: float = 90) -> Self:
        """As ServiceProcess.start, with room for a start on a busy 2-core machine (~30 s seen)."""
        return super().start(timeout)
