"""The client of the ticket service (TICKETS_URL), which the ticket tools act on as the asking
user. It holds no credential: each request carries the user's own (tools/tickets.py)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx


@dataclass
class TicketService:
    """Where the ticket service is (TICKETS_URL); one HTTP client per process."""

    base_url: str
    timeout: float = 10.0

    def __post_init__(self) -> None:
        self.client = httpx.AsyncClient(base_url=self.base_url.rstrip("/"), timeout=self.timeout)

    async def aclose(self) -> None:
        await self.client.aclose()
