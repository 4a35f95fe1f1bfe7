"""The entity store and `lookup_entities` against a real Redis with FalkorDB: loading (JSON,
CSV), replace vs merge, atomic replace, delete, counts, domain isolation, paths through
forbidden entities, safe parameters, and the tool end to end."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from redis_local import free_port
from tests.support.factories import ac
from vagent_graph.knowledge.cypher import params_header, result_rows
from vagent_graph.knowledge.entities import Entity, EntityGraph, EntityLookup, Relation, load_files
from vagent_graph.knowledge.entity_store import EntityStore, EntityStoreError
from vagent_graph.knowledge.readers import ENTITY_KINDS, Readers, readers_for
from vagent_graph.services import Services
from vagent_graph.tools.base import ToolContext, result_text
from vagent_graph.tools.entities import NOTHING, TOOL, UNAVAILABLE, LookupEntitiesArgs
from vagent_shared.knowledge import Audience, AudienceMember

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "entities"
ORG = load_files([FIXTURES / "org.json"])
STAFF = ["entity_tag:staff", "entity_tag:public"]


@pytest.fixture(scope="module")
def redis_url(module_redis_url: str) -> str:
    """Graphs are built and dropped here on a Redis of this module's own (tests/conftest.py)."""
    return module_redis_url

@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis: Redis) -> AsyncIterator[EntityStore]:
    prefix = f"test_kg_{uuid.uuid4().hex[:12]}"
    yield EntityStore(redis, prefix)
    async for key in redis.scan_iter(match=f"{prefix}*"):
        await redis.unlink(key)


def reader(instances: list[str], domain: str = "acme", superuser: bool = False) -> Readers:
    found = readers_for(ac(instances=instances, domain=domain, superuser=superuser), None, ENTITY_KINDS)
    assert found is not None
    return found


def ids(found: EntityLookup) -> tuple[set[str], set[str], set[tuple[str, str, str]]]:
    return (
        {e.id for e in found.matches},
        {e.id for e in found.neighbours},
        {(r.source, r.type, r.target) for r in found.relations},
    )


def unreachable() -> Redis:
    """A client of a port nobody listens on, failing at once (no retries)."""
    return Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


async def graph_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(
        int(v.get("calls", 0)) + int(v.get("rejected_calls", 0))
        for k, v in stats.items()
        if k.lower().startswith("cmdstat_graph.")
    )


# ---- loading, counts, delete -------------------------------------------------------------------


async def test_available(store: EntityStore) -> None:
    assert await store.available()
    nobody = unreachable()
    assert not await EntityStore(nobody, "x").available()
    await nobody.aclose()


async def test_load_json_and_csv(store: EntityStore) -> None:
    result = await store.load("acme", ORG, replace=True)
    assert (result.domain, result.entities, result.relations, result.replaced) == ("acme", 6, 6, True)
    csv_graph = load_files([FIXTURES / "org_entities.csv", FIXTURES / "org_relations.csv"])
    await store.load("globex", csv_graph, replace=False)
    assert await store.counts("acme") == await store.counts("globex") == (6, 6)
    everything = await store.lookup(reader([], superuser=True), "platform")
    assert everything.matches[0].description == 'Builds and runs "Tidewater"; on call: C:\\oncall.'


async def test_merge_updates_and_adds_replace_replaces(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    changed = EntityGraph(
        entities=[
            Entity(id="alice-smith", name="Alice Smith-Jones", entity_type="person", tags=["staff", "lead"]),
            Entity(id="carol", name="Carol", entity_type="person", tags=["staff"]),
            Entity(id="platform-team", name="Platform Team", entity_type="team", tags=["staff"]),
        ],
        relations=[
            Relation(source="carol", target="platform-team", type="MEMBER_OF"),
            Relation(source="alice-smith", target="platform-team", type="LEADS"),  # already there
        ],
    )
    result = await store.load("acme", changed, replace=False)
    assert not result.replaced
    assert await store.counts("acme") == (7, 7)
    admin = reader([], superuser=True)
    alice = (await store.lookup(admin, "alice")).matches
    assert alice == [changed.entities[0]]  # name, tags updated; the description is gone
    assert (await store.lookup(admin, "Bob")).matches[0].id == "bob-jones"  # untouched
    await store.load(
        "acme", EntityGraph(entities=changed.entities[1:], relations=changed.relations[:1]), replace=True
    )
    assert await store.counts("acme") == (2, 1)
    assert (await store.lookup(admin, "alice")).matches == []


async def test_a_failed_merge_changes_nothing(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    dangling = EntityGraph.model_construct(
        entities=[Entity(id="new", name="New One", entity_type="person")],
        relations=[Relation(source="new", target="ghost", type="KNOWS")],
    )
    with pytest.raises(EntityStoreError):
        await store.load("acme", dangling, replace=False)
    assert await store.counts("acme") == (6, 6)
    assert (await store.lookup(reader([], superuser=True), "new one")).matches == []


@pytest.mark.parametrize(
    "broken",
    [
        EntityGraph.model_construct(  # a relation whose end is missing: caught before the swap
            entities=[Entity(id="x", name="X", entity_type="t")],
            relations=[Relation(source="x", target="ghost", type="KNOWS")],
        ),
        EntityGraph.model_construct(  # a value FalkorDB cannot take: refused half-way through
            entities=[
                Entity(id="x", name="X", entity_type="t"),
                Entity.model_construct(id="y", name="Y\x00", entity_type="t", tags=[], description=None),
            ],
            relations=[],
        ),
    ],
)
async def test_a_failed_replace_keeps_the_old_graph(
    store: EntityStore, redis: Redis, broken: EntityGraph
) -> None:
    small = EntityStore(redis, store._prefix, batch_size=1)  # the failure comes after some writes
    await small.load("acme", ORG, replace=True)
    with pytest.raises((EntityStoreError, ValueError)):
        await small.load("acme", broken, replace=True)
    assert await small.counts("acme") == (6, 6)
    assert [k async for k in redis.scan_iter(match=f"{store._prefix}~*")] == []  # no temporary graph left
    assert await redis.ttl(store.key("acme")) == -1


async def test_readers_never_see_a_half_loaded_graph(store: EntityStore, redis: Redis) -> None:
    await store.load("acme", ORG, replace=True)
    people = [
        Entity(id=f"p{i}", name=f"Person {i}", entity_type="person", tags=["staff"]) for i in range(400)
    ]
    links = [Relation(source=f"p{i}", target=f"p{i + 1}", type="KNOWS") for i in range(399)]
    slow = EntityStore(redis, store._prefix, batch_size=10)  # 80 write queries
    loading = asyncio.create_task(
        slow.load("acme", EntityGraph(entities=people, relations=links), replace=True)
    )
    seen: set[tuple[int, int]] = set()
    while not loading.done():
        seen.add(await store.counts("acme"))
        found = await store.lookup(reader([], superuser=True), "p")
        assert len(found.matches) in (2, 10)  # Platform Team and Project FALCON, or the (full) new graph
    await loading
    seen.add(await store.counts("acme"))
    assert seen <= {(6, 6), (400, 399)} and (400, 399) in seen
    assert len(seen) == 2, "the loader finished before any read: make the load slower"


async def test_delete_and_counts(store: EntityStore, redis: Redis) -> None:
    await store.load("acme", ORG, replace=True)
    await store.load("globex", ORG, replace=True)
    assert await store.delete_domain("acme")
    assert not await store.delete_domain("acme")
    assert await store.counts("acme") == (0, 0)
    assert await store.counts("globex") == (6, 6)
    assert await redis.exists(store.key("acme")) == 0


async def test_a_domain_without_a_graph_reads_as_empty_and_is_not_created(
    store: EntityStore, redis: Redis
) -> None:
    assert await store.lookup(reader([], superuser=True), "alice") == EntityLookup()
    assert await store.counts("acme") == (0, 0)
    assert await redis.exists(store.key("acme")) == 0


async def test_invalid_domains(store: EntityStore) -> None:
    for bad in ["", "has space", "a,b", "x\n"]:
        with pytest.raises(ValueError):
            await store.load(bad, ORG, replace=True)
    odd = Readers(domain="has space", grants=reader([], superuser=True).grants)
    assert await store.lookup(odd, "alice") == EntityLookup()


async def test_domains_are_separate_graphs(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    other = EntityGraph(
        entities=[Entity(id="alice-smith", name="Alice Other", entity_type="person", tags=["staff"])]
    )
    await store.load("globex", other, replace=True)
    assert [e.name for e in (await store.lookup(reader(STAFF, "globex"), "alice")).matches] == ["Alice Other"]
    assert [e.name for e in (await store.lookup(reader(STAFF, "acme"), "alice")).matches] == ["Alice Smith"]
    assert (await store.lookup(reader(STAFF, "initech"), "alice")).matches == []


# ---- lookup semantics --------------------------------------------------------------------------


async def test_search_by_name_part_or_exact_id(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    admin = reader([], superuser=True)
    assert ids(await store.lookup(admin, "aLiCe"))[0] == {"alice-smith"}
    assert ids(await store.lookup(admin, "  smith "))[0] == {"alice-smith"}
    assert ids(await store.lookup(admin, "globex"))[0] == {"globex"}  # id and name
    assert ids(await store.lookup(admin, "platform-team"))[0] == {"platform-team"}  # exact id
    assert ids(await store.lookup(admin, "-team"))[0] == set()  # ids are not searched by part
    assert (await store.lookup(admin, "bell\x07")).matches == []  # nothing can contain it: not sent


async def test_limits(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    admin = reader([], superuser=True)
    few = await store.lookup(admin, "a", limit=2)
    assert len(few.matches) == 2 and few.truncated
    assert [e.id for e in few.matches] == ["alice-smith", "globex"]  # by name
    one = await store.lookup(admin, "platform", depth=2, max_relations=1)
    assert len(one.relations) == 1 and one.truncated
    assert not (await store.lookup(admin, "platform", depth=2)).truncated
    with pytest.raises(ValueError):
        await store.lookup(admin, "a", depth=3)


async def test_a_path_through_a_forbidden_entity_is_not_revealed(store: EntityStore) -> None:
    """alice -WORKS_ON-> FALCON (confidential) -FOR_CUSTOMER-> globex (public)."""
    await store.load("acme", ORG, replace=True)
    staff = reader(STAFF)
    matches, neighbours, relations = ids(await store.lookup(staff, "alice", depth=2))
    assert matches == {"alice-smith"}
    assert neighbours == {"platform-team", "bob-jones", "tidewater"}
    assert relations == {
        ("alice-smith", "LEADS", "platform-team"),
        ("bob-jones", "MEMBER_OF", "platform-team"),
        ("platform-team", "OWNS", "tidewater"),
    }
    globex = await store.lookup(staff, "globex", depth=2)
    assert ids(globex)[2] == {("globex", "CUSTOMER_OF", "tidewater"), ("platform-team", "OWNS", "tidewater")}
    for query in ("falcon", "project-falcon", "FALCON"):
        assert await store.lookup(staff, query, depth=2) == EntityLookup()
    _, neighbours, relations = ids(await store.lookup(reader([], superuser=True), "alice", depth=2))
    assert {"project-falcon", "globex"} <= neighbours
    assert ("project-falcon", "FOR_CUSTOMER", "globex") in relations


async def test_public_only_and_several_readers(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    public = Readers(domain="acme", grants=reader(["entity:*"]).grants, public_only=True)
    assert ids(await store.lookup(public, "a"))[0] == {"globex", "tidewater"}
    both = Readers(domain="acme", grants=(*reader(STAFF).grants, *reader(["entity_type:customer"]).grants))
    assert ids(await store.lookup(both, "a", depth=2)) == ({"globex"}, set(), set())


# ---- parameters can never change the query --------------------------------------------------------

NASTY = [
    '" RETURN 1 //',
    "' RETURN 1 //",
    '\\" RETURN 1 //',
    "\\",
    'x"})-[:REL]->(n) DETACH DELETE n //',
    "`x`=1 RETURN 2",
    "}|*-$q ",
    "\\n\\t\\u0041\\x41",
    "line\nbreak\r\ttab",
    "日本 ẞ İ 😀",
    "CYPHER q=1 ",
    "/* comment",
    "",
]


def stringify_param_value(value: str) -> str:
    """How the `falkordb` client (`falkordb.helpers`, 1.8.1, no longer a dependency) quotes a
    string parameter, kept as the reference the header must match."""
    if len(value) == 0:
        return '""'
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


async def _echo(redis: Redis, key: str, value: object) -> object:
    query = params_header({"x": value}) + "RETURN $x"
    reply = await redis.execute_command("GRAPH.RO_QUERY", key, query, "--compact")  # type: ignore[no-untyped-call]
    return result_rows(reply)[0][0]


async def test_nasty_parameters_round_trip(store: EntityStore, redis: Redis) -> None:
    await store.load("acme", ORG, replace=True)
    key = store.key("acme")
    for value in NASTY:
        assert await _echo(redis, key, value) == value
        # the falkordb client quotes strings the same way (it would also send NUL, which we refuse)
        assert stringify_param_value(value) == params_header({"x": value})[len("CYPHER `x`=") : -1]
    assert await _echo(redis, key, NASTY) == NASTY
    assert await store.counts("acme") == (6, 6)
    admin = reader([], superuser=True)
    for value in NASTY[:-1]:
        assert (await store.lookup(admin, value)).matches == []


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=40))
async def test_any_string_round_trips(redis_url: str, value: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        key = f"test_kg_echo_{uuid.uuid4().hex}"
        await redis.execute_command("GRAPH.QUERY", key, "RETURN 1")  # type: ignore[no-untyped-call]
        assert await _echo(redis, key, value) == value
        assert await _echo(redis, key, [value, {"k": value}]) == [value, {"k": value}]
        await redis.unlink(key)
    finally:
        await redis.aclose()


async def test_adversarial_entities_round_trip(store: EntityStore) -> None:
    graph = EntityGraph(
        entities=[
            *(
                Entity(id=v, name="N", entity_type="t")
                for v in ['a"b', "a'b", "a\\b", "}|*-$", "日本😀", "x`y", "c:d"]
            ),
            Entity(id="q", name='Quote " back \\ slash', entity_type='ty"pe', tags=["t ag", "x}y", "$p"]),
        ]
    )
    await store.load("acme", graph, replace=True)
    for e in graph.entities:
        found = await store.lookup(reader([f"entity:{e.id}"]), e.id)
        assert found.matches == [e]
    tagged = await store.lookup(reader(["entity_tag:x}y"]), 'quote "')
    assert tagged.matches == [graph.entities[-1]]
    assert (await store.lookup(reader(["entity_tag:x}"]), "quote")).matches == []


# ---- the tool, end to end -------------------------------------------------------------------------


def ctx_for(
    store: EntityStore | None, instances: list[str], audience: Audience | None = None, superuser: bool = False
) -> ToolContext:
    services = Services(store) if store is not None else Services()
    user = ac(instances=instances, superuser=superuser)
    return ToolContext(ac=user, session_id="s", services=services, audience=audience)


async def run(ctx: ToolContext, query: str, depth: int = 1) -> str:
    return result_text(await TOOL.run(LookupEntitiesArgs(query=query, depth=depth), ctx, None))


async def test_tool_shows_the_allowed_subgraph(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    text = await run(ctx_for(store, ["tool:lookup_entities", *STAFF]), "alice", depth=2)
    assert "Alice Smith (person, id alice-smith)" in text and "Leads the platform team." in text
    assert "Alice Smith [alice-smith] —LEADS→ Platform Team [platform-team]" in text
    assert "Platform Team [platform-team] —OWNS→ Tidewater Analytics [tidewater]" in text
    for secret in ("FALCON", "falcon", "WORKS_ON", "Globex", "confidential"):
        assert secret not in text
    full = await run(ctx_for(store, [], superuser=True), "alice", depth=2)
    assert "Alice Smith [alice-smith] —WORKS_ON→ Project FALCON [project-falcon]" in full
    assert "Project FALCON [project-falcon] —FOR_CUSTOMER→ Globex Health [globex]" in full


async def test_tool_says_the_same_for_forbidden_and_missing(store: EntityStore) -> None:
    await store.load("acme", ORG, replace=True)
    staff = ctx_for(store, STAFF)
    assert await run(staff, "falcon", depth=2) == await run(staff, "no such thing") == NOTHING


async def test_tool_in_a_room_uses_what_everyone_may_see(store: EntityStore, redis: Redis) -> None:
    await store.load("acme", ORG, replace=True)
    public_member = AudienceMember(
        user_id="@carol:localhost", ac_context=ac("@carol:localhost", ["entity_tag:public"])
    )
    room = Audience(members=[public_member], member_count=3)
    assert await run(ctx_for(store, STAFF, room), "alice") == NOTHING
    text = await run(ctx_for(store, STAFF, room), "tidewater", depth=2)
    assert "Tidewater Analytics" in text and "Globex Health" in text and "Platform Team" not in text
    unresolved = Audience(members=[AudienceMember(user_id="@x:localhost")], member_count=3)
    before = await graph_calls(redis)
    assert await run(ctx_for(store, [], unresolved, superuser=True), "tidewater") == NOTHING
    assert await graph_calls(redis) == before, "nobody may see anything: no query at all"


async def test_tool_without_a_store_or_redis() -> None:
    assert await run(ctx_for(None, STAFF), "alice") == UNAVAILABLE
    down = unreachable()
    assert await run(ctx_for(EntityStore(down, "x"), STAFF), "alice") == UNAVAILABLE
    await down.aclose()


async def test_tool_when_the_key_is_not_a_graph(store: EntityStore, redis: Redis) -> None:
    await redis.set(store.key("acme"), "not a graph")
    assert await run(ctx_for(store, STAFF), "alice") == UNAVAILABLE


def test_tool_arguments() -> None:
    schema = TOOL.openai_schema()["function"]
    assert schema["name"] == "lookup_entities"
    assert set(schema["parameters"]["properties"]) == {"query", "depth"}
    for bad in [{"query": ""}, {"query": "x" * 201}, {"query": "x", "depth": 0}, {"query": "x", "depth": 3}]:
        with pytest.raises(ValueError):
            LookupEntitiesArgs.model_validate(bad)
    assert LookupEntitiesArgs(query="x").depth == 1
