"""An aiohttp session made on first use: the services' HTTP clients (graph, media, speech)
are built before the event loop runs, and an aiohttp session belongs to
the loop it was made in."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp


class LazySession:
    """An aiohttp session made on first use (it belongs to the running loop), or the one a
    caller handed in; `aclose` closes only one it made itself."""

    def __init__(
        self,
        given: aiohttp.ClientSession | None = None,
        make: Callable[[], aiohttp.ClientSession] = aiohttp.ClientSession,
    ) -> None:
        self._session, self._owned, self._make = given, given is None, make

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = self._make()
        return self._session

    async def aclose(self) -> None:
        if self._owned and self._session is not None:
            await self._session.close()
            self._session = None
