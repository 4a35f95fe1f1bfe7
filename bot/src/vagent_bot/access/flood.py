"""The bot's flood control: the shared one (`vagent_shared.flood`, also used by the gateway,
on the same Redis key so a person's Matrix and API messages count in one window) wired to the
bot's metric (`vagent_bot_flood_rejected_total`) and logger name (`vagent_bot.access.flood`)."""

from __future__ import annotations

from typing import Any, ClassVar

import structlog
from redis.asyncio import Redis

from vagent_bot.observability import metrics
from vagent_shared.flood import FloodControl

__all__ = ["BotFloodControl"]


class BotFloodControl(FloodControl):
    """The shared FloodControl counting refusals in the bot's Prometheus metric."""

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(self, redis: Redis, max_messages: int, window_seconds: float) -> None:
        super().__init__(redis, max_messages, window_seconds, on_rejected=metrics.FLOOD_REJECTED.inc)
