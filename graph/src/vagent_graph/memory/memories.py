"""The memory service the workflow, the `remember` tool and the commands share: the store,
the descriptor's policy, and the audit records of every write, recall and deletion (ids and
counts, never the text). The decisions are rules.py's; this is the I/O around them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import structlog

from vagent_graph.memory.rules import hearers, is_candidate, readers_now, recallable, refusal, withheld_reason
from vagent_graph.memory.store import MemoryStore
from vagent_graph.observability import metrics
from vagent_graph.services import Services
from vagent_graph.services.audit import audit
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience
from vagent_shared.memory import Memory, MemoryPolicy, Origin, WithheldReason, one_line
from vagent_shared.readers import Readership, ResultScope
from vagent_shared.session import SessionId

log = structlog.get_logger(__name__)

#: Candidates read per page while looking for `recall_k` memories this conversation may
#: recall: twice as many as wanted (some may be withheld here), at least this many.
MIN_PAGE = 10


@dataclass(frozen=True)
class Prefetch:
    """What `prefetch` started for a message: how many memories its asker has (None: the
    count failed), which recall then need not ask again; and, once the lock is held, the
    whole recall (`early`)."""

    owner: str
    domain: str
    count: asyncio.Task[int | None]
    early: Early | None = None


@dataclass(frozen=True)
class Refused:
    """A memory that was not stored, and why (a short reason the user reads)."""

    reason: str


@dataclass(frozen=True)
class Recall:
    """What a turn recalled, and how many memories were withheld here (by reason)."""

    memories: list[Memory]
    withheld: Counter[WithheldReason]


@dataclass(frozen=True)
class Early:
    """A recall started once the session's lock is held (`start_recall`), for these readers
    and this question: the model node takes its result when it asks the same."""

    ac: AcContext
    audience: Audience | None
    query: str
    unchecked: bool
    found: asyncio.Task[Recall]

    def serves(self, readership: Readership, query: str, unchecked: bool) -> bool:
        return (self.ac, self.audience, self.query, self.unchecked) == (
            readership.ac,
            readership.audience,
            query,
            unchecked,
        )


async def _none() -> None:
    return None


def _ended(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:  # recall says so when it is taken
        log.debug("memory_prefetch_failed", error_type=type(task.exception()).__name__)


def room_of(session_id: str) -> str:
    return SessionId.parse(session_id).room_id if SessionId.is_valid(session_id) else ""


class Memories:
    """The memories of every user, as the workflow uses them (one per service)."""

    def __init__(self, store: MemoryStore, policy: MemoryPolicy, services: Services) -> None:
        self.store = store
        self.policy = policy
        #: The audit trail is looked up here, when used (Services is complete by then).
        self.services = services
        #: Prefetches and early recalls running (a task is kept until it ends).
        self._prefetching: set[asyncio.Task[Any]] = set()

    # ---- writing -------------------------------------------------------------------------
    async def write(
        self,
        ac: AcContext,
        session_id: str,
        audience: Audience | None,
        text: str,
        *,
        unchecked: bool = False,
        everywhere: bool = False,
        scope: ResultScope | None = None,
        origin: Origin = "tool",
    ) -> Memory | Refused:
        """Store what the user (or the model, for them) asked to remember, heard by everyone
        reading now; refused (never stored) when empty, too long or secret-looking."""
        text = one_line(text)
        why = refusal(text)
        if why is not None:
            metrics.MEMORY_OPS.labels("write", "refused").inc()
            log.info("memory_refused", origin=origin, chars=len(text))
            return Refused(why)
        memory = Memory(
            id=uuid.uuid4().hex[:12],
            owner=ac.user_id,
            domain=ac.active_acl_domain,
            text=text,
            room_id=room_of(session_id),
            heard_by=hearers(ac, audience, unchecked=unchecked),
            everywhere=everywhere,
            scope=scope or ResultScope(domain=ac.active_acl_domain),
            origin=origin,
        )
        dropped = await self.store.add(memory, self.policy)
        metrics.MEMORY_OPS.labels("write", "ok").inc()
        audit(
            self.services,
            "memory_written",
            ac,
            session_id,
            resource=f"memory:{memory.id}",
            decision="done",
            metadata={
                "id": memory.id,
                "origin": origin,
                "hearers": len(memory.heard_by),
                "everywhere": everywhere,
                "derived_from": {
                    "documents": len(memory.scope.documents),
                    "entities": len(memory.scope.entities),
                },
            },
        )
        if dropped:
            self.deleted(ac, session_id, [m.id for m in dropped], "max_per_user")
        return memory

    # ---- recall --------------------------------------------------------------------------
    def prefetch(self, ac: AcContext, question: str) -> Prefetch | None:
        """A message arrived: count the asker's memories and, when recall will rank (more
        than `recall_k`), start embedding the question now, while the session's lock, its
        checkpoint and the graph's start are awaited. Returns at once; recall takes the count
        from here (one Redis round trip less) and finds the vector ready or in flight
        (bench-memory: the embedding is most of recall's cost)."""
        if not self.policy.recall_k or not question.strip() or not ac.user_id:
            return None
        task = self._keep(asyncio.create_task(self._prefetch(ac, question), name="memory-prefetch"))
        return Prefetch(ac.user_id, ac.active_acl_domain, task)

    def start_recall(
        self,
        prefetched: Prefetch,
        readership: Readership,
        query: str,
        *,
        unchecked: bool = False,
    ) -> Prefetch:
        """The session's lock is held: start the whole recall for these readers now, while the
        checkpoint is read and the graph starts, so the model node finds it done (its Redis
        round trips are off the turn's path). Started only under the lock: every earlier
        turn of the session (a memory written or forgotten) has ended. Nothing is audited
        until the node takes it (`recall`); a recall the node does not take is dropped."""
        found = self._find(readership, query, unchecked=unchecked, prefetched=prefetched)
        task = self._keep(asyncio.create_task(found, name="memory-recall"))
        early = Early(readership.ac, readership.audience, query, unchecked, task)
        return replace(prefetched, early=early)

    def _keep(self, task: asyncio.Task[Any]) -> asyncio.Task[Any]:
        """Hold a background task until it ends; a failure no one awaited is only logged."""
        self._prefetching.add(task)
        task.add_done_callback(_ended)
        task.add_done_callback(self._prefetching.discard)
        return task

    async def _prefetch(self, ac: AcContext, question: str) -> int | None:
        try:
            count = await self.store.count(ac.user_id, ac.active_acl_domain)
        except Exception as exc:  # recall will try again, and say so if it fails
            log.debug("memory_prefetch_failed", error_type=type(exc).__name__)
            return None
        if count > self.policy.recall_k:
            self.store.warm(question)
        return count

    async def _count(self, owner: str, domain: str, prefetched: Prefetch | None) -> int:
        """How many memories the asker has: as the message's prefetch counted them (same
        asker), else asked now. A memory written meanwhile only changes whether recall ranks;
        every memory recalled is checked here either way."""
        if prefetched is not None and (prefetched.owner, prefetched.domain) == (owner, domain):
            counted = await prefetched.count
            if counted is not None:
                return counted
        return await self.store.count(owner, domain)

    async def recall(
        self,
        readership: Readership,
        session_id: str,
        query: str,
        *,
        unchecked: bool = False,
        prefetched: Prefetch | None = None,
    ) -> Recall:
        """The `recall_k` memories most relevant to `query` this conversation may recall:
        the asker's own (the store's query is per owner and tenant), re-checked here, and
        audited. `prefetched`: what `prefetch` (and `start_recall`) started for this message;
        its early recall is taken only when made for these readers and this question."""
        early = prefetched.early if prefetched is not None else None
        if early is not None and early.serves(readership, query, unchecked) and not early.found.cancelled():
            found = await early.found
        else:
            found = await self._find(readership, query, unchecked=unchecked, prefetched=prefetched)
        self._audit_recall(readership.ac, session_id, found)
        return found

    async def _find(
        self,
        readership: Readership,
        query: str,
        *,
        unchecked: bool = False,
        prefetched: Prefetch | None = None,
    ) -> Recall:
        ac, k = readership.ac, self.policy.recall_k
        found: list[Memory] = []
        withheld: Counter[WithheldReason] = Counter()
        started = time.perf_counter()
        owner, domain = ac.user_id, ac.active_acl_domain
        # Who must have heard a memory, asked of Redis too (all of the asker's in a DM).
        readers = readers_now(ac, readership.audience, unchecked=unchecked)
        heard_by: frozenset[str] | None = frozenset() if readers == frozenset({owner}) else readers
        # Both asked at once: how many memories the asker has, and which of them the readers
        # heard (those Redis leaves out are withheld too).
        count, heard = await asyncio.gather(
            self._count(owner, domain, prefetched),
            self.store.heard_ids(owner, domain, heard_by) if heard_by != frozenset() else _none(),
        )
        if count <= k:  # most people have a few: all are candidates, no ranking, no embedding
            if count:
                few = await self.store.search(owner, domain, "", k + 1)
                found, withheld = recallable(few, readership, k, unchecked=unchecked)
        elif heard is not None and count > len(heard):
            withheld["not_heard"] += count - len(heard)
        page, offset = max(2 * k, MIN_PAGE), 0
        while count > k and len(found) < k and offset < self.policy.max_per_user:
            if heard is not None and not heard:
                break
            batch = await self.store.search(
                owner, domain, query or "", page, offset, hearers=heard_by, heard=heard
            )
            more, held = recallable(batch, readership, k - len(found), unchecked=unchecked)
            found += more
            withheld += held
            if len(batch) < page:
                break
            offset += page
        metrics.MEMORY_RECALL_SECONDS.observe(time.perf_counter() - started)
        return Recall(found, withheld)

    def _audit_recall(self, ac: AcContext, session_id: str, recall: Recall) -> None:
        found, withheld = recall.memories, recall.withheld
        if found:
            audit(
                self.services,
                "memory_recalled",
                ac,
                session_id,
                resource="memory",
                decision="allowed",
                metadata={"ids": [m.id for m in found], "count": len(found)},
            )
        for reason, count in sorted(withheld.items()):
            audit(
                self.services,
                "memory_withheld",
                ac,
                session_id,
                resource="memory",
                decision="denied",
                reason="not heard by every reader" if reason == "not_heard" else "source not readable",
                metadata={"count": count, "reason": reason},
            )

    # ---- seeing and forgetting -----------------------------------------------------------
    async def here(
        self, readership: Readership, *, unchecked: bool = False, direct: bool = False
    ) -> list[Memory]:
        """The asker's memories `!memory` lists (and `!forget N` numbers), oldest first: in
        a direct chat all of them, elsewhere those this conversation may recall."""
        stored = await self.store.all_of(readership.ac.user_id, readership.ac.active_acl_domain)
        mine = [m for m in stored if is_candidate(m, readership.ac)]
        if direct:
            return mine
        return [m for m in mine if withheld_reason(m, readership, unchecked=unchecked) is None]

    async def forget(self, ac: AcContext, session_id: str, ids: list[str], reason: str) -> int:
        """Delete these of the asker's memories (in their current tenant)."""
        count = await self.store.delete(ac.user_id, ac.active_acl_domain, ids)
        if count:
            self.deleted(ac, session_id, ids, reason, count)
        return count

    async def forget_all(self, ac: AcContext, session_id: str) -> int:
        count = await self.store.delete_all(ac.user_id, ac.active_acl_domain)
        if count:
            self.deleted(ac, session_id, [], "forget_all", count)
        return count

    def deleted(
        self, ac: AcContext, session_id: str, ids: list[str], reason: str, count: int | None = None
    ) -> None:
        metrics.MEMORY_OPS.labels("delete", reason).inc(count if count is not None else len(ids))
        audit(
            self.services,
            "memory_deleted",
            ac,
            session_id,
            resource="memory",
            decision="done",
            reason=reason,
            metadata={"ids": ids[:20], "count": count if count is not None else len(ids)},
        )
