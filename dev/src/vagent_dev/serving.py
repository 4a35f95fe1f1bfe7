"""One way to serve a stand-in: the same logging, error bodies, start-up failure and warning
banner for `vagent-acp`, `vagent-credentials`, `vagent-tickets`, `vagent-calendar` and
`vagent-stt`.

Why one copy: each of them must refuse to start on a broken file with a one-line message
(exit 2, never a traceback that could quote a secret from the file), and must say loudly in
its log that it is a development stand-in.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from vagent_dev.yaml_files import FileError, ReloadingFile
from vagent_shared.http_errors import install_error_handlers
from vagent_shared.logs import configure_logging
from vagent_shared.wire import ErrorResponse

log = structlog.get_logger(__name__)


def install_json_error_handlers(app: FastAPI) -> None:
    """The project's error bodies, plus a plain "not valid JSON" for an unparsable body.

    Why: FastAPI reports that as `loc: ["body", <offset>]`, which the shared handler turns
    into a confusing "1: JSON decode error".
    """
    install_error_handlers(app)
    shared = app.exception_handlers[RequestValidationError]

    async def _invalid(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RequestValidationError) and any(
            e.get("type") == "json_invalid" for e in exc.errors()
        ):
            body = ErrorResponse(error_code="invalid_request", message="body: not valid JSON")
            return JSONResponse(body.model_dump(), status_code=422)
        response = shared(request, exc)
        return response if isinstance(response, Response) else await response

    app.add_exception_handler(RequestValidationError, _invalid)


class HasDomains(Protocol):
    @property
    def domains(self) -> Mapping[str, Any]: ...


def add_policy_health(app: FastAPI, store: ReloadingFile[Any], meaning: str) -> None:
    """`GET /health` of a stand-in serving a policy file: 200 while the file is valid, 503
    otherwise (`meaning`: what an invalid file does to its answers)."""

    @app.get("/health", description=f"200 while the policy file is valid, 503 otherwise ({meaning}).")
    async def health() -> JSONResponse:
        try:
            policy: HasDomains = store.current()
        except FileError:
            return JSONResponse({"status": "unhealthy", "policy_file": str(store.path)}, status_code=503)
        return JSONResponse(
            {"status": "healthy", "policy_file": str(store.path), "domains": sorted(policy.domains)}
        )


def serve(
    name: str,
    build: Callable[[], FastAPI],
    *,
    host: str,
    port: int,
    log_level: str,
    startup_errors: tuple[type[BaseException], ...],
    note: str,
    **started: object,
) -> int:
    """Build the app with `build()` and serve it; 2 if it cannot start (a bad file)."""
    configure_logging(log_level, service=name)
    try:
        app = build()
    except startup_errors as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    event = name.removeprefix("vagent-") + "_started"
    log.warning(event, note=note, host=host, port=port, **started)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
    return 0
