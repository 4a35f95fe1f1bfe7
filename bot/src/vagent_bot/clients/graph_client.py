"""The bot's client of the graph service: the shared one (`vagent_shared.graph_client`, also
used by the gateway) wired to the bot's metric, tracing and proxy.

Why a subclass and not a copy: the graph's HTTP + SSE contract and what each refusal means
must exist once. What stays here is only the bot's own: its counter
`vagent_bot_graph_requests_total{endpoint,outcome}`, the W3C trace propagation of its
requests (`client_tracing`, so the graph continues the Matrix event's trace), its proxy
lookup (`vagent_bot.clients.http.proxy_for`, read once) and its logger name
(`vagent_bot.clients.graph_client`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import aiohttp
import structlog

from vagent_bot.clients.http import client_tracing, proxy_for
from vagent_bot.observability import metrics
from vagent_shared.graph_client import (
    GraphBusy,
    GraphError,
    GraphNoPending,
    GraphRejected,
    GraphStreamBroken,
    GraphUnavailable,
)
from vagent_shared.graph_client import GraphClient as SharedGraphClient

__all__ = [
    "GraphBusy",
    "GraphClient",
    "GraphError",
    "GraphNoPending",
    "GraphRejected",
    "GraphStreamBroken",
    "GraphUnavailable",
]


def count_request(endpoint: str, outcome: str) -> None:
    """The shared client's outcome hook: the bot's Prometheus counter."""
    metrics.GRAPH_REQUESTS.labels(endpoint, outcome).inc()


class GraphClient(SharedGraphClient):
    """The shared client with the bot's metric, tracing, proxy and logger name.
    `max_connections` is GRAPH_MAX_CONNECTIONS (0: no cap): the answers one bot process
    streams at once."""

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        read_timeout: float = 90.0,
        max_connections: int = 100,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(
            base_url,
            token,
            read_timeout=read_timeout,
            max_connections=max_connections,
            session=session,
            proxy=proxy_for(base_url.rstrip("/")),
            trace_configs=client_tracing(),  # the request continues the event's trace
            on_outcome=count_request,
        )
