"""The gateway's Prometheus metrics (`/metrics`), one registry-wide copy per process."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from vagent_shared.access_provider import ProviderMetrics

REQUESTS: Final = Counter(
    "vagent_gateway_requests_total", "Requests by route and status", ["route", "status"]
)
ACTIVE_RUNS: Final = Gauge("vagent_gateway_active_runs", "Runs in progress in this process")
AUTH: Final = Counter("vagent_gateway_auth_total", "Token checks by outcome", ["outcome"])
ACCESS: Final = Counter("vagent_gateway_access_total", "Agent-access decisions by reason", ["reason"])
ACP_ERRORS: Final = Counter("vagent_gateway_acp_errors_total", "Failed provider calls by kind", ["kind"])
ACP_SECONDS: Final = Histogram("vagent_gateway_acp_seconds", "Provider call duration")
FLOOD_REJECTED: Final = Counter("vagent_gateway_flood_rejected_total", "Runs refused by the flood limit")
LIMITED: Final = Counter("vagent_gateway_limited_total", "Runs refused by a limit", ["limit"])
AUDIT_FAILURES: Final = Counter(
    "vagent_gateway_audit_write_failures_total", "Audit events not written to the stream", ["reason"]
)

PROVIDER: Final = ProviderMetrics(
    decision=lambda reason: ACCESS.labels(reason).inc(),
    error=lambda kind: ACP_ERRORS.labels(kind).inc(),
    seconds=ACP_SECONDS.observe,
)
