"""The graph's console at LOG_LEVEL=INFO does not print the MCP SDK's INFO chatter
("Received session ID", "Negotiated protocol version", a test server's "Terminating
session"); its warnings always show, and at DEBUG everything does."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from vagent_graph.mcp.client import quiet_sdk_logs


@pytest.fixture
def root_level() -> Iterator[logging.Logger]:
    root, sdk = logging.getLogger(), logging.getLogger("mcp")
    before = root.level, sdk.level
    yield root
    root.setLevel(before[0])
    sdk.setLevel(before[1])


def test_sdk_chatter_is_quiet_at_info(root_level: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    root_level.setLevel(logging.INFO)
    quiet_sdk_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger("mcp.client.streamable_http").info("Received session ID: abc")
        logging.getLogger("mcp.server.streamable_http").info("Terminating session: None")
        logging.getLogger("mcp.client.streamable_http").warning("stream broke")
        logging.getLogger("vagent_graph.mcp.servers").info("mcp_server_up")
    assert [r.getMessage() for r in caplog.records] == ["stream broke", "mcp_server_up"]


def test_sdk_chatter_shows_at_debug(root_level: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    root_level.setLevel(logging.DEBUG)
    quiet_sdk_logs()
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("mcp.client.streamable_http").info("Received session ID: abc")
    assert [r.getMessage() for r in caplog.records] == ["Received session ID: abc"]
