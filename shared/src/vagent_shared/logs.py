"""JSON logs to stdout with secrets scrubbed, for both services.

Secrets are removed by key name (token, password, authorization, ...) and by value
shape (bearer tokens), so a careless `log.info(..., headers=...)` cannot leak them.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from vagent_shared.secrets import secret_name
from vagent_shared.telemetry import add_trace_ids

_BEARER = re.compile(r"(?i)bearer\s+[A-Za-z0-9._~+/=-]+")
REDACTED = "[REDACTED]"


def _scrub(value: Any, depth: int = 0) -> Any:
    if depth > 4:
        return value
    if isinstance(value, str):
        return _BEARER.sub("Bearer " + REDACTED, value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and secret_name(k) else _scrub(v, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrub(v, depth + 1) for v in value]
    return value


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """structlog processor: drop secret-looking keys and bearer values."""
    for key in list(event_dict):
        if secret_name(key) and key != "event":
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _scrub(event_dict[key])
    return event_dict


def configure_logging(level: str = "INFO", service: str = "vagent") -> None:
    """One JSON object per line on stdout; stdlib loggers (uvicorn, httpx) included."""
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        add_trace_ids,  # inside a recorded span: its trace_id and span_id
        redact_secrets,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            lambda _, __, ed: {**ed, "service": service},
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "nio", "peewee", "markdown"):
        logging.getLogger(noisy).setLevel(max(lvl, logging.WARNING))
