"""`vagent-gateway`: serve LangGraph's server API on GATEWAY_PORT."""

from __future__ import annotations

import uvicorn

from vagent_gateway.app import create_app
from vagent_shared.logs import configure_logging
from vagent_shared.settings import GatewaySettings


def main() -> None:
    settings = GatewaySettings()
    configure_logging(settings.LOG_LEVEL, service="vagent-gateway")
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.GATEWAY_HOST,
        port=settings.GATEWAY_PORT,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
