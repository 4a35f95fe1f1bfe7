"""GRAPH_MAX_CONNECTIONS: the bot's connection pool to the graph, so the answers one bot
process streams at once (0: no cap)."""

from __future__ import annotations

import pytest

from vagent_bot.clients.graph_client import GraphClient
from vagent_shared.settings import BotSettings


@pytest.mark.parametrize("limit", [100, 7, 0])
async def test_the_pool_to_the_graph_has_the_configured_size(limit: int) -> None:
    client = GraphClient("http://127.0.0.1:1", None, max_connections=limit)
    try:
        connector = client._session.get().connector
        assert connector is not None and connector.limit == limit
    finally:
        await client.aclose()


def test_the_default_keeps_the_former_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRAPH_MAX_CONNECTIONS", raising=False)
    assert BotSettings().GRAPH_MAX_CONNECTIONS == 100
    monkeypatch.setenv("GRAPH_MAX_CONNECTIONS", "500")
    assert BotSettings().GRAPH_MAX_CONNECTIONS == 500
