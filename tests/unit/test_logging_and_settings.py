"""Secrets never reach a log line, and only secrets are hidden; the service refuses to start open."""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Iterator

import pytest
import structlog
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from vagent_dev import settings as dev_settings
from vagent_graph.http.app import InsecureConfigError, check_security
from vagent_shared.logs import REDACTED, configure_logging, secret_key
from vagent_shared.settings import BotSettings, GraphSettings


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
        "import gc; from vagent_graph.http.app import GC_THRESHOLDS, tune_gc; "
        "before = gc.get_freeze_count(); tune_gc(); "
        "print(before, gc.get_freeze_count(), gc.get_threshold() == GC_THRESHOLDS, GC_THRESHOLDS[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    before, frozen, applied, gen0 = out.split()
    assert int(before) == 0 and int(frozen) > 10_000  # modules, schemas...: out of every scan
    assert applied == "True" and int(gen0) > 700  # less often than CPython's default


def every_setting() -> dict[str, bool]:
    """Each setting of the graph, the bot and the dev services: is it a secret (SecretStr)?"""
    classes: list[type[BaseSettings]] = [GraphSettings, BotSettings]
    classes += [c for c in vars(dev_settings).values() if isinstance(c, type) and issubclass(c, BaseSettings)]
    found: dict[str, bool] = {}
    for cls in classes:
        for name, field in cls.model_fields.items():
            found[name] = field.annotation is SecretStr or SecretStr in typing.get_args(field.annotation)
    return found


def logged(capsys: pytest.CaptureFixture[str], **fields: object) -> dict[str, object]:
    configure_logging("INFO", service="test")
    structlog.get_logger("t").info("settings", **fields)
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    return dict(line)


def test_exactly_the_secret_settings_are_masked_in_logs(
    capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    settings = every_setting()
    secrets = {name for name, secret in settings.items() if secret}
    assert {"GRAPH_API_TOKEN", "MATRIX_PASSWORD", "OPENAI_API_KEY", "CREDENTIAL_CACHE_KEY"} <= secrets
    for names in (list(settings), [n.lower() for n in settings]):
        line = logged(capsys, **{name: "plain-value" for name in names})
        masked = {name.upper() for name in names if line[name] == REDACTED}
        assert masked == secrets
        shown = {name.upper() for name in names if line[name] == "plain-value"}
        assert shown == set(settings) - secrets  # e.g. ATTACHMENT_MAX_TOKENS, CREDENTIAL_REGISTRY_URL


def test_counts_and_flags_named_after_tokens_stay_readable(
    capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    line = logged(
        capsys,
        token_required=True,
        default_user_daily_tokens=200000,
        input_tokens=12,
        output_tokens=3,
        max_tokens=512,
        tokens_used=15,
        tokens=15,
        secret_name="GRAPH_API_TOKEN",
        key="vagent:session:abc",
        auth_header_present=True,
    )
    assert line["token_required"] is True and line["default_user_daily_tokens"] == 200000
    assert line["input_tokens"] == 12 and line["output_tokens"] == 3 and line["max_tokens"] == 512
    assert line["tokens_used"] == 15 and line["tokens"] == 15
    assert line["secret_name"] == "GRAPH_API_TOKEN" and line["key"] == "vagent:session:abc"
    assert line["auth_header_present"] is True


@pytest.mark.parametrize(
    "name",
    [
        "token",
        "api_token",
        "x-api-key",
        "X-Auth-Token",
        "GRAPH_API_TOKEN",
        "access_token",
        "refresh_token",
        "accessToken",
        "apiKey",
        "APIKey",
        "Authorization",
        "Proxy-Authorization",
        "password",
        "password_hash",
        "client_secret",
        "secret",
        "Cookie",
        "set-cookie",
        "credential",
        "credentials",
        "private_key",
        "session_key",
        "aws_access_key",
        "secret_key",
    ],
)
def test_secret_names_are_masked(name: str) -> None:
    assert secret_key(name)


@pytest.mark.parametrize(
    "name",
    ["tokens", "input_tokens", "max_tokens", "token_required", "tokens_used", "key", "key_id", "event"],
)
def test_plain_names_are_not(name: str) -> None:
    assert not secret_key(name)
