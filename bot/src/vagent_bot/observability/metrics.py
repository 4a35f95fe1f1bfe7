"""Prometheus metrics of the bot (module-level: one registry per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("vagent_bot_events_total", "Matrix events seen, by outcome", ["outcome"])
ACCESS = Counter("vagent_bot_access_decisions_total", "Agent access decisions", ["decision"])
ACP_ERRORS = Counter("vagent_bot_acp_errors_total", "AccessControlProvider failures (fail closed)", ["kind"])
ACP_SECONDS = Histogram("vagent_bot_acp_request_seconds", "AccessControlProvider latency")
GRAPH_REQUESTS = Counter(
    "vagent_bot_graph_requests_total", "Calls to the graph service", ["endpoint", "outcome"]
)
ANSWER_SECONDS = Histogram(
    "vagent_bot_answer_seconds",
    "From message to final edit",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
FIRST_REPLY_SECONDS = Histogram(
    "vagent_bot_first_reply_seconds",
    "From message to first reply",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
EDITS = Counter("vagent_bot_edits_total", "Message edits sent", ["outcome"])
HITL = Counter("vagent_bot_hitl_total", "Human-in-the-loop events", ["event"])
FLOOD_REJECTED = Counter("vagent_bot_flood_rejected_total", "Messages refused by flood control")
ACTIVE_RUNS = Gauge("vagent_bot_active_runs", "Answers being produced")
SYNC_SECONDS = Histogram("vagent_bot_sync_seconds", "Processing time of one sync response")
LAST_SYNC = Gauge("vagent_bot_last_sync_timestamp_seconds", "When the last sync was processed")
AUDIENCE_MEMBERS = Histogram(
    "vagent_bot_audience_members",
    "Joined members of a group room whose audience was resolved (the bot and the sender included)",
    buckets=(2, 3, 5, 10, 20, 50, 100, 250, 1000),
)
AUDIENCE_UNRESOLVED = Counter(
    "vagent_bot_audience_unresolved_total",
    "Room members whose AcContext could not be fetched (the graph lets them read nothing)",
)
AUDIENCE_FALLBACKS = Counter(
    "vagent_bot_audience_fallbacks_total",
    "Audiences reduced to public documents only",
    ["reason"],  # too_many_members, listing_failed
)
AUDIENCE_SECONDS = Histogram(
    "vagent_bot_audience_seconds",
    "Time to resolve a group room's audience (member listing and provider lookups)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
AUDIT_WRITE_FAILURES = Counter(
    "vagent_bot_audit_write_failures_total",
    "Audit events not written to the Redis stream (they are still in the JSON log)",
    ["reason"],
)
SCHEDULE_RUNS = Counter(
    "vagent_bot_schedule_runs_total",
    "Due runs of scheduled tasks, by how they ended",
    ["outcome"],  # ran, failed, skipped, missed
)
SCHEDULE_LAG = Histogram(
    "vagent_bot_schedule_lag_seconds",
    "From a scheduled run's due time to its start",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
