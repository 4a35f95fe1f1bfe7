"""`vagent-bot`: the Matrix client. SIGTERM stops syncing and finishes in-flight answers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

import structlog
from redis.asyncio import Redis

from vagent_bot.access.flood import BotFloodControl
from vagent_bot.access.provider import make_access_provider
from vagent_bot.bot import VagentBot
from vagent_bot.clients.graph_client import GraphClient
from vagent_bot.matrix import client as matrix
from vagent_bot.observability import health, metrics
from vagent_shared import audit_trail, redis_connect
from vagent_shared.logs import configure_logging
from vagent_shared.settings import BotSettings
from vagent_shared.telemetry import setup_tracing

log = structlog.get_logger("vagent_bot")


def redis_client(settings: BotSettings) -> Redis:
    """The bot's one Redis client; with a redis+sentinel:// REDIS_URL it follows the master."""
    return redis_connect.connect(
        settings.REDIS_URL,
        max_connections=settings.REDIS_MAX_CONNECTIONS,
        socket_timeout=10,
        socket_connect_timeout=5,
    )


async def amain(settings: BotSettings) -> int:
    redis = redis_client(settings)
    token = settings.GRAPH_API_TOKEN.get_secret_value() if settings.GRAPH_API_TOKEN else None
    graph = GraphClient(settings.GRAPH_API_ENDPOINT, token, max_connections=settings.GRAPH_MAX_CONNECTIONS)
    audit = audit_trail.from_settings(
        settings, "bot", redis, lambda reason: metrics.AUDIT_WRITE_FAILURES.labels(reason).inc()
    )
    audit.start()
    access = make_access_provider(settings, audit)
    flood = BotFloodControl(redis, settings.FLOOD_MAX_MESSAGES, settings.FLOOD_WINDOW_SECONDS)
    client = matrix.make_client(settings)
    bot = VagentBot(settings, client, redis, graph, access, flood, audit)

    async def redis_ok() -> bool:
        return bool(await redis.ping())  # type: ignore[misc]

    async def sync_ok() -> bool:
        return bot.sync_alive()

    runner = await health.serve(
        {"sync": sync_ok, "redis": redis_ok, "graph": graph.healthy},
        settings.BOT_HEALTH_HOST,
        settings.BOT_HEALTH_PORT,
    )
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    run = asyncio.create_task(bot.run())
    stop = asyncio.create_task(stopping.wait())
    code = 0
    try:
        done, _ = await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        if run in done and run.exception():
            log.error("bot_failed", error=str(run.exception()))
            code = 1
    finally:
        log.info("bot_stopping")
        await bot.stop()
        for t in (run, stop):
            t.cancel()
            with contextlib.suppress(BaseException):
                await t
        await runner.cleanup()
        await client.close()
        await graph.aclose()
        await access.aclose()
        await audit.aclose()
        await redis.aclose()
        log.info("bot_stopped")
    return code


def main() -> None:
    settings = BotSettings()
    configure_logging(settings.LOG_LEVEL, service="vagent-bot")
    if not (settings.MATRIX_PASSWORD or settings.MATRIX_ACCESS_TOKEN):
        print("vagent-bot: set MATRIX_PASSWORD or MATRIX_ACCESS_TOKEN", file=sys.stderr)
        raise SystemExit(2)
    tracing = setup_tracing("vagent-bot", capture=settings.OTEL_CAPTURE_CONTENT)
    try:
        code = asyncio.run(amain(settings))
    finally:
        if tracing is not None:
            tracing.shutdown()  # what is still queued is exported before the process ends
    raise SystemExit(code)


if __name__ == "__main__":
    main()
