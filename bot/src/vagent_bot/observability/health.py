"""`:8080/health` (sync loop alive, Redis, graph reachable) and `:8080/metrics`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

Check = Callable[[], Awaitable[bool]]


def make_app(checks: dict[str, Check]) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        results: dict[str, bool] = {}
        for name, check in checks.items():
            try:
                results[name] = bool(await asyncio.wait_for(check(), timeout=3))
            except Exception:
                results[name] = False
        ok = all(results.values())
        return web.json_response(
            {"status": "healthy" if ok else "unhealthy", "checks": results}, status=200 if ok else 503
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(checks: dict[str, Check], host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(make_app(checks), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
