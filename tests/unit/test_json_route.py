"""JsonBodyRoute (vagent_graph.json_route): a JSON body straight into its model, with what a
client sees (errors, the OpenAPI page) as FastAPI's own handler gives it, and every route
that does not fit left to FastAPI.

In-process (httpx's ASGI transport): the subject is a FastAPI route class, not a server.
The graph's own endpoints are covered through real HTTP in tests/integration/test_api.py.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

from vagent_graph.json_route import JsonBodyRoute, is_json
from vagent_shared.http_errors import install_error_handlers


class Item(BaseModel):
    name: str = Field(min_length=1)
    count: int
    tags: dict[str, str] = {}


def make_app(route_class: type[APIRoute]) -> tuple[FastAPI, list[tuple[Item, str]]]:
    """The same endpoints on FastAPI's default route class or on JsonBodyRoute."""
    app = FastAPI()
    app.router.route_class = route_class
    install_error_handlers(app)
    seen: list[tuple[Item, str]] = []

    @app.post("/items")
    async def create(item: Item, request: Request) -> JSONResponse:
        seen.append((item, request.url.path))
        return JSONResponse({"name": item.name, "count": item.count})

    @app.post("/bare")
    async def bare(item: Item) -> JSONResponse:
        return JSONResponse({"n": item.count})

    @app.post("/model", response_model=Item)
    async def model(item: Item) -> Item:  # returns a model: FastAPI serialises it
        return item.model_copy(update={"count": item.count + 1})

    @app.post("/query")
    async def query(item: Item, times: int = 1) -> JSONResponse:
        return JSONResponse({"total": item.count * times})

    def prefix() -> str:
        return "dep-"

    @app.post("/dep")
    async def dep(item: Item, p: str = Depends(prefix)) -> JSONResponse:
        return JSONResponse({"name": p + item.name})

    return app, seen


async def post(
    app: FastAPI, path: str, content: bytes, content_type: str | None = "application/json"
) -> httpx.Response:
    headers = {"content-type": content_type} if content_type else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post(path, content=content, headers=headers)


def handler_of(app: FastAPI, path: str) -> str:
    route = next(r for r in app.routes if isinstance(r, APIRoute) and r.path == path)
    return route.get_route_handler().__qualname__


def test_only_routes_that_fit_get_the_json_handler() -> None:
    app, _ = make_app(JsonBodyRoute)
    assert "_json_handler" in handler_of(app, "/items")
    assert "_json_handler" in handler_of(app, "/bare")
    for path in ("/model", "/query", "/dep"):  # a response model, a query parameter, a dependency
        assert "_json_handler" not in handler_of(app, path), path


async def test_a_valid_body_reaches_the_endpoint_as_its_model_with_the_request() -> None:
    app, seen = make_app(JsonBodyRoute)
    r = await post(app, "/items", b'{"name": "a", "count": 3, "tags": {"k": "v"}}')
    assert r.status_code == 200 and r.json() == {"name": "a", "count": 3}
    assert seen == [(Item(name="a", count=3, tags={"k": "v"}), "/items")]
    r = await post(app, "/bare", b'{"name": "a", "count": 4}', "application/json; charset=utf-8")
    assert r.json() == {"n": 4}
    r = await post(app, "/bare", b'{"name": "a", "count": 5}', "application/vnd.vagent+json")
    assert r.json() == {"n": 5}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"count": 1}',
        b'{"name": "", "count": 1}',
        b'{"name": "a", "count": "many"}',
        b'{"name": "a", "count": 1, "tags": {"k": 1}}',
        b'{"name": ["a"], "count": 1}',
    ],
)
async def test_a_field_error_reads_exactly_as_fastapi_reports_it(raw: bytes) -> None:
    ours, seen = make_app(JsonBodyRoute)
    theirs, _ = make_app(APIRoute)
    mine, reference = await post(ours, "/items", raw), await post(theirs, "/items", raw)
    assert mine.status_code == reference.status_code == 422
    assert mine.json() == reference.json()
    assert mine.json()["message"].startswith(mine.json()["details"][0]["loc"][1])
    assert seen == []


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"name": "a", "count": 1'])
async def test_a_body_that_is_no_object_is_a_clear_422(raw: bytes) -> None:
    app, seen = make_app(JsonBodyRoute)
    r = await post(app, "/items", raw)
    assert r.status_code == 422, raw
    assert r.json()["error_code"] == "invalid_request" and r.json()["message"]
    assert r.json()["details"][0]["loc"][0] == "body"
    assert seen == []


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "json"])
async def test_a_body_that_is_not_json_by_its_content_type_is_refused_unread(
    content_type: str | None,
) -> None:
    app, seen = make_app(JsonBodyRoute)
    r = await post(app, "/items", b'{"name": "a", "count": 1}', content_type)
    assert r.status_code == 422
    assert r.json()["message"] == "body: Content-Type must be application/json"
    assert seen == []


async def test_routes_left_to_fastapi_still_work() -> None:
    app, _ = make_app(JsonBodyRoute)
    r = await post(app, "/model", b'{"name": "a", "count": 1}')
    assert r.json() == {"name": "a", "count": 2, "tags": {}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/query?times=3", json={"name": "a", "count": 2})
        assert r.json() == {"total": 6}
        r = await c.post("/query?times=x", json={"name": "a", "count": 2})
        assert r.status_code == 422
    r = await post(app, "/dep", b'{"name": "a", "count": 1}')
    assert r.json() == {"name": "dep-a"}


def test_the_openapi_page_is_what_fastapi_makes_of_the_same_endpoints() -> None:
    ours: dict[str, Any] = make_app(JsonBodyRoute)[0].openapi()
    theirs: dict[str, Any] = make_app(APIRoute)[0].openapi()
    assert ours == theirs
    assert ours["paths"]["/items"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Item"
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/problem+json", True),
        (None, False),
        ("", False),
        ("text/json", False),
        ("application/jsonx", False),
        ("multipart/form-data", False),
    ],
)
def test_what_counts_as_json(value: str | None, expected: bool) -> None:
    assert is_json(value) is expected
