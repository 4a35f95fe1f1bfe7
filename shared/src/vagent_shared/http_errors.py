"""The JSON error body (`ErrorResponse`) for every FastAPI service of the project.

Needs the `http` extra (FastAPI); the graph and the development provider both install it.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vagent_shared.wire import ErrorResponse


def api_error(status: int, code: str, message: str) -> HTTPException:
    return HTTPException(status, detail={"error_code": code, "message": message})


def install_error_handlers(app: FastAPI) -> None:
    """422 with the first problem spelled out, and HTTPExceptions as ErrorResponse bodies:
    also Starlette's own (FastAPI raises those for a body it cannot read, and for 404/405)."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        message = f"{where}: {first['msg']}"
        if exc.errors() and exc.errors()[0].get("type") == "json_invalid":  # loc: body, offset
            message = f"body: {first['msg']} at character {where}"
        body = ErrorResponse(error_code="invalid_request", message=message, details=details)
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.detail, dict):
            body = ErrorResponse(**exc.detail)
        else:
            code = "bad_request" if exc.status_code == 400 else f"http_{exc.status_code}"
            body = ErrorResponse(error_code=code, message=str(exc.detail))
        return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)
