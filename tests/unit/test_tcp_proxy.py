"""The tests' round-robin proxy: connection n goes to backend n mod N, and a backend that
refuses connections is skipped."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from procutil import free_port

from tests.support.tcp_proxy import RoundRobinProxy, next_backends


def test_each_connection_starts_at_the_next_backend() -> None:
    b = [("h", 1), ("h", 2), ("h", 3)]
    assert [next_backends(b, t)[0] for t in range(4)] == [("h", 1), ("h", 2), ("h", 3), ("h", 1)]
    assert next_backends(b, 1) == [("h", 2), ("h", 3), ("h", 1)]


@pytest.fixture
def named_server() -> Iterator[tuple[int, str]]:
    """A TCP server that answers every connection with its name, then closes it."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"alive")

    threading.Thread(target=serve, daemon=True).start()
    yield port, "alive"
    srv.close()


def test_a_backend_that_refuses_is_skipped(named_server: tuple[int, str]) -> None:
    port, name = named_server
    dead = free_port()  # nothing listens there
    with RoundRobinProxy([("127.0.0.1", dead), ("127.0.0.1", port)]) as proxy:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
                assert c.recv(16) == name.encode()
    assert proxy.routed == [("127.0.0.1", port)] * 3
