"""Who reads an answer, and whether they may all read what something was derived from. Pure.

Why here, once: the graph filters documents, entities and the history by it, and the bot
judges a 🔍 account by it against whoever reads the room WHEN it is asked (a DM that gained a
member, a newcomer in a group room), long after the turn. Two copies of the rule would drift.

An answer posted into a room is read by the asking user AND every other joined member.
Knowledge (a chunk, an entity) may be used only if EVERY reader may read it, in the asking
user's ACTIVE domain. The graph's document and entity filters are built from `Readers`,
never from an AcContext directly. What a result was derived from is its `ResultScope`;
`Readership.may_read` says whether everyone reading now may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from vagent_shared.access import AcContext, Resource
from vagent_shared.knowledge import PUBLIC_TAG, Audience

#: The instance kinds that grant documents, and those that grant entities.
DOCUMENT_KINDS = (Resource.DOCUMENT, Resource.DOCUMENT_CATEGORY, Resource.DOCUMENT_TAG)
ENTITY_KINDS = (Resource.ENTITY, Resource.ENTITY_TYPE, Resource.ENTITY_TAG)
WILDCARD = "*"


@dataclass(frozen=True)
class Grants:
    """What ONE reader may read: items whose id, OR class (category / entity type), OR one of
    whose tags is granted. `all_*`: a kind wildcard (`document:*`, `document_tag:*`...).
    A superuser reads everything in the active domain."""

    superuser: bool = False
    ids: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    all_ids: bool = False
    all_classes: bool = False
    all_tags: bool = False

    @property
    def everything(self) -> bool:
        """The whole domain: superuser, any id, or any class (every item has one)."""
        return self.superuser or self.all_ids or self.all_classes

    @property
    def nothing(self) -> bool:
        return not (self.everything or self.all_tags or self.ids or self.classes or self.tags)

    def allows(self, item_id: str, item_class: str, item_tags: frozenset[str] | set[str]) -> bool:
        """The reference semantics, for tests and brute-force checks (the stores push the
        same rule down into their queries)."""
        if self.everything:
            return True
        if self.all_tags and item_tags:
            return True
        return item_id in self.ids or item_class in self.classes or bool(self.tags & set(item_tags))


def grants_for(ac: AcContext, kinds: tuple[Resource, Resource, Resource]) -> Grants:
    """The grants of the ACTIVE roles in the ACTIVE domain for (id, class, tag) `kinds`.
    Instances of other kinds, or malformed ones, grant nothing here."""
    if ac.is_superuser():
        return Grants(superuser=True)
    id_kind, class_kind, tag_kind = kinds
    found: dict[Resource, set[str]] = {k: set() for k in kinds}
    for instance in ac.granted_instances():
        try:
            kind, name = Resource.parse(instance)
        except ValueError:
            continue
        if kind in found:
            found[kind].add(name)
    return Grants(
        ids=frozenset(found[id_kind] - {WILDCARD}),
        classes=frozenset(found[class_kind] - {WILDCARD}),
        tags=frozenset(found[tag_kind] - {WILDCARD}),
        all_ids=WILDCARD in found[id_kind],
        all_classes=WILDCARD in found[class_kind],
        all_tags=WILDCARD in found[tag_kind],
    )


@dataclass(frozen=True)
class Readers:
    """Everyone who reads the answer, in one domain: an item is usable iff every reader's
    grants allow it (and, with `public_only`, it is tagged public)."""

    domain: str
    grants: tuple[Grants, ...]
    public_only: bool = False

    def allows(self, item_id: str, item_class: str, item_tags: frozenset[str] | set[str]) -> bool:
        if self.public_only and PUBLIC_TAG not in item_tags:
            return False
        return all(g.allows(item_id, item_class, item_tags) for g in self.grants)


def readers_for(
    ac: AcContext, audience: Audience | None, kinds: tuple[Resource, Resource, Resource]
) -> Readers | None:
    """The readers of an answer to `ac`'s user, or None when nothing at all may be used:
    a reader who may read nothing (an unresolved member included) or a member whose
    AcContext is for another domain."""
    domain = ac.active_acl_domain
    contexts: list[AcContext] = [ac]
    public_only = False
    if audience is not None:
        public_only = audience.public_only
        for member in audience.members:
            if member.ac_context is None or member.ac_context.active_acl_domain != domain:
                return None
            contexts.append(member.ac_context)
    grants = tuple(grants_for(c, kinds) for c in contexts)
    if any(g.nothing for g in grants):
        return None
    return Readers(domain=domain, grants=_fold(grants), public_only=public_only)


def _fold(grants: tuple[Grants, ...]) -> tuple[Grants, ...]:
    """Readers who see the whole domain add no condition; identical grants count once
    (a room of 50 colleagues with the same role is one clause, not 50)."""
    out = tuple(dict.fromkeys(g for g in grants if not g.everything))
    return out or (Grants(superuser=True),)


class DocRef(BaseModel):
    """A document a result quoted, with what decides who may read it."""

    model_config = ConfigDict(frozen=True)

    doc_id: str
    category: str = ""
    tags: tuple[str, ...] = ()


class EntityRef(BaseModel):
    """An entity a result showed, with what decides who may see it."""

    model_config = ConfigDict(frozen=True)

    id: str
    entity_type: str = ""
    tags: tuple[str, ...] = ()


class ResultScope(BaseModel):
    """What one tool result was derived from. `personal_to`: the result is that user's own
    (their tickets, something done with their credential); `shown_to`: the other readers that
    user let see it (a group room where they said yes, or PERSONAL_RESULTS_IN_GROUPS=allow)."""

    model_config = ConfigDict(frozen=True)

    domain: str = ""
    documents: tuple[DocRef, ...] = ()
    entities: tuple[EntityRef, ...] = ()
    personal_to: str | None = None
    shown_to: tuple[str, ...] = Field(default=())

    @property
    def empty(self) -> bool:
        return not (self.documents or self.entities) and self.personal_to is None


@dataclass
class Readership:
    """Who reads the answer now: the asker and, in a group room, the audience."""

    ac: AcContext
    audience: Audience | None
    _readers: dict[str, Readers | None] = field(default_factory=dict, repr=False)

    def _for(self, what: str) -> Readers | None:
        if what not in self._readers:
            kinds = DOCUMENT_KINDS if what == "documents" else ENTITY_KINDS
            self._readers[what] = readers_for(self.ac, self.audience, kinds)
        return self._readers[what]

    def others(self) -> frozenset[str] | None:
        """The other readers' ids; None when they are not known one by one (a large room)."""
        if self.audience is None:
            return frozenset()
        if self.audience.public_only:
            return None
        return frozenset(m.user_id for m in self.audience.members)

    def may_read(self, scope: ResultScope) -> bool:
        """May EVERY current reader read what `scope` was derived from?"""
        for items, what in ((scope.documents, "documents"), (scope.entities, "entities")):
            if not items:
                continue
            readers = self._for(what)
            if readers is None or readers.domain != scope.domain:
                return False
            for item in items:
                item_id, item_class = (
                    (item.doc_id, item.category) if isinstance(item, DocRef) else (item.id, item.entity_type)
                )
                if not readers.allows(item_id, item_class, frozenset(item.tags)):
                    return False
        if scope.personal_to is not None:
            if scope.personal_to != self.ac.user_id:
                return False
            others = self.others()
            if others is None or not others <= set(scope.shown_to):
                return False
        return True
