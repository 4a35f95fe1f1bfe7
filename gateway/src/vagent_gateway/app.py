"""The gateway's ASGI app (skeleton: the routes come with issue 33)."""

from __future__ import annotations

from fastapi import FastAPI

from vagent_shared.settings import GatewaySettings


def create_app(settings: GatewaySettings) -> FastAPI:
    app = FastAPI(title="vagent gateway")

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    return app
