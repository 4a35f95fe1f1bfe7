"""Fuzz the gateway's own OpenAPI with schemathesis: no request a client can send gets a 5xx.

The schema is read from the running gateway (`/openapi.json`, real HTTP) and every operation
in it is fuzzed, with valid and schema-breaking data (positive and negative generation):
once as a person with agent access, so the authenticated code paths are reached, and once
without a token. Deterministic (derandomized) and bounded (a few dozen cases per operation).

Random thread ids only ever reach the 404 path, so examples are steered part of the time: a
fresh thread of the caller's own in the path, the agent as `assistant_id`, a human message
(of generated text) as the run's input. Those runs reach the graph and the LLM stand-in.

Real parts as in test_gateway_api.py: Redis, the graph process on the scripted LLM, the demo
AccessControlProvider, the gateway process, a whoami stand-in homeserver.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from tests.support.gateway_process import GatewayProcess, gateway_stack
from tests.support.llm_server import ScriptedLLMServer

#: A member with agent access in the demo policy whom test_gateway_api.py does not use: the
#: threads the fuzzer makes are nobody else's.
CAROL = "@carol:localhost"
TOKEN = f"syt_fuzz_{secrets.token_urlsafe(24)}"
AGENT = "vagent"
#: Cases per operation and generation mode: with a valid token, and without one.
Operation = APIOperation[Any, Any, Any, Any]
WITH_TOKEN, WITHOUT_TOKEN = 100, 15


@pytest.fixture(scope="module")
def gateway(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("gw-fuzz")
    with gateway_stack(
        redis_url, _llm_session.base_url, tmp, {TOKEN: CAROL}, FLOOD_MAX_MESSAGES="100000", LOG_LEVEL="INFO"
    ) as gw:
        yield gw
    assert TOKEN not in gw.logs()


@pytest.fixture(scope="module")
def operations(gateway: GatewayProcess) -> list[Operation]:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json", wait_for_schema=30)
    found = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the gateway's own schema is valid
        found.append(result.ok())
    return found


def label(op: Operation) -> str:
    return f"{op.method.upper()} {op.path}"


def published(gateway: GatewayProcess) -> set[str]:
    """The operations of the raw /openapi.json, read apart from schemathesis."""
    paths = httpx.get(f"{gateway.url}/openapi.json", timeout=10).json()["paths"]
    return {f"{method.upper()} {path}" for path, item in paths.items() for method in item}


def steered(op: Operation) -> st.SearchStrategy[tuple[Case[Operation], bool, str]]:
    """The operation's cases (valid and invalid), each with whether to steer it (see the
    module's docstring) and the text of the human message a steered run sends."""
    cases = st.one_of(op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE))
    return st.tuples(cases, st.booleans(), st.text(min_size=1, max_size=40))


def fuzz(
    op: Operation,
    base_url: str,
    headers: dict[str, str],
    max_examples: int,
    new_thread: Callable[[], str] | None,
    sent: set[str],
) -> list[int]:
    """Run `max_examples` cases of `op` against the gateway; the statuses seen, and the
    operation of each request sent in `sent`. A 5xx fails with schemathesis' report (the
    request to reproduce it, the response)."""
    statuses: list[int] = []
    session = requests.Session()
    errors: list[str] = []  # a run's own server error is in its body: an `error` event

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(steered(op))
    def run(drawn: tuple[Case[Operation], bool, str]) -> None:
        case, steer, text = drawn
        if steer:
            path = dict(case.path_parameters or {})
            if new_thread is not None and "thread_id" in path:
                path["thread_id"] = new_thread()
            if "assistant_id" in path:
                path["assistant_id"] = AGENT
            case.path_parameters = path
            if isinstance(case.body, dict) and "/runs/" in op.path:
                said = {"messages": [{"type": "human", "content": text}]}
                body: dict[str, Any] = {k: v for k, v in case.body.items() if k != "command"}
                case.body = body | {"assistant_id": AGENT, "input": said}
        response = case.call(base_url=base_url, session=session, headers=headers, timeout=60)
        sent.add(f"{case.method.upper()} {case.operation.path}")
        statuses.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error], headers=headers)
        if response.status_code == 200 and "/runs/" in op.path:
            if "event: error" in response.text or "__error__" in response.text:
                errors.append(response.text[-500:])

    try:
        run()
    finally:
        session.close()
    assert not errors, errors
    return statuses


def test_no_request_with_a_token_gets_a_server_error(
    gateway: GatewayProcess, operations: list[Operation], llm_server: ScriptedLLMServer
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def new_thread() -> str:
        r = httpx.post(f"{gateway.url}/threads", json={}, headers=headers, timeout=10)
        r.raise_for_status()
        thread_id: str = r.json()["thread_id"]
        return thread_id

    sent: set[str] = set()
    tested = {label(op): fuzz(op, gateway.url, headers, WITH_TOKEN, new_thread, sent) for op in operations}
    assert sent == published(gateway)  # every operation of the schema, and nothing else
    assert all(len(statuses) >= WITH_TOKEN for statuses in tested.values())
    # the authenticated paths were reached: successes on the thread and run routes
    for path in (
        "GET /assistants/{assistant_id}",
        "POST /threads",
        "GET /threads/{thread_id}",
        "POST /threads/{thread_id}/runs/stream",
        "POST /threads/{thread_id}/runs/wait",
    ):
        assert any(200 <= s < 300 for s in tested[path]), (path, tested[path])
    assert llm_server.requests, "no fuzzed run reached the graph"


def test_no_request_without_a_token_gets_a_server_error(
    gateway: GatewayProcess, operations: list[Operation]
) -> None:
    sent: set[str] = set()
    tested = {label(op): fuzz(op, gateway.url, {}, WITHOUT_TOKEN, None, sent) for op in operations}
    assert sent == published(gateway)
    open_paths = {"GET /health", "GET /info"}
    assert set(tested) > open_paths
    for path, statuses in tested.items():
        if path not in open_paths:
            assert set(statuses) <= {400, 401, 404, 405, 413, 422}, (path, sorted(set(statuses)))


#: What an HTTP client may put in a header value (no CR, LF or NUL), obs-text included.
HEADER_BYTES = st.binary(max_size=200).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip())


@settings(
    max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    name=st.sampled_from([b"authorization", b"x-api-key"]),
    scheme=st.sampled_from([b"Bearer ", b"bearer ", b"BEARER\t", b"Basic ", b""]),
    value=st.one_of(HEADER_BYTES, HEADER_BYTES.map(lambda b: TOKEN.encode() + b)),
)
@example(name=b"authorization", scheme=b"Bearer ", value=TOKEN.encode() + b"\xa0")  # was accepted
def test_no_token_header_gets_a_server_error(
    gateway: GatewayProcess, name: bytes, scheme: bytes, value: bytes
) -> None:
    """The headers the schema does not describe: whatever a token header holds, the caller
    is refused (401) unless it is exactly the valid token, never a 5xx."""
    header = (scheme + value if name == b"authorization" else value).strip()  # as a client sends it
    r = httpx.post(f"{gateway.url}/threads/search", json={}, headers=[(name, header)], timeout=10)
    valid = value == TOKEN.encode() and (name == b"x-api-key" or scheme.lower() == b"bearer ")
    assert r.status_code == (200 if valid else 401), (name, header, r.status_code, r.text[:300])


def test_the_schema_names_the_langgraph_routes(operations: list[Operation]) -> None:
    """The fuzz above covers these at least (what langgraph_sdk calls)."""
    names: set[str] = {label(op) for op in operations}
    expected = {
        "GET /info",
        "GET /assistants/{assistant_id}",
        "POST /assistants/search",
        "POST /threads",
        "GET /threads/{thread_id}",
        "DELETE /threads/{thread_id}",
        "POST /threads/search",
        "GET /threads/{thread_id}/state",
        "POST /threads/{thread_id}/history",
        "POST /threads/{thread_id}/runs/stream",
        "POST /threads/{thread_id}/runs/wait",
        "POST /threads/{thread_id}/runs/{run_id}/cancel",
    }
    assert expected <= names, expected - names
