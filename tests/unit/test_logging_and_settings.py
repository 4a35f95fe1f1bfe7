"""Secrets never reach a log line; the service refuses to start open."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from vagent_graph.app import InsecureConfigError, check_security
from vagent_shared.logs import configure_logging
from vagent_shared.settings import GraphSettings


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; later tests must not write to a closed capture."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


def test_secrets_are_scrubbed_from_json_logs(
    capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    configure_logging("INFO", service="test")
    log = structlog.get_logger("t")
    log.info(
        "calling",
        api_key="sk-live-123",
        headers={"Authorization": "Bearer abc.def"},
        note="sent Bearer xyz123 upstream",
        password="hunter2",
        user="alice",
    )
    logging.getLogger("uvicorn.error").warning("stdlib Bearer qqq999 line")
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    text = json.dumps(lines)
    for secret in ("sk-live-123", "abc.def", "xyz123", "hunter2", "qqq999"):
        assert secret not in text
    assert lines[0]["user"] == "alice" and lines[0]["service"] == "test"


def test_refuses_to_start_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPH_API_TOKEN", raising=False)
    with pytest.raises(InsecureConfigError, match="GRAPH_API_TOKEN"):
        check_security(GraphSettings(GRAPH_INSECURE_DEV=False))
    check_security(GraphSettings(GRAPH_INSECURE_DEV=True))
    check_security(GraphSettings(GRAPH_API_TOKEN="t"))  # type: ignore[arg-type]


def test_settings_come_from_the_documented_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PORT", "9123")
    monkeypatch.setenv("MAX_MESSAGE_CHARS", "42")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    s = GraphSettings()
    assert s.HTTP_PORT == 9123 and s.MAX_MESSAGE_CHARS == 42
    assert "sk-x" not in repr(s)
    assert GraphSettings.model_fields["HTTP_PORT"].default == 8000


def test_the_service_collects_garbage_less_often_and_never_scans_its_startup_objects() -> None:
    """tune_gc runs in the service once it has started; run it in a fresh interpreter so
    this test process keeps CPython's defaults."""
    import subprocess
    import sys

    code = (
        "import gc; from vagent_graph.app import GC_THRESHOLDS, tune_gc; "
        "before = gc.get_freeze_count(); tune_gc(); "
        "print(before, gc.get_freeze_count(), gc.get_threshold() == GC_THRESHOLDS, GC_THRESHOLDS[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, frozen, applied, gen0 = out.split()
    assert int(before) == 0 and int(frozen) > 10_000  # modules, schemas...: out of every scan
    assert applied == "True" and int(gen0) > 700  # less often than CPython's default
