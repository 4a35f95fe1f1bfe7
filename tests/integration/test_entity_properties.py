"""Property-based proof of the entity filter against a real FalkorDB.

Every example loads three random domain graphs (a few hundred entities, more relations; ids,
types, tags and names full of Cypher and Redis syntax: quotes, backslashes, `|`, `}`, `-`,
spaces, `*`, `$`, backticks, unicode; the same ids in several domains with different data)
and asks several lookups with random access contexts (random grants, wildcards, superusers,
inactive roles, grants in other domains, adversarial grant strings) and random room
audiences. Each answer is compared with a brute-force computation in Python over the
generated data:
- every returned entity is allowed for every reader (`Readers.allows`, and AcContext.can_access
  as a second opinion) and is the asked domain's version of it;
- every returned relation has both ends allowed, and lies on a path from a match on which
  every node is allowed (depth 2 never goes through a forbidden node);
- matches, neighbours and relations EQUAL the brute-force sets: the filter neither leaks
  nor loses;
- when nobody may see anything, the answer is empty and no graph query reached Redis.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from tests.support.acl_strategies import ADVERSARIAL_TAGS, audiences, contexts
from vagent_graph.knowledge.entities import Entity, EntityGraph, EntityLookup, Relation
from vagent_graph.knowledge.entity_filter import FALSE, entity_predicate
from vagent_graph.knowledge.entity_store import EntityStore
from vagent_graph.knowledge.readers import ENTITY_KINDS, Readers, readers_for
from vagent_shared.access import AcContext
from vagent_shared.knowledge import PUBLIC_TAG, Audience

DOMAINS = ["acme", "glo|bex", "we}ird-*$"]
ODD = ["a|b", "x}y", "-neg", "star*", "(p)", "@x", "$v", "~t", "{b}", "日本", "Up", "up", "a.b", 'q"t']
ODD += ["it's", "back\\slash", "c:d", "`tick`", "😀", "İd", "ẞ", "*", '\\"', "}"]
ID_POOL = ODD + [f"{ODD[i % len(ODD)]}{i}" for i in range(200)]
TYPES = ["person", "Person", "team", "with space", "a|b", "*", "-", "x}y", 'ty"pe', PUBLIC_TAG]
TAGS = [*ADVERSARIAL_TAGS, "back\\slash", "$t", "'q'"]
NAME_WORDS = ["Ann", "ann", "ANNA", "Bob", "Falcon", "falcon", 'Q"uote', "back\\slash", "x}y", "a|b", "$var"]
NAME_WORDS += ["İstanbul", "STRASSE", "straße", "日本", "😀", "-", "*", "it's", "Ω", "`b`"]
REL_TYPES = ["WORKS_ON", "LEADS", "CUSTOMER_OF", "knows", "X1"]
DESCRIPTIONS = [None, "plain", 'say "hi" \\ then\nnext line', "$x } | *"]
QUERIES = ["ann", "ANN", "falcon", "a", "x}", "|", '"', "\\", "$", "'", "i", "İ", "straße", "日", "😀", "*"]
QUERIES += ["-", "zzz", " Ann ", 'q"u', "`", "ω", "a|b", "back\\"]
LIMIT = 50


def make_graph(rng: random.Random) -> EntityGraph:
    """One domain: 60-130 entities from the shared id pool, 1-3 times as many relations."""
    ids = rng.sample(ID_POOL, rng.randint(60, 130))
    entities = [
        Entity(
            id=i,
            name=" ".join(rng.sample(NAME_WORDS, rng.randint(1, 3))),
            entity_type=rng.choice(TYPES),
            tags=rng.sample(TAGS, rng.randint(0, 3)),
            description=rng.choice(DESCRIPTIONS),
        )
        for i in ids
    ]
    relations = [
        Relation(source=rng.choice(ids), target=rng.choice(ids), type=rng.choice(REL_TYPES))
        for _ in range(rng.randint(len(ids), 3 * len(ids)))
    ]
    return EntityGraph(entities=entities, relations=relations)


# ---- access contexts and audiences ---------------------------------------------------------------


def granted(kind: str, pool: list[str]) -> st.SearchStrategy[str]:
    """`kind:name` with a name the generated graphs use (mostly) or any text at all."""
    name = st.one_of(st.sampled_from(pool), st.sampled_from(pool), st.text(min_size=1, max_size=6))
    return st.builds(lambda n: f"{kind}:{n}", name)


#: Wildcards, near-wildcards and strings with query syntax, and grants of other kinds.
ODD_GRANTS = [
    "entity:*",
    "entity_type:*",
    "entity_tag:*",
    "entity_tag:public|confidential",
    "entity_tag:pub*",
    "entity:",
    "Entity:x",
    "entity_tag:x}y OR true",
    "entity_tag:line\nbreak",  # no entity can have it: dropped from the filter, never sent
    "entity:nul\x00",
    "tool:lookup_entities",
    "document:*",
    "document_tag:public",
]
entity_grants = st.one_of(
    granted("entity", ID_POOL),
    granted("entity_type", TYPES),
    granted("entity_tag", TAGS),
    granted("entity_type", TYPES),
    granted("entity_tag", TAGS),
    st.sampled_from(ODD_GRANTS),
)


@dataclass(frozen=True)
class Case:
    asker: AcContext
    audience: Audience | None
    query: str
    depth: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    asker = draw(contexts(entity_grants, DOMAINS, superuser_one_in=15, empty_one_in=10))
    query = draw(
        st.one_of(st.sampled_from(QUERIES), st.sampled_from(ID_POOL), st.text(min_size=1, max_size=5))
    )
    return Case(
        asker,
        draw(audiences(entity_grants, DOMAINS, asker.active_acl_domain)),
        query,
        draw(st.sampled_from([1, 2])),
    )


# ---- the oracle: brute force over the generated data ---------------------------------------------


def may_see(ctx: AcContext, domain: str, e: Entity) -> bool:
    """A second opinion from AcContext alone (Grants is never wider than this)."""
    if ctx.active_acl_domain != domain:
        return False
    return (
        ctx.can_access(f"entity:{e.id}")
        or ctx.can_access(f"entity_type:{e.entity_type}")
        or any(ctx.can_access(f"entity_tag:{t}") for t in e.tags)
    )


def everyone_may_see(case: Case, e: Entity) -> bool:
    """The asker's domain's entity `e`, seen by the asker and every member of the room."""
    domain = case.asker.active_acl_domain
    if case.audience is not None and case.audience.public_only and PUBLIC_TAG not in e.tags:
        return False
    members = [m.ac_context for m in case.audience.members] if case.audience else []
    return may_see(case.asker, domain, e) and all(m is not None and may_see(m, domain, e) for m in members)


def expected_matches(graph: EntityGraph, allowed: set[str], query: str) -> list[Entity]:
    q = query.strip()
    if not q or not q.isprintable():
        return []
    return [e for e in graph.entities if e.id in allowed and (e.id == q or q.lower() in e.name.lower())]


def expected_edges(
    graph: EntityGraph, allowed: set[str], starts: set[str], depth: int
) -> set[tuple[str, str, str]]:
    """Edges between allowed entities with an end within depth-1 allowed hops of a match."""
    edges = {(r.source, r.type, r.target) for r in graph.relations if {r.source, r.target} <= allowed}
    reach = set(starts)
    if depth == 2:
        reach |= {t for s, _, t in edges if s in starts} | {s for s, _, t in edges if t in starts}
    return {e for e in edges if e[0] in reach or e[2] in reach}


# ---- the test ---------------------------------------------------------------------------------------


@dataclass
class Lab:
    redis: Redis
    store: EntityStore

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return "Lab()"


@pytest.fixture(scope="module")
def redis_url(module_redis_url: str) -> str:
    """Graphs are built and dropped here on a Redis of this module's own (tests/conftest.py)."""
    return module_redis_url

@pytest.fixture(scope="module")
async def lab(redis_url: str) -> AsyncIterator[Lab]:
    redis = Redis.from_url(redis_url)
    prefix = f"test_kg_{uuid.uuid4().hex[:12]}"
    yield Lab(redis, EntityStore(redis, prefix))
    async for key in redis.scan_iter(match=f"{prefix}*"):
        await redis.unlink(key)
    await redis.aclose()


async def graph_queries(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(
        int(v.get("calls", 0)) + int(v.get("rejected_calls", 0))
        for k, v in stats.items()
        if k.lower() in ("cmdstat_graph.query", "cmdstat_graph.ro_query")
    )


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32), asks=st.lists(cases(), min_size=4, max_size=4))
async def test_lookup_is_exactly_the_allowed_subgraph(lab: Lab, seed: int, asks: list[Case]) -> None:
    """The graphs come from a seeded Random (thousands of draws would overrun hypothesis'
    choice buffer); access contexts and queries, where shrinking helps, are drawn."""
    world = random.Random(seed)
    graphs = {domain: make_graph(world) for domain in DOMAINS}
    for domain, graph in graphs.items():
        await lab.store.load(domain, graph, replace=True)
    for i, case in enumerate(asks):
        graph = graphs[case.asker.active_acl_domain]
        readers = readers_for(case.asker, case.audience, ENTITY_KINDS)
        if readers is None or entity_predicate(readers)[0] == FALSE:
            await check_nothing(lab, graph, case, readers)
            continue
        allowed = {e.id for e in graph.entities if readers.allows(e.id, e.entity_type, set(e.tags))}
        assert allowed <= {e.id for e in graph.entities if everyone_may_see(case, e)}, "Grants is wider"
        await check(lab, graph, readers, allowed, case, small_cap=i == 0)
        if allowed:  # and a query that surely matches: an allowed entity's id or part of its name
            hit = world.choice(sorted(allowed))
            name = next(e.name for e in graph.entities if e.id == hit)
            query = world.choice([hit, name[: world.randint(1, len(name))]])
            await check(lab, graph, readers, allowed, replace(case, query=query), small_cap=False)


async def check_nothing(lab: Lab, graph: EntityGraph, case: Case, readers: Readers | None) -> None:
    """Nobody may see anything: an empty answer, no graph query sent, and indeed nothing allowed."""
    event("nobody may see anything")
    before = await graph_queries(lab.redis)
    assert await lab.store.lookup(readers, case.query, depth=case.depth) == EntityLookup()
    assert await graph_queries(lab.redis) == before, "nothing may be seen: no query may be sent"
    if readers is None:
        assert not any(everyone_may_see(case, e) for e in graph.entities)
    else:
        assert not any(readers.allows(e.id, e.entity_type, set(e.tags)) for e in graph.entities)


async def check(
    lab: Lab, graph: EntityGraph, readers: Readers, allowed: set[str], case: Case, small_cap: bool
) -> None:
    found = await lab.store.lookup(readers, case.query, depth=case.depth, limit=LIMIT, max_relations=100_000)
    assert_same_as_brute_force(graph, readers, allowed, case, found)
    matched = {e.id for e in found.matches}
    everyone = {e.id for e in graph.entities}
    hidden = expected_edges(graph, everyone, matched, case.depth) - expected_edges(
        graph, allowed, matched, case.depth
    )
    event(f"depth {case.depth}: {'some' if found.relations else 'no'} relations")
    if hidden and found.relations:
        event("relations shown while others, through or to forbidden entities, were hidden")
    if small_cap and found.relations:
        capped = await lab.store.lookup(readers, case.query, depth=case.depth, limit=LIMIT, max_relations=3)
        assert set(capped.relations) <= set(found.relations)
        assert len(capped.relations) == min(3, len(found.relations))
        assert capped.truncated == (found.truncated or len(found.relations) > 3)


def assert_same_as_brute_force(
    graph: EntityGraph, readers: Readers, allowed: set[str], case: Case, found: EntityLookup
) -> None:
    by_id = {e.id: e for e in graph.entities}
    for e in [*found.matches, *found.neighbours]:
        assert e.id in allowed, f"leaked {e.id!r}"
        assert readers.allows(e.id, e.entity_type, set(e.tags))
        assert by_id[e.id] == e, "the entity must be the asked domain's version"
    expected = expected_matches(graph, allowed, case.query)
    got = [e.id for e in found.matches]
    assert len(got) == len(set(got))
    if len(expected) <= LIMIT:
        assert set(got) == {e.id for e in expected} and not found.truncated, "lost or leaked a match"
    else:
        assert set(got) <= {e.id for e in expected} and len(got) == LIMIT and found.truncated
    if case.query.strip() in {e.id for e in expected}:
        assert got[0] == case.query.strip(), "an exact id match comes first"
    edges = expected_edges(graph, allowed, set(got), case.depth)
    for s, _, t in [(r.source, r.type, r.target) for r in found.relations]:
        assert {s, t} <= allowed, "a relation to a forbidden entity"
    assert {(r.source, r.type, r.target) for r in found.relations} == edges, "lost or leaked a relation"
    assert {e.id for e in found.neighbours} == {i for s, _, t in edges for i in (s, t)} - set(got)
