"""`vagent-graph`: serve the graph service on HTTP_PORT."""

from __future__ import annotations

import sys

import uvicorn

from vagent_graph.app import InsecureConfigError, create_app
from vagent_graph.knowledge.parsing import quiet_parsers
from vagent_shared.logs import configure_logging
from vagent_shared.settings import GraphSettings


def main() -> None:
    settings = GraphSettings()
    configure_logging(settings.LOG_LEVEL, service="vagent-graph")
    quiet_parsers()  # documents uploaded to the admin API
    try:
        app = create_app(settings)
    except (InsecureConfigError, ValueError) as exc:
        print(f"vagent-graph: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    uvicorn.run(
        app,
        host=settings.HTTP_HOST,
        port=settings.HTTP_PORT,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
