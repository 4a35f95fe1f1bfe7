"""A real OTLP/HTTP trace receiver: `POST /v1/traces` with protobuf bodies, decoded by the
official `opentelemetry-proto` package into plain `SpanRecord`s the tests can read.

Why not an in-process exporter: the services run as processes and export over the network
with the SDK's own OTLP exporter; only a receiver on the other end of that wire shows what a
collector would get (the encoding, the resource's service.name, the W3C parent links).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class SpanRecord:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: int  # opentelemetry.proto.trace.v1 Span.SpanKind: 1 internal, 2 server, 3 client, 5 consumer
    service: str
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    raw: str = field(repr=False)  # everything the exporter sent for this span, as text


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def decode(body: bytes) -> list[SpanRecord]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out: list[SpanRecord] = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    SpanRecord(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        service=str(resource.get("service.name", "")),
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        status_code=s.status.code,
                        raw=f"{resource} {s}",
                    )
                )
    return out


def count_spans(body: bytes) -> int:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class OtlpReceiver:
    """On a free loopback port; `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes.
    `keep_spans=False` (a benchmark): decode every export, keep only the count."""

    def __init__(self, keep_spans: bool = True) -> None:
        self.spans: list[SpanRecord] = []
        self.requests = 0
        self.span_count = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode(body) if keep_spans else []
                count = len(spans) if keep_spans else count_spans(body)
                with receiver._lock:
                    receiver.spans += spans
                    receiver.requests += 1
                    receiver.span_count += count
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    def snapshot(self) -> list[SpanRecord]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[SpanRecord]:
        return [s for s in self.snapshot() if s.trace_id == trace_id]

    def wait_for(self, found: Callable[[list[SpanRecord]], bool], timeout: float = 10.0) -> list[SpanRecord]:
        """The spans received so far, once `found` holds for them (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"spans not received in {timeout}s; got {len(spans)}: {names}")
            time.sleep(0.05)
