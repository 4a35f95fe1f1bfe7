"""A scriptable MCP server for the graph's tests of MCP faults, hostile servers and RBAC.

Why: the graph must cope with whatever an MCP server does (errors, hangs, huge or odd results,
a process that dies mid-call, malformed tool schemas, absurd descriptions) and must send each
asker's own credential. A real server process, scripted per test, shows both over the real
transports; it records every call with a fingerprint (SHA-256) of the credential headers it
carried, never their values.

Run from the repository root, or by its file path from anywhere (it imports nothing from
`tests`; `-P` keeps tests/support/ off sys.path, whose modules could shadow others):

    python -m tests.support.mcp_server --config tools.json --transport streamable_http --port N
        [--host 127.0.0.1] [--record calls.jsonl]
    python -P tests/support/mcp_server.py --config tools.json --transport stdio --record calls.jsonl
    transports: streamable_http (endpoint /mcp), sse (/sse, posts to /messages/), stdio

HTTP transports also serve GET /health, GET /calls ({"calls": [...], "listings": [...]}) and
DELETE /calls. With --record every entry is also appended to that file as one JSON line
{"kind": "call" | "listing", ...} (the only record of a stdio server, and the one that
survives a `drop`).

The config (JSON; `tool()` below builds one tool's entry):

    {"name": "test-mcp", "instructions": null,
     "stateless": false,         # streamable_http: no session (a new one per request)
     "json_response": false,     # streamable_http: plain JSON bodies instead of SSE streams
     "validate_input": false,    # check arguments against inputSchema before the behaviour
     "fingerprint_headers": ["authorization", "x-api-key"],
     "tools": [{
        "name": "echo", "title": null, "description": "any string, kept as given",
        "params": {"text": "string", "count": "integer?"},   # simple typed params ("?": optional)
        "input_schema": {...},   # OR the inputSchema as given: any JSON value, even a broken one
        "output_schema": null, "annotations": {"readOnlyHint": true}, "meta": null,
        "behaviour": "echo",     # echo | error | hang | big | structured | image | drop | elicit
                                 # | grow | rpc_error | storm
        "message": "...",        # error: the error text
        "seconds": 3600,         # hang: how long it sleeps before answering like echo
        "size": 100000,          # big: characters (= bytes, ASCII) of text
        "result": {...},         # structured: the structuredContent (default {"tool", "arguments"})
        "text": null,            # structured: the text content (default: the result as JSON)
        "mime_type": "image/png", "data": null,   # image: base64 data (default a 1x1 PNG)
        "count": 1,              # image: how many images; elicit: how many questions;
                                 # storm: how many tools/list_changed notifications
        "exit_code": 1           # drop: os._exit(exit_code) after recording the call
     }]}

A call entry: {"tool", "arguments", "fingerprints": {header: sha256 hex | None},
"headers": [names of the request's headers], "time": unix seconds}; a listing entry has no
tool or arguments. echo answers one text item, JSON {"tool", "arguments", "fingerprints"}.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, cast, get_args

import anyio
import httpx
import uvicorn
from mcp import types
from mcp.client.stdio import StdioServerParameters
from mcp.server.lowlevel import Server
from mcp.server.sse import SseServerTransport
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import UrlElicitationRequiredError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

Transport = Literal["streamable_http", "sse", "stdio"]
Behaviour = Literal[
    "echo", "error", "hang", "big", "structured", "image", "drop", "elicit", "grow", "rpc_error", "storm"
]
ParamType = Literal["string", "integer", "number", "boolean", "array", "object"]

ROOT = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    from tests.support.procs import ServiceProcess

MODULE_FILE = Path(__file__).resolve()
PATHS: dict[Transport, str] = {"streamable_http": "/mcp", "sse": "/sse", "stdio": ""}
#: A 1x1 transparent PNG, the default `image` result.
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def fingerprint(value: str) -> str:
    """What the server records of a credential header: its SHA-256, hex."""
    return hashlib.sha256(value.encode()).hexdigest()


# --------------------------------------------------------------------------- config


class ToolSpec(BaseModel):
    """One tool: what the server announces (as given) and what a call does."""

    model_config = ConfigDict(extra="forbid")

    name: str
    title: str | None = None
    description: str | None = None
    params: dict[str, str] | None = None
    input_schema: Any = None
    output_schema: Any = None
    annotations: Any = None
    meta: Any = None
    behaviour: Behaviour = "echo"
    message: str = "tool failed on purpose"
    seconds: float = 3600
    size: int = Field(default=100_000, ge=0)
    result: dict[str, Any] | None = None
    text: str | None = None
    mime_type: str = "image/png"
    data: str | None = None
    count: int = Field(default=1, ge=0)
    exit_code: int = 1

    @model_validator(mode="after")
    def _one_schema(self) -> ToolSpec:
        if self.params is not None and self.input_schema is not None:
            raise ValueError(f"tool {self.name!r}: params or input_schema, not both")
        for name, kind in (self.params or {}).items():
            if kind.removesuffix("?") not in get_args(ParamType):
                raise ValueError(f"tool {self.name!r}: param {name!r} has unknown type {kind!r}")
        return self

    def schema_as_given(self) -> Any:
        """The inputSchema to announce: `input_schema` verbatim, or built from `params`."""
        if self.input_schema is not None:
            return self.input_schema
        params = self.params or {}
        return {
            "type": "object",
            "properties": {name: {"type": kind.removesuffix("?")} for name, kind in params.items()},
            "required": [name for name, kind in params.items() if not kind.endswith("?")],
        }

    def definition(self) -> types.Tool:
        """The announced tool, exactly as configured: when the SDK's model would reject or
        coerce a field (a hostile server's `"readOnlyHint": "yes"`), it is sent raw."""
        given: dict[str, Any] = {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.schema_as_given(),
            "outputSchema": self.output_schema,
            "annotations": self.annotations,
            "_meta": self.meta,
        }
        given = {k: v for k, v in given.items() if v is not None}
        try:
            tool = types.Tool.model_validate(given)
            if tool.model_dump(mode="json", by_alias=True, exclude_none=True) == given:
                return tool
        except ValidationError:
            pass
        meta = given.pop("_meta", None)
        return types.Tool.model_construct(**given, meta=meta)


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "test-mcp"
    instructions: str | None = None
    stateless: bool = False
    json_response: bool = False
    validate_input: bool = False
    fingerprint_headers: list[str] = Field(default_factory=lambda: ["authorization", "x-api-key"])
    tools: list[ToolSpec] = Field(default_factory=list)


def tool(
    name: str,
    behaviour: Behaviour = "echo",
    *,
    description: str | None = None,
    params: dict[str, str] | None = None,
    input_schema: Any = None,
    annotations: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """One entry of the config's `tools` (options: title, output_schema, meta, message,
    seconds, size, result, text, mime_type, data, count, exit_code); validated here, so a typo fails
    in the test rather than in the server process."""
    entry: dict[str, Any] = {"name": name, "behaviour": behaviour, **options}
    if description is not None:
        entry["description"] = description
    if params is not None:
        entry["params"] = params
    if input_schema is not None:
        entry["input_schema"] = input_schema
    if annotations is not None:
        entry["annotations"] = annotations
    ToolSpec.model_validate(entry)
    return entry


# --------------------------------------------------------------------------- the server


class Recorder:
    """Tool calls and tool listings, in memory and (with a path) one JSON line each in a file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.calls: list[dict[str, Any]] = []
        self.listings: list[dict[str, Any]] = []

    def add(self, kind: Literal["call", "listing"], entry: dict[str, Any]) -> None:
        (self.calls if kind == "call" else self.listings).append(entry)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:  # closed, so flushed, before a drop
                f.write(json.dumps({"kind": kind, **entry}) + "\n")

    def clear(self) -> None:
        self.calls.clear()
        self.listings.clear()


def _request_facts(server: Server[Any, Any], names: list[str]) -> dict[str, Any]:
    """The current request's header fingerprints and header names (stdio: none)."""
    try:
        request = server.request_context.request
    except LookupError:
        request = None
    headers = request.headers if isinstance(request, Request) else None
    return {
        "fingerprints": {
            name: fingerprint(headers[name]) if headers is not None and name in headers else None
            for name in names
        },
        "headers": sorted({k.lower() for k in headers.keys()}) if headers is not None else [],
        "time": time.time(),
    }


def build_server(config: ServerConfig, recorder: Recorder) -> Server[Any, Any]:
    """A low-level MCP server (FastMCP would rewrite raw schemas) playing `config`'s tools."""
    server: Server[Any, Any] = Server(config.name, instructions=config.instructions)
    specs = {spec.name: spec for spec in config.tools}
    definitions = [spec.definition() for spec in config.tools]
    headers = [h.lower() for h in config.fingerprint_headers]

    sessions: list[Any] = []  # every session that listed the tools: told when the list grows

    async def list_tools(request: types.ListToolsRequest) -> types.ListToolsResult:
        with contextlib.suppress(LookupError):
            if server.request_context.session not in sessions:
                sessions.append(server.request_context.session)
        # The SDK matches the annotation exactly to pass the request; it passes None when it
        # lists the tools itself before a call, which is not a client's listing.
        if cast(types.ListToolsRequest | None, request) is not None:
            recorder.add("listing", _request_facts(server, headers))
        return types.ListToolsResult.model_construct(tools=definitions)

    async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
        facts = _request_facts(server, headers)
        recorder.add("call", {"tool": name, "arguments": arguments, **facts})
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"unknown tool {name!r}")
        echo = {"tool": name, "arguments": arguments, "fingerprints": facts["fingerprints"]}
        match spec.behaviour:
            case "echo":
                return [types.TextContent(type="text", text=json.dumps(echo))]
            case "error":
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=spec.message)], isError=True
                )
            case "hang":
                await anyio.sleep(spec.seconds)
                return [types.TextContent(type="text", text=json.dumps(echo))]
            case "big":
                text = ("0123456789" * (spec.size // 10 + 1))[: spec.size]
                return [types.TextContent(type="text", text=text)]
            case "structured":
                result = spec.result if spec.result is not None else {"tool": name, "arguments": arguments}
                text = spec.text if spec.text is not None else json.dumps(result)
                return types.CallToolResult(
                    content=[types.TextContent(type="text", text=text)], structuredContent=result
                )
            case "image":
                data = spec.data if spec.data is not None else PNG_1X1
                return [types.ImageContent(type="image", data=data, mimeType=spec.mime_type)] * spec.count
            case "drop":
                sys.stdout.flush()
                os._exit(spec.exit_code)
            case "grow":  # adds an echo tool named `text`, and tells every session the list changed
                grown = ToolSpec(name=spec.text or f"grown_{len(definitions)}", params={"text": "string"})
                specs[grown.name] = grown
                definitions.append(grown.definition())
                for listener in list(sessions):
                    with contextlib.suppress(Exception):
                        await listener.send_tool_list_changed()
                return [types.TextContent(type="text", text=f"added {grown.name}")]
            case "rpc_error":  # a JSON-RPC error answer (not an isError result), with internals
                raise UrlElicitationRequiredError(
                    [
                        types.ElicitRequestURLParams(
                            mode="url",
                            message=spec.message,
                            url="https://internal.example/oauth?token=s3cr3t-internal",
                            elicitationId="e-1",
                        )
                    ]
                )
            case "elicit":  # asks the user for input mid-call (`count` times); answers with what it got
                actions = []
                for n in range(spec.count):
                    answer = await server.request_context.session.elicit(
                        spec.message if n == 0 else f"{spec.message} ({n})",
                        {"type": "object", "properties": {"room": {"type": "string"}}},
                    )
                    actions.append(answer.action)
                said = ", ".join(sorted(set(actions)))
                return [types.TextContent(type="text", text=f"elicitation: {said}")]
            case "storm":  # `count` tools/list_changed notifications to every session that listed
                for _ in range(spec.count):
                    for listener in list(sessions):
                        with contextlib.suppress(Exception):
                            await listener.send_tool_list_changed()
                return [types.TextContent(type="text", text=f"sent {spec.count} notifications")]

    # The low-level decorators are untyped; registering through Any keeps the handlers typed.
    registry = cast(Any, server)
    registry.list_tools()(list_tools)
    registry.call_tool(validate_input=config.validate_input)(call_tool)
    return server


def _record_routes(recorder: Recorder) -> list[Route]:
    async def calls(request: Request) -> Response:
        if request.method == "DELETE":
            recorder.clear()
            return Response(status_code=204)
        return JSONResponse({"calls": recorder.calls, "listings": recorder.listings})

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "healthy"})

    return [Route("/calls", calls, methods=["GET", "DELETE"]), Route("/health", health, methods=["GET"])]


class _StreamableHTTP:
    """The session manager as a plain ASGI endpoint (a Route would wrap a method as a view)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self.manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.manager.handle_request(scope, receive, send)


def http_app(
    server: Server[Any, Any], config: ServerConfig, recorder: Recorder, transport: Transport
) -> Starlette:
    """The Starlette app of an HTTP transport, with /calls and /health."""
    routes: list[Route | Mount] = list(_record_routes(recorder))
    if transport == "streamable_http":
        manager = StreamableHTTPSessionManager(
            app=server, json_response=config.json_response, stateless=config.stateless
        )
        routes.append(Route(PATHS["streamable_http"], _StreamableHTTP(manager)))

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            async with manager.run():
                yield

        return Starlette(routes=routes, lifespan=lifespan)

    sse = SseServerTransport("/messages/")

    async def handle_sse(request: Request) -> Response:
        async with sse.connect_sse(request.scope, request.receive, request._send) as (read, write):
            await server.run(read, write, server.create_initialization_options())
        return Response()

    routes += [
        Route(PATHS["sse"], handle_sse, methods=["GET"]),
        Mount("/messages/", app=sse.handle_post_message),
    ]
    return Starlette(routes=routes)


async def _serve_stdio(server: Server[Any, Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_server", description="A scriptable MCP server for tests.")
    parser.add_argument("--config", type=Path, required=True, help="JSON file: the server's tools")
    parser.add_argument("--transport", choices=["streamable_http", "sse", "stdio"], default="streamable_http")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="HTTP transports only")
    parser.add_argument("--record", type=Path, default=None, help="append every call here as a JSON line")
    args = parser.parse_args(argv)
    # A hostile tool definition is sent as given; pydantic would warn on every listing.
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings")
    try:
        config = ServerConfig.model_validate_json(args.config.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        print(f"mcp_server: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    recorder = Recorder(args.record)
    server = build_server(config, recorder)
    if args.transport == "stdio":
        anyio.run(_serve_stdio, server)
        return 0
    if not args.port:
        print("mcp_server: --port is required for HTTP transports", file=sys.stderr)
        return 2
    app = http_app(server, config, recorder, args.transport)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


# --------------------------------------------------------------------------- the test helper


class McpTestServer:
    """This module as a subprocess for a test: writes the config, starts it on a free port of
    127.0.0.1 (HTTP transports) and reads what it recorded.

    For stdio the MCP client starts the process itself: `start()` only writes the config, and
    `stdio_command` / `stdio_parameters()` say what to run. `calls()` and `listings()` read
    the record file, so they work for every transport, after a `drop` too.
    """

    def __init__(
        self,
        config: dict[str, Any] | ServerConfig,
        directory: Path,
        transport: Transport = "streamable_http",
        port: int | None = None,
    ) -> None:
        self.config = config if isinstance(config, ServerConfig) else ServerConfig.model_validate(config)
        self.transport = transport
        self.directory = directory
        self._port = port
        name = f"mcp-{self.config.name}-{transport}-{id(self):x}"
        self.config_path = directory / f"{name}.json"
        self.record_path = directory / f"{name}.calls.jsonl"
        self.log_path = directory / f"{name}.log"
        #: The HTTP transports' process (stdio: the MCP client starts its own).
        self.service: ServiceProcess | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            from procutil import free_port

            self._port = free_port()
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The MCP endpoint: .../mcp (streamable_http) or .../sse (sse)."""
        if self.transport == "stdio":
            raise ValueError("a stdio server has no URL; see stdio_command")
        return self.base_url + PATHS[self.transport]

    @property
    def stdio_command(self) -> tuple[str, list[str]]:
        """(command, args) that serve this config over stdio, recording to record_path."""
        args = ["-P", str(MODULE_FILE), "--transport", "stdio", "--config", str(self.config_path)]
        return sys.executable, [*args, "--record", str(self.record_path)]

    def stdio_parameters(self, env: dict[str, str] | None = None) -> StdioServerParameters:
        """What `mcp.client.stdio.stdio_client` needs to start this server."""
        command, args = self.stdio_command
        return StdioServerParameters(command=command, args=args, env=env, cwd=str(ROOT))

    def write_config(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config.model_dump_json(), encoding="utf-8")
        self.record_path.touch()

    def start(self, timeout: float = 30) -> Self:
        """Write the config; for HTTP, start the process and wait for /health."""
        from tests.support.procs import ServiceProcess  # only in the tests: this file also runs alone

        self.write_config()
        if self.transport == "stdio":
            return self
        argv = [
            sys.executable,
            "-P",
            str(MODULE_FILE),
            "--transport",
            self.transport,
            "--port",
            str(self.port),
        ]
        argv += ["--config", str(self.config_path), "--record", str(self.record_path)]
        self.service = ServiceProcess("mcp_server", {}, self.log_path, self.base_url + "/health", argv=argv)
        self.service.start(timeout)
        return self

    def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); the exit code of a graceful stop."""
        return self.service.stop(timeout) if self.service is not None else None

    def kill(self) -> None:
        if self.service is not None:
            self.service.kill()

    def restart(self) -> Self:
        self.stop()
        return self.start()

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.service.proc if self.service is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has ended (a `drop`), else None."""
        return self.proc.poll() if self.proc is not None else None

    def _records(self, kind: str) -> list[dict[str, Any]]:
        try:
            lines = self.record_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        entries = [json.loads(line) for line in lines if line.strip()]
        return [{k: v for k, v in e.items() if k != "kind"} for e in entries if e.get("kind") == kind]

    def calls(self) -> list[dict[str, Any]]:
        """The tool calls so far, oldest first."""
        return self._records("call")

    def listings(self) -> list[dict[str, Any]]:
        """The clients' tools/list requests so far, oldest first."""
        return self._records("listing")

    def clear(self) -> None:
        """Forget the calls and listings recorded so far."""
        self.record_path.write_text("", encoding="utf-8")
        if self.running:
            httpx.delete(self.base_url + "/calls", timeout=5)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(main())
