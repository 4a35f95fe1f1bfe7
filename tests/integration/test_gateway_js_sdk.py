"""The gateway from LangGraph's JavaScript SDK (`@langchain/langgraph-sdk` from npm, in node):
one round trip as a web client makes it (tests/js/roundtrip.mjs), and another person's token
on that thread gets the SDK's 404.

Real parts as in test_gateway_api.py: Redis, the graph process on the scripted LLM, the demo
AccessControlProvider, the gateway process, a whoami stand-in homeserver.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway_process import GatewayProcess, gateway_stack
from tests.support.llm_server import ScriptedLLMServer
from tests.support.procs import ROOT

JS = ROOT / "tests" / "js"
ALICE, BOB = "@alice:localhost", "@bob:localhost"
TOKENS = {f"syt_{name}_{secrets.token_urlsafe(24)}": user for name, user in (("a", ALICE), ("b", BOB))}
ALICE_TOKEN, BOB_TOKEN = list(TOKENS)
AGENT = "vagent"
#: The oldest node the SDK runs on (Debian 12's own nodejs is 18).
MIN_NODE = 18


def install_node() -> None:
    """node and npm on PATH: installed with apt-get when missing and we may (root, as
    scripts/bootstrap.sh does for python3-venv), else the test fails saying what to install."""
    if shutil.which("node") and shutil.which("npm"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nodejs", "npm"], check=True, env=env, timeout=600)
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.fail(
            "node and npm are needed for the JavaScript SDK test: install them (apt-get install nodejs npm)"
        )


def npm_ci() -> None:
    """`npm ci` into tests/js/node_modules, once per lock file (its hash is kept next to the
    modules); a file lock keeps two test processes from installing at the same time."""
    lock_hash = hashlib.sha256((JS / "package-lock.json").read_bytes()).hexdigest()
    marker = JS / "node_modules" / ".vagent-lock-sha256"
    with open(Path(tempfile.gettempdir()) / "vagent-tests-js-npm-ci.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if marker.exists() and marker.read_text() == lock_hash:
            return
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            pytest.fail(f"npm ci in tests/js failed (is the npm registry reachable?):\n{done.stderr[-3000:]}")
        marker.write_text(lock_hash)


@pytest.fixture(scope="module")
def node() -> str:
    install_node()
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < MIN_NODE:
        pytest.fail(
            f"node {version.strip()} is too old for @langchain/langgraph-sdk: install node {MIN_NODE}+"
        )
    npm_ci()
    found = shutil.which("node")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def gateway(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("gw-js")
    with gateway_stack(redis_url, _llm_session.base_url, tmp, dict(TOKENS)) as gw:
        yield gw
    for token in TOKENS:
        assert token not in gw.logs()


def roundtrip(
    node: str, gateway: GatewayProcess, token: str, question: str, **env: str
) -> list[dict[str, Any]]:
    """tests/js/roundtrip.mjs's JSON lines. The token goes in the environment, not the command
    line (which any local user can read)."""
    done = subprocess.run(
        [node, "roundtrip.mjs"],
        cwd=JS,
        env={
            "PATH": os.environ.get("PATH", ""),
            "GATEWAY_URL": gateway.url,
            "GATEWAY_TOKEN": token,
            "ASSISTANT_ID": AGENT,
            "QUESTION": question,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=90,
    )
    lines = [json.loads(ln) for ln in done.stdout.splitlines() if ln.strip()]
    assert done.returncode == (1 if lines and lines[-1]["kind"] == "error" else 0), done.stderr[-3000:]
    return lines


def test_the_lock_file_records_no_download_urls() -> None:
    """The repository's rule for every lock: packages by name, version and integrity only."""
    text = (JS / "package-lock.json").read_text()
    assert "://" not in text and '"resolved"' not in text
    lock = json.loads(text)
    sdk = lock["packages"]["node_modules/@langchain/langgraph-sdk"]
    assert (
        sdk["version"]
        == json.loads((JS / "package.json").read_text())["dependencies"]["@langchain/langgraph-sdk"]
    )
    assert all(p.get("integrity", "").startswith("sha512-") for k, p in lock["packages"].items() if k)


def test_a_round_trip_from_the_javascript_sdk(
    node: str, gateway: GatewayProcess, llm_server: ScriptedLLMServer
) -> None:
    answer = "Lisbon is the capital of Portugal"
    llm_server.push_text(answer, delay=0.06)  # ~0.3 s: several STREAM_COALESCE_MS windows
    lines = roundtrip(node, gateway, ALICE_TOKEN, "What is the capital of Portugal?")
    assert lines[0]["kind"] == "thread" and lines[-1] == {"kind": "done"}, lines[-1]
    events = [(ln["event"], ln["data"]) for ln in lines if ln["kind"] == "event"]
    assert events[0][0] == "metadata"
    chunks = [data for event, data in events if event == "messages"]
    assert len(chunks) >= 3  # the answer grew chunk by chunk
    assert "".join(message["content"] for message, _ in chunks) == answer
    assert all(meta["thread_id"] == lines[0]["thread_id"] for _, meta in chunks)
    final = [data for event, data in events if event == "values"][-1]
    assert [(m["type"], m["content"]) for m in final["messages"]] == [
        ("human", "What is the capital of Portugal?"),
        ("ai", answer),
    ]

    # the same thread, another person's token: the SDK's 404, and nothing reached the LLM
    asked = len(llm_server.requests)
    other = roundtrip(node, gateway, BOB_TOKEN, "What did alice ask?", THREAD_ID=lines[0]["thread_id"])
    assert other[-1]["kind"] == "error" and other[-1]["status"] == 404, other
    assert len(llm_server.requests) == asked
    assert ALICE_TOKEN not in json.dumps(lines) and BOB_TOKEN not in json.dumps(other)
