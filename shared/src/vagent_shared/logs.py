"""JSON logs to stdout with secrets scrubbed, for both services.

Secrets are removed by key name (`secret_key`: `*_token`, `password`, `authorization`,
`api_key`, ...) and by value shape (bearer tokens), so a careless `log.info(...,
headers=...)` cannot leak them. Only secrets: counts and flags such as `input_tokens`,
`max_tokens` or `token_required` stay readable (masking them told an operator nothing).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from vagent_shared.telemetry import add_trace_ids

_BEARER = re.compile(r"(?i)bearer\s+[A-Za-z0-9._~+/=-]+")
REDACTED = "[REDACTED]"

#: A key whose LAST word is one of these holds a secret: `GRAPH_API_TOKEN`, `access_token`,
#: `X-Auth-Token`, `MATRIX_PASSWORD`, `client_secret`, `Cookie` (not `tokens`, `input_tokens`,
#: `token_required`, `secret_name`, `credential_registry_url`).
SECRET_LAST_WORDS = frozenset(
    {
        "token",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "secret",
        "authorization",
        "auth",
        "cookie",
        "credential",
        "credentials",
        "apikey",
        "dsn",
    }
)
#: A key ending in `<word> key` with one of these words holds a secret: `OPENAI_API_KEY`,
#: `x-api-key`, `CREDENTIAL_CACHE_KEY`, `private_key`, `session_key` (not `key`, `key_id`).
SECRET_KEY_WORDS = frozenset(
    {"api", "access", "private", "secret", "session", "cache", "signing", "encryption", "master", "client"}
)
#: A key with one of these words ANYWHERE holds a secret: `password_hash`, `set-cookie`,
#: `proxy_authorization_header`.
SECRET_ANY_WORDS = frozenset({"password", "passwd", "passphrase", "authorization", "cookie", "apikey"})
#: Libraries whose INFO lines say nothing an operator acts on, kept at WARNING like the noisy
#: HTTP clients below (at every LOG_LEVEL):
#: redisvl says "Index already exists, not overwriting." for each of the checkpointer's indexes
#: on every start (the graph's own `docs_index_created` says when an index is really made).
QUIET = ("redisvl.index.index",)
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def key_words(name: str) -> list[str]:
    """`GRAPH_API_TOKEN`, `x-api-key`, `apiKey`, `APIKey` as lower-case words."""
    return [w.lower() for w in _WORDS.findall(name)]


def secret_key(name: str) -> bool:
    """A log field, header or setting name under which only secrets are kept.

    Why its own rule (and not vagent_shared.secrets.secret_name, which masks any name with
    `token` or `credential` in it): a tool argument masked by mistake costs nothing, but a
    log that hides `token_required=true` or `default_user_daily_tokens=200000` hides what the
    operator came to read."""
    words = key_words(name)
    if not words:
        return False
    if words[-1] in SECRET_LAST_WORDS or any(w in SECRET_ANY_WORDS for w in words):
        return True
    return len(words) >= 2 and words[-1] == "key" and words[-2] in SECRET_KEY_WORDS


def _scrub(value: Any, depth: int = 0) -> Any:
    if depth > 4:
        return value
    if isinstance(value, str):
        return _BEARER.sub("Bearer " + REDACTED, value)
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if isinstance(k, str) and secret_key(k) else _scrub(v, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrub(v, depth + 1) for v in value]
    return value


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """structlog processor: drop secret-looking keys and bearer values."""
    for key in list(event_dict):
        if secret_key(key) and key != "event":
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
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "nio", "peewee", "markdown", *QUIET):
        logging.getLogger(noisy).setLevel(max(lvl, logging.WARNING))
