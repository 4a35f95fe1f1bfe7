"""Session-wide real parts: a Redis 8 with search + JSON, a scripted OpenAI-compatible LLM and a
local Synapse homeserver.

All bind 127.0.0.1 on free ports (never 6379/8000/8008).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from redis_local import RedisServer, free_port  # noqa: E402
from synapse_local import SynapseServer  # noqa: E402
from tests.support.llm_server import ScriptedLLMServer  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="module")
def module_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of the module's own. For the modules that build and drop many FalkorDB graphs:
    the module crashed the server once (SIGSEGV in Globals_RemoveGraphByName on a DEL, under
    heavy load, not reproduced since); on its own server a crash fails that module, not the
    hundreds of tests that share the session's."""
    server = RedisServer(free_port(), tmp_path_factory.mktemp("module-redis")).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def _llm_session() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def llm_server(_llm_session: ScriptedLLMServer) -> Iterator[ScriptedLLMServer]:
    """The shared scripted LLM, emptied before and after each test."""
    _llm_session.clear()
    yield _llm_session
    _llm_session.clear()


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    """One Synapse for the session (sqlite, rate limits off); tests register unique users."""
    server = SynapseServer(free_port(), tmp_path_factory.mktemp("synapse"), for_tests=True).start()
    yield server
    server.stop()


@pytest.fixture
def json_logs() -> Iterator[Callable[[], None]]:
    """Call it to log as a service does (JSON lines on stdout, captured by `capsys`: call it in
    the test's body, where capsys' stdout is in place); put back after the test. Loggers are
    not cached on first use meanwhile: a module first logging during the test would keep its
    processors for good, and a later test's `capture_logs` would never see its lines."""
    from vagent_shared.logs import configure_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved: dict[str, Any] = structlog.get_config()

    def log_json() -> None:
        configure_logging("DEBUG", service="test")
        structlog.configure(cache_logger_on_first_use=False)

    try:
        yield log_json
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**saved)


@pytest.fixture(autouse=True)
def _logging_put_back() -> Iterator[None]:
    """Whatever a test does to process-wide logging (a command or a service configured in this
    process: root handlers on a captured stream, structlog loggers cached on first use) ends
    with it: a later test's `capture_logs` must see its lines, and nothing may write to a
    capture since closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved: dict[str, Any] = structlog.get_config()
    yield
    if root.handlers != handlers or root.level != level:
        root.handlers[:] = handlers
        root.setLevel(level)
    if structlog.get_config() != saved:
        structlog.configure(**saved)


@pytest.fixture(autouse=True)
async def _model_clients_closed(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """The model clients a test makes (make_chat_model outside the service's resources, which
    close theirs) are closed after it: aiohttp reports a session collected unclosed to the
    event loop, where a later test watching the loop's errors would find it."""
    from vagent_graph.models import read_pacing

    made: list[Any] = []
    real = read_pacing.model_http_client

    def tracked(**kwargs: Any) -> Any:
        made.append(real(**kwargs))
        return made[-1]

    monkeypatch.setattr(read_pacing, "model_http_client", tracked)
    yield
    for client in made:
        if not client.is_closed:
            await client.aclose()
