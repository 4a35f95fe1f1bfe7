"""Who may read which documents: the readers of an answer and the Redis filter they become.

Pure: no Redis here (tests/integration/test_doc_properties.py runs the same filter against a
real index). These pin down the rules a reviewer would check one by one.
"""

from __future__ import annotations

import pytest

from tests.support.factories import ac
from vagent_graph.knowledge.doc_filter import document_filter, escape_tag, grant_clause, tag_clause
from vagent_graph.knowledge.readers import (
    DOCUMENT_KINDS,
    ENTITY_KINDS,
    Grants,
    Readers,
    grants_for,
    readers_for,
)
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience, AudienceMember


def docs(*instances: str, user: str = "@u:x", domain: str = "acme", superuser: bool = False) -> AcContext:
    return ac(user, list(instances), domain=domain, superuser=superuser)


def test_grants_come_from_active_roles_in_the_active_domain_only() -> None:
    ctx = AcContext.model_validate(
        {
            "userId": "@u:x",
            "activeAclDomain": "acme",
            "activeRoles": ["reader"],
            "roles": {
                "acme": [
                    {
                        "name": "reader",
                        "instances": ["document:a", "document_category:hr", "document_tag:q3"],
                    },
                    {"name": "inactive", "instances": ["document:secret", "document:*"]},
                ],
                "other": [{"name": "reader", "instances": ["document_tag:confidential", "document:*"]}],
            },
        }
    )
    g = grants_for(ctx, DOCUMENT_KINDS)
    assert g == Grants(ids=frozenset({"a"}), classes=frozenset({"hr"}), tags=frozenset({"q3"}))
    assert not g.everything


def test_entity_and_document_grants_do_not_mix() -> None:
    ctx = docs("document:a", "entity:a", "entity_type:person", "tool:search_documents", "document_tag:x")
    assert grants_for(ctx, DOCUMENT_KINDS).ids == {"a"}
    assert grants_for(ctx, ENTITY_KINDS) == Grants(ids=frozenset({"a"}), classes=frozenset({"person"}))


def test_wildcards_and_superusers() -> None:
    assert grants_for(docs("document:*"), DOCUMENT_KINDS).everything
    assert grants_for(docs("document_category:*"), DOCUMENT_KINDS).everything
    tags_only = grants_for(docs("document_tag:*"), DOCUMENT_KINDS)
    assert tags_only.all_tags and not tags_only.everything  # untagged documents are not "any tag"
    assert tags_only.allows("d", "c", {"t"}) and not tags_only.allows("d", "c", set())
    assert grants_for(docs(superuser=True), DOCUMENT_KINDS).superuser


def test_an_empty_allow_list_means_no_readers_and_no_filter() -> None:
    nothing = docs("tool:search_documents", "agent:vagent")
    assert readers_for(nothing, None, DOCUMENT_KINDS) is None
    assert document_filter(None) is None


def test_the_filter_is_the_domain_and_id_or_category_or_tag() -> None:
    readers = readers_for(docs("document:a", "document_category:hr", "document_tag:q3"), None, DOCUMENT_KINDS)
    assert document_filter(readers) == "@domain:{acme} (@doc_id:{a} | @category:{hr} | @tags:{q3})"


def test_a_superuser_sees_the_active_domain_only() -> None:
    readers = readers_for(docs(superuser=True, domain="acme"), None, DOCUMENT_KINDS)
    assert document_filter(readers) == "@domain:{acme}"


@pytest.mark.parametrize(
    "value",
    [
        "a|b",
        "x}y",
        "-neg",
        "with space",
        "star*",
        "*",
        "q3-2026",
        "(p)",
        "@f:{x}",
        '"quoted"',
        "a\\b",
        "$x",
        "~t",
    ],
)
def test_query_syntax_in_values_is_escaped(value: str) -> None:
    clause = tag_clause("tags", [value])
    assert clause is not None
    inner = clause[len("@tags:{") : -1]
    # Every ASCII punctuation or space is escaped: nothing can close the braces, add an
    # alternative, negate, or become a wildcard.
    unescaped = [c for i, c in enumerate(inner) if not c.isalnum() and (i == 0 or inner[i - 1] != "\\")]
    assert all(c == "\\" for c in unescaped), (value, clause)
    assert escape_tag("plain") == "plain" and escape_tag("日本") == "日本"


def test_unrepresentable_grants_are_left_out_never_sent() -> None:
    assert tag_clause("doc_id", ["bad\nline", "tab\there"]) is None
    assert grant_clause(Grants(ids=frozenset({"bad\x00"}))) is None
    readers = readers_for(docs("document:ok", "document:bad\nline"), None, DOCUMENT_KINDS)
    assert document_filter(readers) == "@domain:{acme} @doc_id:{ok}"


def test_every_reader_of_a_room_must_be_allowed() -> None:
    alice = docs("document_category:finance", "document_tag:public", user="@alice:x")
    carol = docs("document_tag:public", user="@carol:x")
    room = Audience(members=[AudienceMember(user_id="@carol:x", ac_context=carol)], member_count=3)
    readers = readers_for(alice, room, DOCUMENT_KINDS)
    assert readers is not None and len(readers.grants) == 2
    flt = document_filter(readers)
    assert flt == "@domain:{acme} (@category:{finance} | @tags:{public}) @tags:{public}"
    assert readers.allows("press", "finance", {"public"})
    assert not readers.allows("q3-financials", "finance", {"confidential"})


def test_a_member_without_a_context_or_from_another_domain_means_nothing() -> None:
    alice = docs("document:*", user="@alice:x")
    unresolved = Audience(members=[AudienceMember(user_id="@eve:x")], member_count=3)
    assert readers_for(alice, unresolved, DOCUMENT_KINDS) is None
    elsewhere = docs("document:*", user="@bob:x", domain="other")
    moved = Audience(members=[AudienceMember(user_id="@bob:x", ac_context=elsewhere)], member_count=3)
    assert readers_for(alice, moved, DOCUMENT_KINDS) is None
    nothing = docs("tool:search_documents", user="@dave:x")
    blind = Audience(members=[AudienceMember(user_id="@dave:x", ac_context=nothing)], member_count=3)
    assert readers_for(alice, blind, DOCUMENT_KINDS) is None


def test_large_rooms_use_public_documents_only() -> None:
    alice = docs("document:*", user="@alice:x")
    readers = readers_for(alice, Audience(public_only=True, member_count=80), DOCUMENT_KINDS)
    assert document_filter(readers) == "@domain:{acme} @tags:{public}"
    assert readers is not None and not readers.allows("x", "hr", {"internal"})


def test_identical_readers_are_one_clause() -> None:
    same = [docs("document_tag:public", user=f"@m{i}:x") for i in range(30)]
    room = Audience(members=[AudienceMember(user_id=c.user_id, ac_context=c) for c in same], member_count=32)
    readers = readers_for(docs("document:*"), room, DOCUMENT_KINDS)
    assert readers == Readers(domain="acme", grants=(Grants(tags=frozenset({"public"})),))
