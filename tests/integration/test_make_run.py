"""`make run` starts the product on embedded defaults, and the README's curl example works
as written (only the port is changed, as tests never bind 8000)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from redis_local import free_port
from vagent_shared.settings import GraphSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def curl_blocks() -> list[str]:
    section = README.split("<!-- curl-example:start -->")[1].split("<!-- curl-example:end -->")[0]
    return [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if b.startswith("curl")]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_readme_documents_every_graph_setting() -> None:
    for name in GraphSettings.model_fields:
        assert f"| `{name}` |" in README, f"{name} is not documented in README.md"


def test_make_run_and_the_readme_curl_conversation(tmp_path: Path) -> None:
    http_port, redis_port = free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "LLM_MODEL", "GRAPH_API_TOKEN"}
    }
    env.update(HTTP_PORT=str(http_port), REDIS_PORT=str(redis_port), VAGENT_DATA_DIR=str(tmp_path))
    proc = subprocess.Popen(
        ["make", "-s", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out = ""
        deadline = time.monotonic() + 120
        while "Ctrl-C stops everything" not in out:
            assert proc.poll() is None and time.monotonic() < deadline, out
            line = proc.stdout.readline()  # type: ignore[union-attr]
            out += line
        assert "offline model" in out and "dev-token-change-me" in out
        assert httpx.get(f"http://127.0.0.1:{http_port}/health").json()["status"] == "healthy"

        first, second = curl_blocks()

        def run(cmd: str) -> str:
            return subprocess.run(
                ["bash", "-c", cmd.replace("localhost:8000", f"127.0.0.1:{http_port}")],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout

        asked = run(first)
        assert "event: hitl_request" in asked and asked.rstrip().endswith("data: {}")
        match = re.search(r"Delete (\d+) records older than 2020-01-01\?", asked)
        assert match and int(match.group(1)) > 0
        answered = run(second)
        assert "event: progress" in answered and "event: text_chunk" in answered
        assert f"Deleted {match.group(1)} records older than 2020-01-01." in answered
        assert answered.rstrip().endswith("event: done\ndata: {}") or "event: done" in answered
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("make run did not stop on Ctrl-C")
    deadline = time.monotonic() + 10
    while (port_open(http_port) or port_open(redis_port)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not port_open(http_port) and not port_open(redis_port), "Ctrl-C left something running"
