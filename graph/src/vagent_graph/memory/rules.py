"""May this memory be recalled here? What does a new memory record? Pure (docs/memory.md).

The three recall rules, judged at recall time against the readers of the conversation NOW:
1. the conversation's user owns it (and it was written in their current tenant);
2. every current reader heard it: the readers (asker + audience members) are a subset of
   its `heard_by` (a `--everywhere` memory was heard by everyone). Readers that are not known
   one by one (a `public_only` room, or a room whose audience is not checked) hear only
   `--everywhere` memories;
3. every current reader may read what it was derived from (`Readership.may_read`, the same
   rule `visible_history` applies to earlier tool results).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience
from vagent_shared.memory import MEMORY_MAX_CHARS, Memory, WithheldReason
from vagent_shared.readers import DocRef, EntityRef, Readership, ResultScope
from vagent_shared.secrets import looks_like_secret


def readers_now(
    ac: AcContext, audience: Audience | None, *, unchecked: bool = False
) -> frozenset[str] | None:
    """Everyone who reads this conversation: the asker and the audience's members; None when
    they are not known one by one (`public_only`, or a group room whose audience the bot does
    not check: AUDIENCE_FILTER=off)."""
    if unchecked or (audience is not None and audience.public_only):
        return None
    others = frozenset(m.user_id for m in audience.members) if audience is not None else frozenset()
    return others | {ac.user_id}


def hearers(ac: AcContext, audience: Audience | None, *, unchecked: bool = False) -> tuple[str, ...]:
    """Who hears a memory written now: the asker and every reader known by name (in a room
    whose readers are not known, the asker only: such a memory is recalled in their DMs and
    wherever only they read)."""
    found = readers_now(ac, audience, unchecked=unchecked) or frozenset({ac.user_id})
    return tuple(sorted(found))


def withheld_reason(
    memory: Memory, readership: Readership, *, unchecked: bool = False
) -> WithheldReason | None:
    """None when `memory` may be recalled for `readership` (rules 2 and 3); else why not.
    Rule 1 (owner and tenant) is not a reason to report: another user's memory is never a
    candidate (`is_candidate`)."""
    readers = readers_now(readership.ac, readership.audience, unchecked=unchecked)
    if not memory.everywhere and (readers is None or not readers <= set(memory.heard_by)):
        return "not_heard"
    if not memory.scope.empty and (unchecked or not readership.may_read(memory.scope)):
        # readers nobody checked cannot be judged against what it was derived from
        return "source_not_readable"
    return None


def is_candidate(memory: Memory, ac: AcContext) -> bool:
    """Rule 1: the asker's own memory, from their current tenant."""
    return memory.owner == ac.user_id and memory.domain == ac.active_acl_domain


def may_recall(memory: Memory, readership: Readership, *, unchecked: bool = False) -> bool:
    """All three rules (the last check before anything reaches the model)."""
    return (
        is_candidate(memory, readership.ac)
        and withheld_reason(memory, readership, unchecked=unchecked) is None
    )


def union_scope(scopes: Iterable[ResultScope | None], domain: str) -> ResultScope:
    """What a memory written after these results was derived from: every document and entity
    any of them showed; personal to its owner if any was, shown only to the readers every
    personal one was shown to. A damaged scope (no domain match, personal to someone else)
    makes the memory readable by nobody but under the strictest rule."""
    # keyed by the whole ref, not the id: a document seen twice with different categories or
    # tags (re-tagged during the turn) must be judged under both, not under the last seen
    documents: dict[tuple[str, str, tuple[str, ...]], DocRef] = {}
    entities: dict[tuple[str, str, tuple[str, ...]], EntityRef] = {}
    personal: str | None = None
    shown: set[str] | None = None
    strict = False
    for scope in scopes:
        if scope is None or scope.empty:
            continue
        if (scope.documents or scope.entities) and scope.domain != domain:
            strict = True
        documents.update(((d.doc_id, d.category, d.tags), d) for d in scope.documents)
        entities.update(((e.id, e.entity_type, e.tags), e) for e in scope.entities)
        if scope.personal_to is not None:
            if personal is not None and scope.personal_to != personal:
                strict = True
            personal = scope.personal_to
            shown = set(scope.shown_to) if shown is None else shown & set(scope.shown_to)
    if strict:
        return ResultScope(domain=domain, personal_to="")  # nobody reads it (scope_of's rule)
    return ResultScope(
        domain=domain,
        documents=tuple(documents[k] for k in sorted(documents)),
        entities=tuple(entities[k] for k in sorted(entities)),
        personal_to=personal,
        shown_to=tuple(sorted(shown or ())),
    )


def refusal(text: str) -> str | None:
    """Why `text` is not stored (a short reason the user reads), or None."""
    stripped = text.strip()
    if not stripped:
        return "there is nothing to remember."
    if len(stripped) > MEMORY_MAX_CHARS:
        return f"a memory is at most {MEMORY_MAX_CHARS} characters (this is {len(stripped)})."
    if looks_like_secret(stripped):
        return "it looks like a secret (a password, key or token); secrets are never stored."
    return None


def recallable(
    candidates: Iterable[Memory], readership: Readership, k: int, *, unchecked: bool = False
) -> tuple[list[Memory], Counter[WithheldReason]]:
    """The first `k` of `candidates` (most relevant first) that may be recalled, and how many
    of the others were withheld, by reason. Another user's or tenant's memory is dropped
    silently (it should never have been a candidate; the store's query is per owner)."""
    found: list[Memory] = []
    withheld: Counter[WithheldReason] = Counter()
    for memory in candidates:
        if len(found) >= k:
            break
        if not is_candidate(memory, readership.ac):
            continue
        reason = withheld_reason(memory, readership, unchecked=unchecked)
        if reason is None:
            found.append(memory)
        else:
            withheld[reason] += 1
    return found, withheld
