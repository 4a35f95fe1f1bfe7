"""The memory store on a real Redis (search + JSON) with the real offline embedding model:
relevance, one user's and one tenant's memories never in another's query, TTL, the
per-user limit, deletion that leaves no key holding the text, and setting up twice or from
several replicas at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from redis_local import RedisServer, free_port
from tests.support.factories import ac
from tests.support.knowledge import RecordingEmbedder, local_embedder
from vagent_graph.memory.memories import Memories, Prefetch
from vagent_graph.memory.store import MemoryStore
from vagent_graph.services import Services
from vagent_shared import redis_keys
from vagent_shared.knowledge import Audience, AudienceMember
from vagent_shared.memory import Memory, MemoryPolicy
from vagent_shared.readers import Readership

POLICY = MemoryPolicy(enabled=True)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
UNRELATED = (
    "My dog is called Rex and he is afraid of thunder",
    "I live in York, near the minster",
    "The quarterly report is due on the first Monday of April",
    "I prefer meetings after ten in the morning",
)
TEA = "I drink green tea every morning, never coffee"


def memory(owner: str, text: str, n: int = 0, *, domain: str = "acme", id: str | None = None) -> Memory:
    """A memory written `n` minutes after T0 (so oldest-first is well defined)."""
    return Memory(
        id=id or f"{owner.strip('@').replace(':', '-')}-{domain}-{n}",
        owner=owner,
        domain=domain,
        text=text,
        created_at=T0 + timedelta(minutes=n),
        heard_by=(owner,),
    )


@pytest.fixture
async def redis(module_redis_url: str) -> AsyncIterator[Redis]:
    """The module's own Redis, emptied (indexes too) before each test."""
    client = Redis.from_url(module_redis_url)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
async def store(redis: Redis) -> AsyncIterator[MemoryStore]:
    s = MemoryStore(redis, local_embedder())
    await s.setup()
    yield s
    await s.aclose()


async def keys_holding(redis: Redis, text: str) -> list[str]:
    """Every key whose value (JSON, string or hash) contains `text`."""
    found = []
    async for raw in redis.scan_iter(count=1000):
        key = raw.decode()
        raw_kind = await redis.type(key)
        kind = raw_kind.decode() if isinstance(raw_kind, bytes) else raw_kind
        if kind == "ReJSON-RL":
            value = str(await redis.json().get(key))
        elif kind == "string":
            value = str(await redis.get(key))
        elif kind == "hash":
            value = str(await redis.hgetall(key))  # type: ignore[misc]
        else:
            continue
        if text in value:
            found.append(key)
    return found


async def memory_keys(redis: Redis) -> list[str]:
    prefixes = (redis_keys.MEMORY_STORE_PREFIX + ":", redis_keys.MEMORY_VECTOR_PREFIX + ":")
    return sorted([k.decode() async for k in redis.scan_iter(count=1000) if k.decode().startswith(prefixes)])


async def add_all(store: MemoryStore, memories: Sequence[Memory], policy: MemoryPolicy = POLICY) -> None:
    for m in memories:
        assert await store.add(m, policy) == []


async def test_the_memory_about_tea_answers_what_do_i_drink(store: MemoryStore) -> None:
    texts = [UNRELATED[0], UNRELATED[1], TEA, UNRELATED[2], UNRELATED[3]]
    await add_all(store, [memory("@ann:x", t, n) for n, t in enumerate(texts)])

    found = await store.search("@ann:x", "acme", "what do I usually drink?", 5)

    assert [m.text for m in found][:1] == [TEA]
    assert sorted(m.text for m in found) == sorted(texts)
    listed = await store.all_of("@ann:x", "acme")
    assert [m.text for m in listed] == texts  # oldest first
    assert listed[2] == memory("@ann:x", TEA, 2)  # read back as written
    assert [m.text for m in await store.search("@ann:x", "acme", "what do I usually drink?", 2, 1)] == [
        m.text for m in found[1:3]
    ]


async def test_another_users_or_tenants_memories_are_never_returned(store: MemoryStore) -> None:
    """@a:x, @a:xx (its id a prefix of the other's), @a:x in another tenant, and @b:x all
    remember tea; each query sees its own only, also in the Redis query alone."""
    owners = [("@a:x", "acme"), ("@a:xx", "acme"), ("@a:x", "acme2"), ("@b:x", "acme"), ("@a:x", "acm")]
    for i, (owner, domain) in enumerate(owners):
        await add_all(
            store,
            [
                memory(owner, f"{TEA} ({owner} in {domain})", 2 * i, domain=domain),
                memory(owner, f"{UNRELATED[0]} ({owner} in {domain})", 2 * i + 1, domain=domain),
            ],
        )

    for owner, domain in owners:
        mine = {f"{TEA} ({owner} in {domain})", f"{UNRELATED[0]} ({owner} in {domain})"}
        found = await store.search(owner, domain, "what do I drink?", 50)
        assert {m.text for m in found} == mine
        assert {m.text for m in await store.all_of(owner, domain)} == mine
        # the namespace filter pushed into Redis is exact by itself (no Python filter here)
        raw = await (await store._ready()).asearch(
            redis_keys.memory_namespace(owner, domain), query="what do I drink?", limit=50
        )
        assert {item.value["text"] for item in raw} == mine

    every_tenant = {m.domain for m in await store.all_of("@a:x")}
    assert every_tenant == {"acme", "acme2", "acm"}
    assert {m.owner for m in await store.all_of("@a:x")} == {"@a:x"}


async def test_each_memory_expires_after_the_policys_days(store: MemoryStore, redis: Redis) -> None:
    await store.add(memory("@ann:x", TEA), MemoryPolicy(enabled=True, ttl_days=3))

    keys = await memory_keys(redis)
    assert len(keys) == 2  # the memory and its vector
    for key in keys:
        ttl = await redis.ttl(key)
        assert 3 * 86400 - 120 <= ttl <= 3 * 86400, (key, ttl)


async def test_the_oldest_memories_beyond_the_limit_are_dropped_and_returned(
    store: MemoryStore, redis: Redis
) -> None:
    policy = MemoryPolicy(enabled=True, max_per_user=3)
    await add_all(store, [memory("@ann:x", t, n) for n, t in enumerate(UNRELATED[:3])], policy)
    other = memory("@bob:x", TEA, 0)
    await store.add(other, policy)

    dropped = await store.add(memory("@ann:x", UNRELATED[3], 9), policy)

    assert [m.text for m in dropped] == [UNRELATED[0]]
    assert [m.text for m in await store.all_of("@ann:x", "acme")] == [*UNRELATED[1:3], UNRELATED[3]]
    assert await keys_holding(redis, UNRELATED[0]) == []
    assert await store.all_of("@bob:x", "acme") == [other]  # another user's count is their own
    assert len(await memory_keys(redis)) == 2 * 4


async def test_deleting_leaves_no_key_holding_the_text(store: MemoryStore, redis: Redis) -> None:
    await add_all(store, [memory("@ann:x", TEA, 0), memory("@ann:x", UNRELATED[0], 1)])
    await store.add(memory("@ann:x", UNRELATED[1], 2, domain="other"), POLICY)
    await store.add(memory("@bob:x", UNRELATED[2], 3), POLICY)
    assert await keys_holding(redis, TEA)

    assert await store.delete("@ann:x", "acme", ["ann-x-acme-0", "no-such-id", "bob-x-acme-3"]) == 1
    assert await keys_holding(redis, TEA) == []
    assert [m.text for m in await store.search("@ann:x", "acme", "what do I drink?", 5)] == [UNRELATED[0]]
    assert await store.delete("@ann:x", "acme", ["ann-x-acme-0"]) == 0  # already gone

    assert await store.delete_all("@ann:x") == 2  # every tenant
    for text in (UNRELATED[0], UNRELATED[1]):
        assert await keys_holding(redis, text) == []
    assert await store.all_of("@ann:x") == []
    assert [m.text for m in await store.all_of("@bob:x")] == [UNRELATED[2]]
    assert len(await memory_keys(redis)) == 2  # bob's memory and its vector, nothing of ann's
    assert await store.delete_all("@ann:x") == 0


async def test_delete_all_of_one_tenant_keeps_the_others(store: MemoryStore, redis: Redis) -> None:
    await store.add(memory("@ann:x", TEA, 0), POLICY)
    await store.add(memory("@ann:x", UNRELATED[1], 1, domain="other"), POLICY)

    assert await store.delete_all("@ann:x", "acme") == 1
    assert await keys_holding(redis, TEA) == []
    assert [m.text for m in await store.all_of("@ann:x")] == [UNRELATED[1]]


async def test_an_unreadable_value_is_skipped(store: MemoryStore) -> None:
    await store.add(memory("@ann:x", TEA, 0), POLICY)
    raw = await store._ready()
    namespace = redis_keys.memory_namespace("@ann:x", "acme")
    await raw.aput(namespace, "broken", {"text": "no owner, no id"})
    await raw.aput(namespace, "misfiled", memory("@bob:x", "filed under ann", 1).model_dump(mode="json"))

    assert [m.text for m in await store.search("@ann:x", "acme", "what do I drink?", 5)] == [TEA]
    assert [m.text for m in await store.all_of("@ann:x")] == [TEA]


async def test_setting_up_twice_keeps_the_memories(store: MemoryStore, redis: Redis) -> None:
    await store.add(memory("@ann:x", TEA), POLICY)
    await store.setup()
    again = MemoryStore(redis, local_embedder())
    await again.setup()
    try:
        assert [m.text for m in await again.search("@ann:x", "acme", "what do I drink?", 5)] == [TEA]
    finally:
        await again.aclose()


async def test_replicas_setting_up_together_on_a_new_redis_all_succeed(tmp_path: Path) -> None:
    server = RedisServer(free_port(), tmp_path).start()
    clients = [Redis.from_url(server.url) for _ in range(4)]
    stores = [MemoryStore(c, local_embedder()) for c in clients]
    try:
        await asyncio.gather(*(s.setup() for s in stores))
        listed = await clients[0].execute_command("FT._LIST")  # type: ignore[no-untyped-call]
        names = {n.decode() if isinstance(n, bytes) else str(n) for n in listed}
        assert {redis_keys.MEMORY_STORE_PREFIX, redis_keys.MEMORY_VECTOR_PREFIX} <= names
        await stores[0].add(memory("@ann:x", TEA), POLICY)
        assert [m.text for m in await stores[3].all_of("@ann:x")] == [TEA]
    finally:
        for s in stores:
            await s.aclose()
        for c in clients:
            await c.aclose()
        server.stop()


async def test_an_index_of_another_vector_length_is_refused(store: MemoryStore, redis: Redis) -> None:
    other = MemoryStore(redis, local_embedder(), dims=8)
    with pytest.raises(RuntimeError, match="384-dimensional"):
        await other.setup()


async def test_only_memories_everyone_reading_heard_come_back_from_redis(store: MemoryStore) -> None:
    """The hearers are asked of Redis too: a group room's search never returns a memory one
    of its readers did not hear (unless said `--everywhere`), nor one of another user's."""
    heard = {"@a:x.org", "@b:x.org"}
    group = Memory(id="group", owner="@a:x.org", domain="acme", text=TEA, heard_by=tuple(sorted(heard)))
    alone = Memory(
        id="alone", owner="@a:x.org", domain="acme", text="I drink tea with milk", heard_by=("@a:x.org",)
    )
    anywhere = Memory(
        id="anywhere",
        owner="@a:x.org",
        domain="acme",
        text="Tea, always",
        heard_by=("@a:x.org",),
        everywhere=True,
    )
    theirs = Memory(id="theirs", owner="@b:x.org", domain="acme", text=TEA, heard_by=tuple(sorted(heard)))
    for m in (group, alone, anywhere, theirs):
        await store.add(m, POLICY)

    async def found(hearers: set[str] | None) -> set[str]:
        return {m.id for m in await store.search("@a:x.org", "acme", "what do I drink?", 10, hearers=hearers)}

    assert await found(set()) == {"group", "alone", "anywhere"}  # no condition: a DM
    assert await found(heard) == {"group", "anywhere"}
    assert await found({"@a:x.org", "@b:x.org", "@c:x.org"}) == {"anywhere"}  # a newcomer
    assert await found(None) == {"anywhere"}  # readers not known one by one
    assert sorted(await store.heard_ids("@a:x.org", "acme", heard)) == ["anywhere", "group"]
    assert await store.heard_ids("@a:x.org", "globex", heard) == []
    assert await store.count("@a:x.org", "acme") == 3 and await store.count("@b:x.org", "acme") == 1


async def test_recall_in_a_group_room_ranks_only_what_everyone_heard(store: MemoryStore) -> None:
    """More memories than recall_k: the question is ranked among those everyone reading heard
    (Redis leaves out the rest), and those left out are counted as withheld, not heard."""
    alice, bob = ac("@a:x.org", [], domain="acme"), ac("@b:x.org", [], domain="acme")
    for n, text in enumerate((*UNRELATED, "I drink tea with milk", "Coffee makes me ill")):
        await store.add(memory("@a:x.org", text, n), POLICY)  # heard by alice alone
    both = ("@a:x.org", "@b:x.org")
    for n, text in enumerate((TEA, "My team is Payments")):
        await store.add(Memory(id=f"g{n}", owner="@a:x.org", domain="acme", text=text, heard_by=both), POLICY)
    memories = Memories(store, POLICY.model_copy(update={"recall_k": 2}), Services())
    room = Audience(members=[AudienceMember(user_id=bob.user_id, ac_context=bob)], member_count=3)
    found = await memories.recall(Readership(alice, room), "", "what do I drink?")
    assert [m.id for m in found.memories] == ["g0", "g1"]  # the tea first, both heard by bob
    assert found.withheld == {"not_heard": 6}
    dm = await memories.recall(Readership(alice, None), "", "what do I drink?")
    assert len(dm.memories) == 2 and "g1" not in [m.id for m in dm.memories]  # ranked among all 8


async def test_a_message_s_question_is_embedded_when_it_arrives_and_only_once(redis: Redis) -> None:
    """More memories than recall_k: the question's embedding starts when the message arrives
    (`prefetch`, before the session's lock and checkpoint), and recall uses that vector."""
    embedder = RecordingEmbedder()
    store = MemoryStore(redis, embedder)
    await store.setup()
    alice = ac("@a:x.org", [], domain="acme")
    for n, text in enumerate((*UNRELATED, TEA)):
        await store.add(memory("@a:x.org", text, n), POLICY)
    memories = Memories(store, POLICY.model_copy(update={"recall_k": 2}), Services())
    embedder.batches.clear()
    memories.prefetch(alice, "what do I drink?")
    await asyncio.gather(*memories._prefetching)
    assert embedder.batches == [["what do I drink?"]]  # started before recall asked
    found = await memories.recall(Readership(alice, None), "", "what do I drink?")
    assert found.memories[0].text == TEA
    assert embedder.batches == [["what do I drink?"]]  # recall did not embed it again
    await store.aclose()


async def test_recall_takes_the_count_from_the_message_s_prefetch_and_only_its_askers(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prefetch counted the asker's memories: recall does not ask Redis again (one round
    trip less per turn). Another asker's prefetch, or one whose count failed, is not used."""
    store = MemoryStore(redis, RecordingEmbedder())
    await store.setup()
    alice, bob = ac("@a:x.org", [], domain="acme"), ac("@b:x.org", [], domain="acme")
    for n, text in enumerate((*UNRELATED, TEA)):
        await store.add(memory("@a:x.org", text, n), POLICY)
    memories = Memories(store, POLICY.model_copy(update={"recall_k": 2}), Services())
    counted: list[str] = []
    real_count = store.count

    async def count(owner: str, domain: str) -> int:
        counted.append(owner)
        return await real_count(owner, domain)

    monkeypatch.setattr(store, "count", count)
    prefetched = memories.prefetch(alice, "what do I drink?")
    assert prefetched is not None
    found = await memories.recall(Readership(alice, None), "", "what do I drink?", prefetched=prefetched)
    assert found.memories[0].text == TEA
    assert counted == ["@a:x.org"]  # once, by the prefetch

    counted.clear()  # bob's message prefetched, alice's recall (never mixed up): alice counted
    found = await memories.recall(
        Readership(alice, None), "", "what do I drink?", prefetched=memories.prefetch(bob, "hi")
    )
    assert found.memories[0].text == TEA
    assert sorted(counted) == ["@a:x.org", "@b:x.org"]

    async def failing(owner: str, domain: str) -> int:
        raise ConnectionError("redis went away")

    monkeypatch.setattr(store, "count", failing)
    broken = memories.prefetch(alice, "what do I drink?")
    monkeypatch.setattr(store, "count", count)
    counted.clear()
    found = await memories.recall(Readership(alice, None), "", "what do I drink?", prefetched=broken)
    assert found.memories[0].text == TEA and counted == ["@a:x.org"]  # asked again
    await store.aclose()


async def test_the_recall_started_under_the_lock_is_taken_by_the_same_readers_only(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the session's lock is held the whole recall starts (`start_recall`), and the model
    node takes its result without asking Redis again, audited when taken (never when only
    started). A node asking for other readers (a DM's recall must never serve a group room),
    another question or unknown readers gets a fresh recall; a failed early recall fails
    the recall that takes it, as a failed recall does."""
    store = MemoryStore(redis, RecordingEmbedder())
    await store.setup()
    alice, bob = ac("@a:x.org", [], domain="acme"), ac("@b:x.org", [], domain="acme")
    for n, text in enumerate((*UNRELATED, TEA)):
        await store.add(memory("@a:x.org", text, n), POLICY)  # heard by alice alone
    memories = Memories(store, POLICY.model_copy(update={"recall_k": 2}), Services())
    searches: list[str] = []
    audited: list[str] = []
    real_search = store.search

    async def search(owner: str, domain: str, query: str, *args: Any, **kwargs: Any) -> list[Memory]:
        searches.append(query)
        return await real_search(owner, domain, query, *args, **kwargs)

    monkeypatch.setattr(store, "search", search)
    monkeypatch.setattr(
        "vagent_graph.memory.memories.audit", lambda _s, kind, *_a, **_k: audited.append(kind)
    )
    dm = Readership(alice, None)
    question = "what do I drink?"

    def started(readership: Readership = dm, unchecked: bool = False) -> Prefetch:
        prefetched = memories.prefetch(alice, question)
        assert prefetched is not None
        return memories.start_recall(prefetched, readership, question, unchecked=unchecked)

    early = started()
    assert early.early is not None
    await asyncio.gather(*memories._prefetching)
    assert searches == [question] and audited == []  # done before the node asks; nothing audited
    found = await memories.recall(dm, "", question, prefetched=early)
    assert found.memories[0].text == TEA
    assert searches == [question] and audited == ["memory_recalled"]  # taken, not asked again

    room = Audience(members=[AudienceMember(user_id=bob.user_id, ac_context=bob)], member_count=3)
    for readership, asked, unchecked, first in (
        (Readership(alice, room), question, False, None),  # bob reads here: he heard none
        (dm, "where do I live?", False, UNRELATED[1]),
        (dm, question, True, None),  # readers not known one by one: nothing was heard by all
    ):
        prefetched = started()
        await asyncio.gather(*memories._prefetching)
        fresh = await memories.recall(readership, "", asked, prefetched=prefetched, unchecked=unchecked)
        assert [m.text for m in fresh.memories][:1] == ([first] if first else [])
        assert fresh == await memories.recall(readership, "", asked, unchecked=unchecked)

    async def failing(*_a: Any, **_k: Any) -> list[Memory]:
        raise ConnectionError("redis went away")

    monkeypatch.setattr(store, "search", failing)
    broken = started()
    await asyncio.gather(*memories._prefetching, return_exceptions=True)
    monkeypatch.setattr(store, "search", search)
    with pytest.raises(ConnectionError):
        await memories.recall(dm, "", question, prefetched=broken)
    await store.aclose()


async def test_no_question_is_embedded_for_someone_with_few_memories(redis: Redis) -> None:
    """At most recall_k memories: all are candidates, so neither the message's arrival nor
    recall embeds the question."""
    embedder = RecordingEmbedder()
    store = MemoryStore(redis, embedder)
    await store.setup()
    alice, bob = ac("@a:x.org", [], domain="acme"), ac("@b:x.org", [], domain="acme")
    await store.add(memory("@a:x.org", TEA), POLICY)
    memories = Memories(store, POLICY, Services())
    embedder.batches.clear()
    for who in (alice, bob):  # bob has none at all
        memories.prefetch(who, "what do I drink?")
    await asyncio.gather(*memories._prefetching)
    found = await memories.recall(Readership(alice, None), "", "what do I drink?")
    assert [m.text for m in found.memories] == [TEA]
    assert (await memories.recall(Readership(bob, None), "", "what do I drink?")).memories == []
    assert embedder.batches == []
    await store.aclose()
