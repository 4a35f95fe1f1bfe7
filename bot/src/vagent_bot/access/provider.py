"""The bot's AccessControlProvider client: the shared one (`vagent_shared.access_provider`,
also used by the gateway) wired to the bot's Prometheus metrics and HTTP proxy.

Why a subclass and not a copy: the layer-1 rule and its fail-closed client must exist once.
What stays here is only what is the bot's own: its metric names
(`vagent_bot_access_decisions_total`, `vagent_bot_acp_errors_total`,
`vagent_bot_acp_request_seconds`), its proxy lookup (`vagent_bot.clients.http.proxy_for`) and its
logger name (`vagent_bot.access.provider`, which operators' log queries know).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

import aiohttp
import structlog

from vagent_bot.clients.http import proxy_for
from vagent_bot.observability.metrics import ACCESS, ACP_ERRORS, ACP_SECONDS
from vagent_shared.access_provider import AUTHENTICATE_PATH, AccessProvider, AccessResult, ProviderMetrics
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.settings import BotSettings

__all__ = ["BOT_METRICS", "AccessResult", "BotAccessProvider", "make_access_provider"]

#: The bot's Prometheus metrics, fed by the shared client's hooks.
BOT_METRICS: Final = ProviderMetrics(
    decision=lambda reason: ACCESS.labels(reason).inc(),
    error=lambda kind: ACP_ERRORS.labels(kind).inc(),
    seconds=ACP_SECONDS.observe,
)


class BotAccessProvider(AccessProvider):
    """The shared AccessProvider with the bot's metrics, the environment's proxy for the
    provider's URL (read once, as all the bot's HTTP calls do) and the bot's logger name."""

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(
        self,
        base_url: str,
        timeout: float,
        agent_id: str,
        client: aiohttp.ClientSession | None = None,
        audit: AuditTrail | None = None,
    ) -> None:
        super().__init__(
            base_url,
            timeout,
            agent_id,
            client,
            audit,
            metrics=BOT_METRICS,
            proxy=proxy_for(base_url.rstrip("/") + AUTHENTICATE_PATH),
        )


def make_access_provider(settings: BotSettings, audit: AuditTrail | None) -> BotAccessProvider:
    """The bot process's one provider client, from its settings."""
    return BotAccessProvider(
        settings.ACCESS_CONTROL_PROVIDER_URL, settings.ACP_TIMEOUT_SECONDS, settings.AGENT_ID, audit=audit
    )
