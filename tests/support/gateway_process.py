"""The gateway (`vagent-gateway`) as a subprocess, and a whoami stand-in homeserver for the
integration tests (the end-to-end test uses a real Synapse instead).

Why a stand-in here: the gateway only asks the homeserver `GET /_matrix/client/v3/account/whoami`;
a table of tokens lets the integration tests name people, forge and revoke tokens cheaply.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Self

from procutil import free_port

from tests.support.graph_process import TOKEN as GRAPH_TOKEN
from tests.support.graph_process import GraphProcess
from tests.support.procs import ROOT, ServiceProcess


class WhoamiStandIn:
    """`GET /_matrix/client/v3/account/whoami` answering the user of a known bearer token,
    401 `M_UNKNOWN_TOKEN` otherwise. `tokens` may be edited while it runs (revocation)."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens
        self.asked = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.asked += 1
                auth = self.headers.get("Authorization", "")
                user = (
                    stand_in.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
                )
                if self.path != "/_matrix/client/v3/account/whoami" or user is None:
                    self._send(401, {"errcode": "M_UNKNOWN_TOKEN", "error": "Unknown access token"})
                else:
                    self._send(200, {"user_id": user, "is_guest": False})

            def _send(self, status: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                """Quiet: tokens would be in the request lines of a verbose log."""

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()


class GatewayProcess(ServiceProcess):
    """`vagent-gateway` on a free loopback port; `env` adds to (and overrides) the defaults."""

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        *,
        homeserver: str,
        graph_url: str,
        graph_token: str,
        acp_url: str,
        **env: str,
    ) -> None:
        self.port = free_port()
        super().__init__(
            "vagent-gateway",
            {
                "REDIS_URL": redis_url,
                "GATEWAY_HOST": "127.0.0.1",
                "GATEWAY_PORT": str(self.port),
                "MATRIX_HOMESERVER": homeserver,
                "GRAPH_API_ENDPOINT": graph_url,
                "GRAPH_API_TOKEN": graph_token,
                "ACCESS_CONTROL_PROVIDER_URL": acp_url,
                "LOG_LEVEL": "DEBUG",
                **env,
            },
            log_dir / f"gateway-{self.port}.log",
            f"http://127.0.0.1:{self.port}/health",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def demo_acp(tmp: Path) -> ServiceProcess:
    """The development AccessControlProvider (`vagent-acp`) serving a copy of the demo policy
    (deploy/dev/acp-policy.yaml: @alice and @bob have agent access, @dave is unknown), not
    started. The copy, so a test may edit it without touching the repository's."""
    policy = tmp / "acp-policy.yaml"
    shutil.copy(ROOT / "deploy/dev/acp-policy.yaml", policy)
    port = free_port()
    env = {"ACP_HOST": "127.0.0.1", "ACP_PORT": str(port), "ACP_POLICY_FILE": str(policy)}
    return ServiceProcess("vagent-acp", env, tmp / "acp.log", f"http://127.0.0.1:{port}/health")


@contextmanager
def gateway_stack(
    redis_url: str,
    llm_url: str,
    tmp: Path,
    tokens: dict[str, str],
    *,
    acp_url: str | None = None,
    graph_env: dict[str, str] | None = None,
    **env: str,
) -> Iterator[GatewayProcess]:
    """A gateway in front of a graph of its own (on `llm_url`'s model), with a whoami stand-in
    knowing `tokens` (token -> user id) and the demo provider (unless `acp_url` names one);
    a generous flood limit unless `env` sets one. Everything stops when the block ends."""
    with ExitStack() as stack:
        whoami = stack.enter_context(WhoamiStandIn(tokens))
        if acp_url is None:
            acp_url = stack.enter_context(demo_acp(tmp)).base_url
        graph = stack.enter_context(GraphProcess(redis_url, tmp / "graph", llm_url, **(graph_env or {})))
        yield stack.enter_context(
            GatewayProcess(
                redis_url,
                tmp,
                homeserver=whoami.url,
                graph_url=graph.url,
                graph_token=GRAPH_TOKEN,
                acp_url=acp_url,
                **{"FLOOD_MAX_MESSAGES": "1000", **env},
            )
        )
