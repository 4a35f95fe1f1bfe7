"""Prometheus metrics of the graph service (module-level: one registry per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter("vagent_graph_requests_total", "HTTP requests", ["endpoint", "status"])
REQUEST_SECONDS = Histogram(
    "vagent_graph_request_duration_seconds",
    "HTTP request duration, whole stream included",
    ["endpoint"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
FIRST_EVENT_SECONDS = Histogram(
    "vagent_graph_first_event_seconds",
    "Time from request to first SSE event",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
LLM_TOKENS = Counter("vagent_graph_llm_tokens_total", "LLM tokens", ["model", "kind"])
LLM_CALLS = Counter("vagent_graph_llm_calls_total", "LLM calls", ["model", "outcome"])
#: Per tenant, never per user: the tenants are few, the users are many (docs/budgets.md).
TENANT_TOKENS = Counter(
    "vagent_graph_tenant_tokens_total",
    "LLM tokens as the provider reported them, by tenant and model",
    ["tenant", "model", "direction"],
)
BUDGET_REFUSALS = Counter(
    "vagent_graph_budget_refusals_total",
    "LLM calls not made because a budget is spent (user, tenant, llm_calls_per_turn)",
    ["scope"],
)
TOOL_CALLS = Counter("vagent_graph_tool_calls_total", "Tool calls by decision", ["tool", "decision"])
HITL_REQUESTS = Counter("vagent_graph_hitl_requests_total", "Questions asked to a human", ["kind"])
HITL_RESUMES = Counter("vagent_graph_hitl_resumes_total", "Answers received", ["outcome"])
ACTIVE_RUNS = Gauge("vagent_graph_active_runs", "Workflow runs in progress")
SECURITY_EVENTS = Counter("vagent_graph_security_events_total", "Refused access", ["kind"])
KNOWLEDGE_QUERIES = Counter(
    "vagent_graph_knowledge_queries_total",
    "Document searches and entity lookups by outcome (found, empty, nothing_readable, unavailable)",
    ["tool", "outcome"],
)
KNOWLEDGE_SECONDS = Histogram(
    "vagent_graph_knowledge_query_seconds",
    "Time of one document search (query embedding included) or entity lookup",
    ["tool"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
AUDIT_WRITE_FAILURES = Counter(
    "vagent_graph_audit_write_failures_total",
    "Audit events not written to the Redis stream (they are still in the JSON log)",
    ["reason"],
)
CREDENTIAL_FETCHES = Counter(
    "vagent_graph_credential_fetches_total",
    "Credentials handed to tools, by outcome (cache, registry, missing, denied, unavailable)",
    ["outcome"],
)
SEARCH_DEGRADED = Counter(
    "vagent_graph_search_degraded_total",
    "Hybrid searches answered by one half because the other failed",
    ["half"],
)
MCP_SERVERS_UP = Gauge(
    "vagent_graph_mcp_servers_up", "1 while an MCP server answers, 0 while it does not", ["server"]
)
MCP_TOOLS = Gauge("vagent_graph_mcp_tools", "Tools an MCP server currently brings", ["server"])
MCP_FAILURES = Counter("vagent_graph_mcp_failures_total", "MCP list or call failures", ["server", "reason"])
MCP_TOOLS_SKIPPED = Gauge(
    "vagent_graph_mcp_tools_skipped",
    "Tools an MCP server lists that are not offered, by why (invalid_name, invalid_schema, "
    "name_taken, max_tools, schema_budget)",
    ["server", "reason"],
)
TOOL_IMAGES = Counter("vagent_graph_tool_images_total", "Images tools returned", ["outcome"])
ATTACHMENTS = Counter(
    "vagent_graph_attachments_total", "Files users sent, by kind and outcome", ["kind", "outcome"]
)
ATTACHMENT_SECONDS = Histogram(
    "vagent_graph_attachment_read_seconds",
    "Reading one file (its own process)",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
MEMORY_OPS = Counter(
    "vagent_graph_memory_ops_total",
    "Memory writes (ok, refused) and deletions (by why: forget, forget_all, max_per_user)",
    ["op", "outcome"],
)
MEMORY_RECALL_SECONDS = Histogram(
    "vagent_graph_memory_recall_seconds",
    "Finding the memories a turn may recall (search and the recall rules)",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1),
)
