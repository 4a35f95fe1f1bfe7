"""URLs on exported spans: scheme, host, port and path only, the path's secrets masked.

Why: the maintained HTTP instrumentations (httpx, httpx2, aiohttp, FastAPI) put the whole URL
on their spans (`url.full` / `http.url`, the server's `http.target` / `url.query`), and an MCP
server's URL often carries its token in the query (`?api_key=…`) or the path (`/s/<token>/mcp`).
They redact only user info and four signature parameters. So every span is rewritten on its
way out (`UrlScrubbingExporter`, wrapped around the OTLP exporter): whatever instrumentation
made it, and whenever it set the attribute, the query, fragment and user info are dropped,
and a path segment that looks like a secret (by shape, after a segment such as `token` or
`key`, or a long run with digits such as a hex or UUID key) becomes `REDACTED`. URLs inside
other text (an exception message, a span name) are reduced the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

from vagent_shared.secrets import looks_like_secret, secret_name

REDACTED = "REDACTED"
#: Attributes holding a whole URL, a path (with the query, in the older conventions), a query.
URL_KEYS = frozenset({"url.full", "http.url", "url.original"})
PATH_KEYS = frozenset({"url.path", "http.target"})
QUERY_KEYS = frozenset({"url.query"})
#: A segment after one of these is a key, whatever it looks like.
_KEY_SEGMENTS = frozenset({"key", "keys", "apikey", "auth", "sig", "signature", "secret", "secrets"})
#: Shorter segments with digits are ids and versions (`v1`, `2026-11-25`); longer random-looking
#: ones (digits, or mixed case in one run) are keys.
MIN_KEY_CHARS = 16
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://[^\s\"'<>`]+")


def _randomish(text: str) -> bool:
    """Digits, or upper and lower case mixed: a base64url key may hold no digit
    (`AbcdEfgh-IjklMnop`); `process-message` is a name. A long mixed-case name is masked too:
    a span loses a readable segment rather than showing a key."""
    if any(c.isdigit() for c in text):
        return True
    return any(c.isupper() for c in text) and any(c.islower() for c in text)


def _secret_segment(segment: str, before: str) -> bool:
    text = unquote(segment)
    if not text:
        return False
    return (
        looks_like_secret(text)
        or "=" in text
        or (len(text) >= MIN_KEY_CHARS and _randomish(text))
        or secret_name(before)
        or unquote(before).lower() in _KEY_SEGMENTS
    )


def span_path(path: str) -> str:
    """A URL path (a query after it dropped) with each secret-looking segment `REDACTED`."""
    segments = path.split("?", 1)[0].split("#", 1)[0].split("/")
    return "/".join(
        REDACTED if _secret_segment(s, segments[i - 1] if i else "") else s for i, s in enumerate(segments)
    )


def span_url(url: str) -> str:
    """`url` as a span may show it: scheme, host, port and the path (`span_path`); no user
    info, query or fragment. Not a URL at all: `REDACTED`."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return REDACTED
    if ":" in host:
        host = f"[{host}]"  # IPv6
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, span_path(parts.path), "", ""))


def span_text(text: str) -> str:
    """Every URL in `text` reduced by `span_url`."""
    return _URL.sub(lambda m: span_url(m.group()), text) if "://" in text else text


def _value(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if key in URL_KEYS:
        return span_url(value)
    if key in PATH_KEYS:
        return span_path(value)
    return span_text(value)


def scrub_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`attributes` with URLs reduced and queries dropped; None when nothing had to change."""
    if not attributes:
        return None
    out = {k: _value(k, v) for k, v in attributes.items() if k not in QUERY_KEYS}
    return None if out == dict(attributes) else out


def scrubbed(span: ReadableSpan) -> ReadableSpan:
    """`span`, or a copy with every URL in its name, attributes, events and status reduced."""
    attributes = scrub_attributes(span.attributes)
    events = [_event(e) for e in span.events]
    name = span_text(span.name)
    status = span.status
    description = span_text(status.description) if status.description else None
    changed_events = any(new is not old for new, old in zip(events, span.events, strict=True))
    if attributes is None and not changed_events and name == span.name and description == status.description:
        return span
    return ReadableSpan(
        name=name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes if attributes is not None else span.attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        status=Status(status.status_code, description) if description != status.description else status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _event(event: Event) -> Event:
    attributes = scrub_attributes(event.attributes)
    return event if attributes is None else Event(event.name, attributes, event.timestamp)


class UrlScrubbingExporter(SpanExporter):
    """Exports through `inner` what `scrubbed` leaves of each span."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([scrubbed(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)
