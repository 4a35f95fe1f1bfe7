"""The JSON error body (`ErrorResponse`) for every FastAPI service of the project.

Needs the `http` extra (FastAPI); the graph and the development provider both install it.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from vagent_shared.wire import ErrorResponse


def api_error(status: int, code: str, message: str) -> HTTPException:
    return HTTPException(status, detail={"error_code": code, "message": message})


def install_error_handlers(app: FastAPI) -> None:
    """422 with the first problem spelled out, and HTTPExceptions as ErrorResponse bodies."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        body = ErrorResponse(
            error_code="invalid_request", message=f"{where}: {first['msg']}", details=details
        )
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc.detail, dict):
            body = ErrorResponse(**exc.detail)
        else:
            body = ErrorResponse(error_code=f"http_{exc.status_code}", message=str(exc.detail))
        return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)
