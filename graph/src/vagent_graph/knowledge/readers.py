"""Who reads an answer, and what each reader may read: the knowledge stores' names for the
rule in `vagent_shared.readers` (one copy: the bot judges 🔍 accounts by it too).

An answer posted into a room is read by the asking user AND every other joined member.
Knowledge (a chunk, an entity) may be used only if EVERY reader may read it, in the asking
user's ACTIVE domain. The document filter (doc_filter.py) and the entity filter
(entity_filter.py) are built from these values, never from an AcContext directly.
"""

from __future__ import annotations

from vagent_shared.readers import (
    DOCUMENT_KINDS,
    ENTITY_KINDS,
    WILDCARD,
    Grants,
    Readers,
    grants_for,
    readers_for,
)

__all__ = ["DOCUMENT_KINDS", "ENTITY_KINDS", "WILDCARD", "Grants", "Readers", "grants_for", "readers_for"]
