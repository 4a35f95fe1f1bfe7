"""Property-based proof of the memory recall rules (vagent_graph.memory.rules, docs/memory.md).

Random sequences of actions over four users, two tenants, a DM per user and two group rooms:
a user writes a memory (in a room, maybe `--everywhere`, after tool results with random
scopes), people join and leave rooms, a user's roles (and active tenant) change, a user
recalls in a room. The test keeps its own model of the world (who is in which room at every
moment, each user's current AcContext) and checks every recall against an oracle built from
that model and `Grants.allows` alone (not `Readership.may_read`, not `readers_now`):
- safety: a recalled memory is the asker's, of their current tenant; every current reader was
  in the room when it was written (or it is `--everywhere`); every current reader's CURRENT
  AcContext allows every document and entity it was derived from, personal results only for
  those they were shown to;
- completeness: every memory meeting those conditions is recalled, in the order given, and
  every one of the asker's withheld memories is counted under the right reason;
- `rules.hearers` at write time names exactly who was in the room.
And the scope a memory records (`rules.union_scope`) is readable exactly when every tool
result it was written after would be.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vagent_graph.memory import rules
from vagent_shared.access import AcContext
from vagent_shared.knowledge import PUBLIC_TAG, Audience, AudienceMember
from vagent_shared.memory import Memory, WithheldReason
from vagent_shared.readers import (
    DOCUMENT_KINDS,
    ENTITY_KINDS,
    DocRef,
    EntityRef,
    Readership,
    ResultScope,
    grants_for,
)

T = TypeVar("T")

USERS = ["@u0:x", "@u1:x", "@u2:x", "@u3:x"]
TENANTS = ["acme", "globex"]
ROOMS = [f"!dm-{i}:x" for i in range(len(USERS))] + ["!g0:x", "!g1:x"]

#: Documents and entities a tool result may show; "plan" and "ana" twice, under two labels
#: (re-tagged between two results of one turn).
DOCS = [
    DocRef(doc_id="salaries", category="hr", tags=("confidential",)),
    DocRef(doc_id="handbook", category="hr", tags=(PUBLIC_TAG,)),
    DocRef(doc_id="press", category="news", tags=(PUBLIC_TAG,)),
    DocRef(doc_id="roadmap", category="product", tags=()),
    DocRef(doc_id="plan", category="news", tags=(PUBLIC_TAG,)),
    DocRef(doc_id="plan", category="finance", tags=("confidential", "q3")),
]
ENTITIES = [
    EntityRef(id="ana", entity_type="person", tags=()),
    EntityRef(id="ana", entity_type="person", tags=(PUBLIC_TAG,)),
    EntityRef(id="northwind", entity_type="customer", tags=(PUBLIC_TAG,)),
    EntityRef(id="falcon", entity_type="project", tags=("internal",)),
]
GRANTS = [
    "agent:vagent",
    "document_category:hr",
    "document_category:news",
    "document_category:finance",
    "document_tag:public",
    "document_tag:confidential",
    "document:plan",
    "document:roadmap",
    "document_tag:*",
    "document:*",
    "entity_type:person",
    "entity_type:customer",
    "entity_tag:public",
    "entity:falcon",
    "entity_tag:*",
    "entity_type:*",
]


# ---- the world and the actions on it --------------------------------------------------------
def context(user: str, tenant: str, instances: list[str], superuser: bool) -> AcContext:
    """`user` with one active role granting `instances` in `tenant`, an inactive role granting
    everything, and a role in the other tenant granting everything (neither may count)."""
    other = next(t for t in TENANTS if t != tenant)
    return AcContext.model_validate(
        {
            "userId": user,
            "activeAclDomain": tenant,
            "activeRoles": ["reader"],
            "superuserGroups": ["admins"] if superuser else [],
            "roles": {
                tenant: [
                    {"name": "reader", "instances": instances},
                    {"name": "inactive", "instances": ["document:*", "entity:*"]},
                ],
                other: [{"name": "reader", "instances": ["document:*", "entity:*"]}],
            },
        }
    )


def subsets(items: list[T], *, half: bool = False) -> st.SearchStrategy[tuple[T, ...]]:
    """About a quarter of `items`, or half (drawn integers, not a drawn list: generating is
    fast)."""
    full = 2 ** len(items) - 1
    return st.tuples(st.integers(0, full), st.just(full) if half else st.integers(0, full)).map(
        lambda ab: tuple(x for i, x in enumerate(items) if (ab[0] & ab[1]) >> i & 1)
    )


contexts_of = st.tuples(
    st.sampled_from(TENANTS),
    subsets(GRANTS, half=True).map(list),
    st.integers(0, 14).map(lambda n: n == 0),  # a superuser now and then
)


#: A tool result's scope, its tenant and personal owner left to resolve at write time:
#: (tenant: None = the writer's, 0-1 = that one; personal: None = not personal, -1 = the
#: writer's, -2 = the writer's shown to everyone in the room (they said yes), 0-3 = that
#: user's; the scope without domain and personal_to). Mostly one document or entity, or the
#: writer's own result: a memory is then often recallable somewhere, and the rules get to say
#: yes as well as no.
Drawn = tuple[int | None, int | None, ResultScope]
tenants = st.sampled_from([None, None, None, None, None, None, 0, 1])
RELABELLED = [d for d in DOCS if d.doc_id == "plan"] + [e for e in ENTITIES if e.id == "ana"]
result_scopes: st.SearchStrategy[Drawn] = st.one_of(
    st.tuples(  # one of the items seen under two labels
        tenants,
        st.none(),
        st.sampled_from(RELABELLED).map(
            lambda x: ResultScope(documents=(x,)) if isinstance(x, DocRef) else ResultScope(entities=(x,))
        ),
    ),
    st.tuples(tenants, st.none(), st.sampled_from(DOCS).map(lambda d: ResultScope(documents=(d,)))),
    st.tuples(tenants, st.none(), st.sampled_from(ENTITIES).map(lambda e: ResultScope(entities=(e,)))),
    st.tuples(
        st.just(None),
        st.sampled_from([-2, -2, -1, -1, 0, 1, 2, 3]),
        subsets(USERS, half=True).map(lambda shown: ResultScope(shown_to=shown)),
    ),
    st.tuples(
        tenants,
        st.sampled_from([None, None, -1, 0]),
        st.builds(
            lambda docs, entities, shown: ResultScope(documents=docs, entities=entities, shown_to=shown),
            subsets(DOCS),
            subsets(ENTITIES),
            subsets(USERS, half=True),
        ),
    ),
)


big = st.integers(0, 5).map(lambda n: n == 0)  # the room has grown too large to check
user = st.integers(0, len(USERS) - 1)
room = st.sampled_from(ROOMS)
writes = st.tuples(
    st.just("write"),
    user,
    st.sampled_from([*ROOMS, *ROOMS[-2:]]),
    st.booleans(),
    big,
    st.lists(result_scopes, max_size=2),
)
actions = st.lists(
    st.one_of(
        writes,
        writes,
        st.tuples(st.just("join"), user, room),
        st.tuples(st.just("leave"), user, room),
        st.tuples(st.just("roles"), user, contexts_of),
        st.tuples(
            st.just("recall"),
            user,
            room,
            big,
            st.sampled_from([(), (), (), (USERS[1],), (USERS[2], USERS[3])]),
            st.randoms(),
        ),
    ),
    min_size=4,
    max_size=24,
)


@dataclass
class Written:
    """A memory and what the model knows about when it was written."""

    memory: Memory
    #: Who really was in the room (whether the bot could check them or not).
    in_room: frozenset[str]
    #: The tool results the model had seen: what every reader must be allowed, one by one.
    scopes: list[ResultScope]


@dataclass
class World:
    contexts: dict[str, AcContext]
    members: dict[str, set[str]] = field(default_factory=dict)
    written: list[Written] = field(default_factory=list)
    recalls: int = 0


def initial(data: st.DataObject) -> World:
    draw = data.draw
    world = World({u: context(u, *draw(contexts_of)) for u in USERS})
    for i, u in enumerate(USERS):
        world.members[ROOMS[i]] = {u}
    for r in ROOMS[len(USERS) :]:
        world.members[r] = set(draw(st.lists(st.sampled_from(USERS), min_size=1, max_size=4, unique=True)))
    return world


def audience(
    world: World, asker: str, room_id: str, public_only: bool, unresolved: frozenset[str]
) -> Audience | None:
    """What the bot would send: None alone in the room, a public_only audience for a room too
    large to check, else every other member with their CURRENT AcContext (None: the provider
    did not answer for them)."""
    if public_only:
        return Audience(public_only=True, member_count=len(world.members[room_id]) + 1)
    others = sorted(world.members[room_id] - {asker})
    if not others:
        return None
    listed = [
        AudienceMember(user_id=o, ac_context=None if o in unresolved else world.contexts[o]) for o in others
    ]
    return Audience(members=listed, member_count=len(listed) + 2)


# ---- the oracle (from the model and Grants.allows only) -------------------------------------
def reader_allows(ctx: AcContext | None, tenant: str, item: DocRef | EntityRef, public_only: bool) -> bool:
    """May this one reader (None: unresolved) read `item` of `tenant`?"""
    if ctx is None or ctx.active_acl_domain != tenant:
        return False
    if public_only and PUBLIC_TAG not in item.tags:
        return False
    if isinstance(item, DocRef):
        return grants_for(ctx, DOCUMENT_KINDS).allows(item.doc_id, item.category, frozenset(item.tags))
    return grants_for(ctx, ENTITY_KINDS).allows(item.id, item.entity_type, frozenset(item.tags))


def expected_reason(
    w: Written, asker: str, readers: dict[str, AcContext | None] | None, asker_ctx: AcContext
) -> WithheldReason | None:
    """Why the oracle withholds `w` from this conversation (readers None: not known one by one,
    a public_only room; the asker then reads alone, under the public-only rule)."""
    m = w.memory
    heard = set(m.heard_by)
    if not m.everywhere and (readers is None or not set(readers) <= heard):
        return "not_heard"
    judged = readers if readers is not None else {asker: asker_ctx}
    for scope in w.scopes:
        items: list[DocRef | EntityRef] = [*scope.documents, *scope.entities]
        for item in items:
            for ctx in judged.values():
                if scope.domain != m.domain or not reader_allows(ctx, m.domain, item, readers is None):
                    return "source_not_readable"
        if scope.personal_to is not None:
            others = set(readers or ()) - {asker}
            if readers is None or scope.personal_to != asker or not others <= set(scope.shown_to):
                return "source_not_readable"
    return None


# ---- running a sequence -------------------------------------------------------------------
def write(
    world: World, n: int, writer: str, room_id: str, everywhere: bool, public_only: bool, drawn: list[Drawn]
) -> None:
    world.members[room_id].add(writer)  # one speaks in a room one is in
    ctx = world.contexts[writer]
    aud = audience(world, writer, room_id, public_only, frozenset())
    heard = rules.hearers(ctx, aud)
    in_room = frozenset(world.members[room_id])
    # hearers at write time: exactly who was in the room, when the bot could check them
    assert heard == (tuple(sorted(in_room)) if not public_only else (writer,))
    assert set(heard) <= in_room and writer in heard
    scopes = []
    for tenant, personal, scope in drawn:
        domain = ctx.active_acl_domain if tenant is None else TENANTS[tenant]
        owner = None if personal is None else writer if personal < 0 else USERS[personal]
        update: dict[str, object] = {"domain": domain, "personal_to": owner}
        if personal == -2:
            update["shown_to"] = tuple(sorted(in_room - {writer}))
        scopes.append(scope.model_copy(update=update))
    memory = Memory(
        id=f"m{n}",
        owner=writer,
        domain=ctx.active_acl_domain,
        text=f"memory {n}",
        created_at=datetime(2026, 11, 22, tzinfo=UTC),
        room_id=room_id,
        heard_by=heard,
        everywhere=everywhere,
        scope=rules.union_scope(scopes, ctx.active_acl_domain),
    )
    world.written.append(Written(memory, in_room, scopes))


def recall(
    world: World, asker: str, room_id: str, public_only: bool, unresolved: list[str], rnd: random.Random
) -> None:
    world.members[room_id].add(asker)
    world.recalls += 1
    ctx = world.contexts[asker]
    gone = frozenset(unresolved) - {asker}
    aud = audience(world, asker, room_id, public_only, gone)
    readers: dict[str, AcContext | None] | None = None
    if not public_only:
        readers = {u: (None if u in gone else world.contexts[u]) for u in world.members[room_id]}
    candidates = [w.memory for w in world.written]
    rnd.shuffle(candidates)  # the store's relevance order: whatever it is, it is kept
    by_id = {w.memory.id: w for w in world.written}

    found, withheld = rules.recallable(candidates, Readership(ctx, aud), k=len(candidates) + 1)

    for m in found:  # safety, condition by condition
        w = by_id[m.id]
        assert m.owner == asker and m.domain == ctx.active_acl_domain, m
        if not m.everywhere:
            assert readers is not None and set(readers) <= w.in_room, (m, readers, w.in_room)
        for scope in w.scopes:
            items: list[DocRef | EntityRef] = [*scope.documents, *scope.entities]
            for item in items:
                assert scope.domain == m.domain, (m, scope)
                for reader in readers.values() if readers is not None else [ctx]:
                    assert reader_allows(reader, m.domain, item, readers is None), (m, item, reader)
            if scope.personal_to is not None:
                assert scope.personal_to == asker and readers is not None
                assert set(readers) - {asker} <= set(scope.shown_to), (m, readers, scope)

    # completeness: exactly the memories the oracle allows, in the given order; every withheld
    # one of the asker's (in their tenant) counted under its reason
    mine = [m for m in candidates if m.owner == asker and m.domain == ctx.active_acl_domain]
    reasons = {m.id: expected_reason(by_id[m.id], asker, readers, ctx) for m in mine}
    assert [m.id for m in found] == [m.id for m in mine if reasons[m.id] is None]
    assert withheld == Counter(r for r in reasons.values() if r is not None)

    # a small k: the first k of those, the rest not even judged
    k = 2
    few, _ = rules.recallable(candidates, Readership(ctx, aud), k=k)
    assert few == found[:k]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), steps=actions)
def test_a_memory_reaches_only_conversations_where_everyone_heard_it_and_may_read_its_sources(
    data: st.DataObject, steps: list[tuple[Any, ...]]
) -> None:
    world = initial(data)
    for n, step in enumerate(steps):
        match step:
            case ("write", u, room_id, everywhere, public_only, drawn):
                write(world, n, USERS[u], room_id, everywhere, public_only, drawn)
            case ("join", u, room_id):
                world.members[room_id].add(USERS[u])
            case ("leave", u, room_id):
                world.members[room_id].discard(USERS[u])
            case ("roles", u, (tenant, instances, superuser)):
                world.contexts[USERS[u]] = context(USERS[u], tenant, instances, superuser)
            case ("recall", u, room_id, public_only, unresolved, rnd):
                recall(world, USERS[u], room_id, public_only, unresolved, rnd)
    # and a last recall by every member of every room, nobody unresolved
    for room_id in ROOMS:
        for u in sorted(world.members[room_id]):
            recall(world, u, room_id, False, [], random.Random(0))


def test_the_oracle_is_not_vacuous() -> None:
    """The property above must see recalls AND withholdings of both kinds: a hand-made run."""
    alice, bob = USERS[0], USERS[1]
    hr = ["document_category:hr", "document_tag:public"]
    world = World({u: context(u, "acme", hr, False) for u in USERS})
    world.members = {r: set() for r in ROOMS}
    world.members[ROOMS[0]] = {alice}
    world.members["!g0:x"] = {alice, bob}
    salaries = (None, None, ResultScope(documents=(DOCS[0],)))
    write(world, 0, alice, ROOMS[0], False, False, [])  # DM
    write(world, 1, alice, "!g0:x", False, False, [salaries])  # group, HR source
    write(world, 2, alice, "!g0:x", True, False, [])  # everywhere
    recall(world, alice, ROOMS[0], False, [], random.Random(1))  # all three in her DM
    world.contexts[bob] = context(bob, "acme", ["document_tag:public"], False)  # bob loses HR
    readership = Readership(world.contexts[alice], audience(world, alice, "!g0:x", False, frozenset()))
    found, withheld = rules.recallable([w.memory for w in world.written], readership, k=10)
    assert [m.id for m in found] == ["m2"]
    assert withheld == {"not_heard": 1, "source_not_readable": 1}
    recall(world, alice, "!g0:x", False, [], random.Random(2))


@st.composite
def readerships(draw: st.DrawFn) -> Readership:
    """Any user reading alone, with up to three others (now and then unresolved), or in a room
    too large to check."""
    asker = USERS[draw(user)]
    others = [u for u in USERS if u != asker]
    members = [
        AudienceMember(user_id=o, ac_context=None if draw(big) else context(o, *draw(contexts_of)))
        for o in draw(st.lists(st.sampled_from(others), max_size=3, unique=True))
    ]
    aud = draw(
        st.sampled_from(
            [None, Audience(members=members, member_count=len(members) + 2), Audience(public_only=True)]
        )
    )
    return Readership(context(asker, *draw(contexts_of)), aud)


@settings(max_examples=200, deadline=None, derandomize=True)
@example(  # the same document public, then confidential: judged under both labels
    readership=Readership(context(USERS[0], "acme", ["document_category:news"], False), None),
    drawn=[(None, None, ResultScope(documents=(DOCS[5],))), (None, None, ResultScope(documents=(DOCS[4],)))],
    owner=0,
)
@given(readership=readerships(), drawn=st.lists(result_scopes, max_size=4), owner=user)
def test_what_a_memory_was_derived_from_is_judged_as_each_result_would_be(
    readership: Readership, drawn: list[Drawn], owner: int
) -> None:
    """The union a memory records is readable exactly when every tool result it was written
    after would be (as `visible_history` judges them): no label, tenant or personal result
    is lost in the union, and nothing is withheld for no reason."""
    writer, domain = USERS[owner], readership.ac.active_acl_domain
    scopes = []
    for tenant, personal, scope in drawn:
        update = {
            "domain": domain if tenant is None else TENANTS[tenant],
            "personal_to": None if personal is None else writer if personal < 0 else USERS[personal],
        }
        scopes.append(scope.model_copy(update=update))
    union = rules.union_scope(scopes, domain)
    assert readership.may_read(union) == all(readership.may_read(s) for s in scopes), (union, scopes)
    assert union.empty == all(s.empty for s in scopes)
