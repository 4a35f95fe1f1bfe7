"""What a tool may work with: the stores and clients the service opens once (resources.py)
and hands to every call in `ToolContext.services`, looked up by type.

A new capability brings its own service type instead of a field on the context. The clients
live here, beside the lookup (records.py: the demo database; tickets.py: the ticket service;
credentials.py: the Credential Registry; audit.py: the audit trail for the current call);
the knowledge stores are vagent_graph.knowledge's DocumentStore and EntityStore. Nothing
here knows a tool: the tools depend on the services, never the other way round.
"""

from __future__ import annotations

from typing import Any, TypeVar

S = TypeVar("S")


class ServiceUnavailable(LookupError):
    """A tool needs a service this process was not started with."""


class Services:
    """The stores and clients tools may use, one instance per type (built once at start)."""

    def __init__(self, *services: object) -> None:
        self._by_type: dict[type[Any], object] = {type(s): s for s in services}

    def find(self, kind: type[S]) -> S | None:
        found = self._by_type.get(kind)
        if found is None:  # a subclass registered for its base type
            found = next((s for s in self._by_type.values() if isinstance(s, kind)), None)
        return found  # type: ignore[return-value]

    def get(self, kind: type[S]) -> S:
        found = self.find(kind)
        if found is None:
            raise ServiceUnavailable(f"{kind.__name__} is not configured")
        return found


__all__ = ["ServiceUnavailable", "Services"]
