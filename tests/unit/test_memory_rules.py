"""The recall rules of memory (vagent_graph.memory.rules, docs/memory.md): a memory reaches the
model only for its owner, only where every current reader heard it, and only while every
current reader may read what it was derived from."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest

from tests.support.factories import ac
from vagent_graph.memory import rules
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience, AudienceMember
from vagent_shared.memory import MEMORY_MAX_CHARS, Memory
from vagent_shared.readers import DocRef, EntityRef, Readership, ResultScope

ALICE = ac("@alice:x", ["document_category:hr", "document_tag:public", "entity_type:person"])
BOB = ac("@bob:x", ["document_category:hr", "document_tag:public", "entity_type:person"])
CAROL = ac("@carol:x", ["document_tag:public"])
ALICE_NO_HR = ac("@alice:x", ["document_tag:public", "entity_type:person"])  # lost the HR role
ALICE_GLOBEX = ac("@alice:x", ["document_category:hr"], domain="globex")

SALARIES = DocRef(doc_id="salaries", category="hr", tags=("confidential",))
PRESS = DocRef(doc_id="press", category="news", tags=("public",))
HR = ResultScope(domain="acme", documents=(SALARIES,))
PUBLIC = ResultScope(domain="acme", documents=(PRESS,))
PEOPLE = ResultScope(domain="acme", entities=(EntityRef(id="ana", entity_type="person"),))


def room(*members: AcContext | str, public_only: bool = False) -> Audience:
    """A group room of the asker and `members` (an AcContext, or a user the provider did not
    answer for)."""
    listed = [
        AudienceMember(user_id=m, ac_context=None)
        if isinstance(m, str)
        else AudienceMember(user_id=m.user_id, ac_context=m)
        for m in members
    ]
    return Audience(members=listed, public_only=public_only, member_count=len(listed) + 2)


BIG = room(public_only=True)


def memory(
    heard_by: tuple[str, ...] = ("@alice:x",),
    *,
    owner: str = "@alice:x",
    domain: str = "acme",
    scope: ResultScope | None = None,
    everywhere: bool = False,
    id: str = "m1",
) -> Memory:
    return Memory(
        id=id,
        owner=owner,
        domain=domain,
        text=f"memory {id}",
        created_at=datetime(2026, 11, 22, tzinfo=UTC),
        room_id="!r:x",
        heard_by=heard_by,
        everywhere=everywhere,
        scope=scope or ResultScope(),
    )


def why(m: Memory, asker: AcContext, audience: Audience | None, *, unchecked: bool = False) -> str | None:
    return rules.withheld_reason(m, Readership(asker, audience), unchecked=unchecked)


# ---- who reads now, who hears -------------------------------------------------------------
def test_readers_now_are_the_asker_and_the_members_known_by_name() -> None:
    assert rules.readers_now(ALICE, None) == frozenset({"@alice:x"})  # a DM
    assert rules.readers_now(ALICE, room()) == frozenset({"@alice:x"})  # a room she is alone in
    assert rules.readers_now(ALICE, room(BOB, "@eve:x")) == frozenset({"@alice:x", "@bob:x", "@eve:x"})
    assert rules.readers_now(ALICE, BIG) is None  # too many to check
    assert rules.readers_now(ALICE, None, unchecked=True) is None  # AUDIENCE_FILTER=off
    assert rules.readers_now(ALICE, room(BOB), unchecked=True) is None


def test_hearers_of_a_memory_written_now() -> None:
    assert rules.hearers(ALICE, None) == ("@alice:x",)
    assert rules.hearers(ALICE, room(CAROL, BOB)) == ("@alice:x", "@bob:x", "@carol:x")  # sorted
    assert rules.hearers(ALICE, room("@eve:x")) == ("@alice:x", "@eve:x")  # unresolved still heard it
    # readers not known by name: only the asker is sure to have heard it
    assert rules.hearers(ALICE, BIG) == ("@alice:x",)
    assert rules.hearers(ALICE, room(BOB), unchecked=True) == ("@alice:x",)


# ---- rule 2: every current reader heard it -------------------------------------------------
def test_a_dm_memory_is_recalled_in_the_owners_dm_only() -> None:
    dm = memory(rules.hearers(ALICE, None))
    assert why(dm, ALICE, None) is None
    assert why(dm, ALICE, room()) is None  # a room where only she reads
    assert why(dm, ALICE, room(BOB)) == "not_heard"  # a group room
    assert why(dm, ALICE, room(CAROL)) == "not_heard"
    assert why(dm, ALICE, BIG) == "not_heard"
    assert why(dm, ALICE, None, unchecked=True) == "not_heard"


def test_a_group_memory_follows_the_people_who_were_there() -> None:
    group = memory(rules.hearers(ALICE, room(BOB, CAROL)))
    assert why(group, ALICE, room(BOB, CAROL)) is None  # the same room
    assert why(group, ALICE, None) is None  # a DM of a member (the owner's own)
    assert why(group, ALICE, room(BOB)) is None  # a conversation among people who were all there
    assert why(group, ALICE, room(BOB, CAROL, "@dave:x")) == "not_heard"  # a newcomer
    assert why(group, ALICE, room("@dave:x")) == "not_heard"
    assert why(group, ALICE, BIG) == "not_heard"
    assert why(group, ALICE, room(BOB, CAROL), unchecked=True) == "not_heard"


def test_an_everywhere_memory_is_heard_everywhere_but_its_sources_are_still_judged() -> None:
    plain = memory(everywhere=True)
    assert why(plain, ALICE, room(BOB, CAROL, "@dave:x")) is None
    assert why(plain, ALICE, BIG) is None  # a public_only room
    assert why(plain, ALICE, None, unchecked=True) is None
    public = memory(everywhere=True, scope=PUBLIC)
    assert why(public, ALICE, BIG) is None  # tagged public: the big room may read it
    hr = memory(everywhere=True, scope=HR)
    assert why(hr, ALICE, None) is None
    assert why(hr, ALICE, BIG) == "source_not_readable"
    assert why(hr, ALICE, room(CAROL)) == "source_not_readable"
    assert why(hr, ALICE, room(BOB)) is None
    mine = memory(everywhere=True, scope=ResultScope(domain="acme", personal_to="@alice:x"))
    assert why(mine, ALICE, None) is None
    assert why(mine, ALICE, BIG) == "source_not_readable"  # her own results, strangers reading
    # a room whose readers nobody checked (AUDIENCE_FILTER=off): nothing derived from anything
    assert why(hr, ALICE, None, unchecked=True) == "source_not_readable"
    assert why(mine, ALICE, None, unchecked=True) == "source_not_readable"


def test_not_heard_is_reported_before_unreadable_sources() -> None:
    m = memory(scope=HR)
    assert why(m, ALICE, room(CAROL)) == "not_heard"


# ---- rule 3: every current reader may read its sources, judged NOW -------------------------
def test_a_person_who_lost_the_hr_role_no_longer_gets_memories_derived_from_hr() -> None:
    m = memory(scope=HR)
    assert why(m, ALICE, None) is None
    assert why(m, ALICE_NO_HR, None) == "source_not_readable"
    assert why(m, ALICE_GLOBEX, None) == "source_not_readable"  # her active tenant changed
    assert why(memory(scope=PUBLIC), ALICE_NO_HR, None) is None


def test_every_reader_must_be_allowed_the_sources() -> None:
    heard = ("@alice:x", "@bob:x", "@carol:x", "@eve:x")
    assert why(memory(heard, scope=HR), ALICE, room(BOB)) is None
    assert why(memory(heard, scope=HR), ALICE, room(BOB, CAROL)) == "source_not_readable"
    assert why(memory(heard, scope=PEOPLE), ALICE, room(BOB)) is None
    assert why(memory(heard, scope=PEOPLE), ALICE, room(CAROL)) == "source_not_readable"
    # a member the provider did not answer for may read nothing
    assert why(memory(heard, scope=PUBLIC), ALICE, room("@eve:x")) == "source_not_readable"
    assert why(memory(heard), ALICE, room("@eve:x")) is None  # nothing derived: heard is enough
    globex_bob = ac("@bob:x", ["document_category:hr"], domain="globex")
    assert why(memory(heard, scope=HR), ALICE, room(globex_bob)) == "source_not_readable"


def test_personal_results_only_for_those_they_were_shown_to() -> None:
    heard = ("@alice:x", "@bob:x", "@carol:x")
    mine = ResultScope(domain="acme", personal_to="@alice:x")
    assert why(memory(heard, scope=mine), ALICE, None) is None
    assert why(memory(heard, scope=mine), ALICE, room(BOB)) == "source_not_readable"
    shown = ResultScope(domain="acme", personal_to="@alice:x", shown_to=("@bob:x",))
    assert why(memory(heard, scope=shown), ALICE, room(BOB)) is None
    assert why(memory(heard, scope=shown), ALICE, room(BOB, CAROL)) == "source_not_readable"
    bobs = ResultScope(domain="acme", personal_to="@bob:x", shown_to=("@alice:x",))
    assert why(memory(heard, scope=bobs), ALICE, None) == "source_not_readable"  # never another's


# ---- rule 1: the owner's, in their tenant ---------------------------------------------------
def test_only_the_owners_memories_of_the_current_tenant_are_candidates() -> None:
    assert rules.is_candidate(memory(), ALICE)
    assert not rules.is_candidate(memory(owner="@bob:x", heard_by=("@alice:x", "@bob:x")), ALICE)
    assert not rules.is_candidate(memory(), ALICE_GLOBEX)
    assert rules.is_candidate(memory(domain="globex"), ALICE_GLOBEX)
    # bob was in the room too, and may read everything: still never his memory for alice
    bobs = memory(("@alice:x", "@bob:x"), owner="@bob:x", everywhere=True)
    assert not rules.may_recall(bobs, Readership(ALICE, None))
    assert rules.may_recall(memory(), Readership(ALICE, None))
    assert not rules.may_recall(memory(), Readership(ALICE, room(BOB)))


# ---- the scope a memory records ------------------------------------------------------------
def test_union_scope_keeps_every_document_and_entity() -> None:
    union = rules.union_scope([HR, None, ResultScope(), PUBLIC, PEOPLE, HR], "acme")
    assert union.domain == "acme" and union.personal_to is None
    assert {d.doc_id for d in union.documents} == {"salaries", "press"}
    assert len(union.documents) == 2 and [e.id for e in union.entities] == ["ana"]
    assert rules.union_scope([], "acme").empty
    assert rules.union_scope([None, ResultScope()], "acme").empty
    # judged as a whole: carol may read the press release but not the salaries
    assert Readership(ALICE, room(BOB)).may_read(union)
    assert not Readership(ALICE, room(CAROL)).may_read(union)


def test_union_scope_keeps_a_document_seen_under_two_labels() -> None:
    """The same document re-tagged during the turn (public, then confidential): the memory is
    judged under both, whichever was seen last."""
    before = ResultScope(domain="acme", documents=(DocRef(doc_id="plan", category="news", tags=("public",)),))
    after = ResultScope(
        domain="acme", documents=(DocRef(doc_id="plan", category="hr", tags=("confidential",)),)
    )
    for order in ([before, after], [after, before]):
        union = rules.union_scope(order, "acme")
        assert len(union.documents) == 2
        assert not Readership(CAROL, None).may_read(union)
        assert not Readership(ALICE, BIG).may_read(union)


def test_union_scope_personal_results_are_shown_only_to_who_saw_them_all() -> None:
    to_bob = ResultScope(domain="acme", personal_to="@alice:x", shown_to=("@bob:x", "@carol:x"))
    to_carol = ResultScope(domain="acme", personal_to="@alice:x", shown_to=("@carol:x",))
    union = rules.union_scope([to_bob, PUBLIC, to_carol], "acme")
    assert union.personal_to == "@alice:x" and union.shown_to == ("@carol:x",)
    assert Readership(ALICE, room(CAROL)).may_read(union)
    assert not Readership(ALICE, room(BOB)).may_read(union)
    only_hers = rules.union_scope([to_bob, ResultScope(domain="acme", personal_to="@alice:x")], "acme")
    assert only_hers.personal_to == "@alice:x" and only_hers.shown_to == ()


def test_a_damaged_union_is_readable_by_nobody() -> None:
    foreign = ResultScope(domain="globex", documents=(PRESS,))
    for scopes in (
        [PUBLIC, foreign],  # a result from another tenant
        [ResultScope(documents=(PRESS,))],  # a scope that names no tenant
        [ResultScope(personal_to="@alice:x"), ResultScope(personal_to="@bob:x")],  # two owners
    ):
        union = rules.union_scope(scopes, "acme")
        assert not union.empty
        assert not Readership(ALICE, None).may_read(union), scopes
        assert not Readership(ac("@alice:x", superuser=True), None).may_read(union), scopes
        assert why(memory(scope=union), ALICE, None) == "source_not_readable"


# ---- what is never stored ------------------------------------------------------------------
SECRETS = [
    "dev-tickets-key-alice-" + secrets.token_hex(8),
    "dev-tickets-key-alice-9c55659c5565493f",  # random, but with many repeats: it once slipped
    "dev-tickets-key-alice-4150239187736402",  # random hex that happens to be all digits
    "sk-proj-" + secrets.token_urlsafe(24),
    "ghp_" + secrets.token_hex(18),
    "AKIAIOSFODNN7EXAMPLE",
    "Bearer " + secrets.token_urlsafe(16),
    "my password is Tr0ub4dor&3",
    "password: hunter2hunter2",
    "here it is: dsX4mwYHSC6JSOUSGeIuwVWncPRCB-Zc",
    "postgres://svc:" + secrets.token_hex(6) + "@db.internal/app",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlX2hlcmU",
]


@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_is_refused_with_a_reason_that_does_not_repeat_it(secret: str) -> None:
    for text in (secret, f"remember my key for the staging box: {secret}", f"  {secret}\n"):
        reason = rules.refusal(text)
        assert reason is not None and "secret" in reason
        assert secret not in reason


@pytest.mark.parametrize(
    "text",
    [
        "answer in German",
        "I work on project Falcon with Ana; ticket T-1042 is mine",
        "my build is da39a3ee5e6b4b0d3255bfef95601890afd80709",  # a commit hash
        "x" * MEMORY_MAX_CHARS,
        "  " + "y" * MEMORY_MAX_CHARS + "  \n",  # the spaces around do not count
    ],
)
def test_ordinary_text_is_stored(text: str) -> None:
    assert rules.refusal(text) is None


def test_empty_and_too_long_text_is_refused() -> None:
    assert rules.refusal("") == rules.refusal(" \n\t ") == "there is nothing to remember."
    too_long = rules.refusal("z" * (MEMORY_MAX_CHARS + 1))
    assert too_long is not None and str(MEMORY_MAX_CHARS) in too_long and "501" in too_long


# ---- recallable: the last check before the model ---------------------------------------------
def test_recallable_keeps_the_relevance_order_and_counts_what_it_withheld() -> None:
    heard = ("@alice:x", "@bob:x")
    ms = [
        memory(heard, id="a"),
        memory(("@alice:x",), id="dm"),  # not heard by bob
        memory(heard, owner="@bob:x", id="bobs"),  # another user's: dropped, not counted
        memory(heard, scope=PEOPLE, id="b"),
        memory(heard, domain="globex", id="other-tenant"),  # dropped, not counted
        memory(heard, scope=ResultScope(domain="acme", personal_to="@alice:x"), id="mine"),
        memory(id="everywhere", everywhere=True),
        memory(heard, id="c"),
    ]
    found, withheld = rules.recallable(ms, Readership(ALICE, room(BOB)), k=10)
    assert [m.id for m in found] == ["a", "b", "everywhere", "c"]
    assert withheld == {"not_heard": 1, "source_not_readable": 1}
    found, _ = rules.recallable(list(reversed(ms)), Readership(ALICE, room(BOB)), k=10)
    assert [m.id for m in found] == ["c", "everywhere", "b", "a"]


def test_recallable_gives_at_most_k() -> None:
    ms = [memory(id=f"m{i}") for i in range(8)]
    found, withheld = rules.recallable(ms, Readership(ALICE, None), k=3)
    assert [m.id for m in found] == ["m0", "m1", "m2"] and not withheld
    assert rules.recallable(ms, Readership(ALICE, None), k=0) == ([], {})
    # withheld ones do not take a place: the next recallable ones fill it
    mixed = [memory(("@alice:x",), id="dm1")]
    mixed += [memory(("@alice:x", "@bob:x"), id=f"g{i}") for i in range(1, 5)]
    found, withheld = rules.recallable(mixed, Readership(ALICE, room(BOB)), k=2)
    assert [m.id for m in found] == ["g1", "g2"] and withheld == {"not_heard": 1}


def test_recallable_in_a_room_whose_readers_are_not_checked() -> None:
    ms = [memory(id="dm"), memory(("@alice:x", "@bob:x"), id="group"), memory(id="pref", everywhere=True)]
    found, withheld = rules.recallable(ms, Readership(ALICE, None), k=5, unchecked=True)
    assert [m.id for m in found] == ["pref"] and withheld == {"not_heard": 2}
    found, withheld = rules.recallable(ms, Readership(ALICE, BIG), k=5)
    assert [m.id for m in found] == ["pref"] and withheld == {"not_heard": 2}
