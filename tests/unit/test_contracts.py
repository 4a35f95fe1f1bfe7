"""Contracts both services rely on: session ids, AcContext semantics, events, bodies."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from vagent_shared import AcContext, BotMessage, FeedbackRequest, SessionId, parse_sse_event
from vagent_shared import access as res
from vagent_shared.events import Done, HitlRequest, TextChunk

ODD_IDS = [
    ("!abc:example.org", None, "@bob:example.org"),
    ("!abc:example.org", "$ev1:example.org", "@bob:example.org"),  # room v1/v2 event ids
    ("!Opaque123_-", "$AbC+/x=", "@b.o_b=1:matrix.example.org:8448"),  # v12 room, port
    ("!abc:example.org:8448", "$YmFzZTY0dXJs", "@bob:localhost"),
    ("!a:b", None, "@x:y"),
    ("!nocolon", "$t", "@user:server"),
]


@pytest.mark.parametrize("room,thread,user", ODD_IDS)
def test_session_id_round_trip(room: str, thread: str | None, user: str) -> None:
    sid = SessionId(room_id=room, thread_id=thread, user_id=user)
    text = sid.format()
    assert SessionId.parse(text) == sid
    assert text.endswith(":" + user)
    assert (":main:" in text) == (thread is None)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "main",
        "!room:server:main",
        "!room:server:main:bob",
        "!room:srv:thread:@bob:srv",
        "room:main:@bob:srv",
        "!room:main:@bob",
        "!room:main:@:srv",
        "!ro om:main:@bob:srv",
    ],
)
def test_session_id_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        SessionId.parse(bad)
    assert not SessionId.is_valid(bad)


CAMEL = {
    "userId": "@alice:localhost",
    "activeAclDomain": "acme",
    "activeRoles": ["analyst"],
    "superuserGroups": [],
    "roles": {
        "acme": [
            {"name": "analyst", "instances": ["agent:vagent", "tool:database_query"]},
            {"name": "admin", "instances": ["tool:delete_records"]},  # held, not active
        ],
        "other": [{"name": "analyst", "instances": ["tool:delete_records"]}],
    },
}


def test_ac_context_uses_active_roles_in_active_domain_only() -> None:
    ac = AcContext.model_validate(CAMEL)
    assert ac.get_instances_for_roles(ac.active_roles) == {"agent:vagent", "tool:database_query"}
    # a role the user holds but has not activated grants nothing
    assert ac.get_instances_for_roles(["admin"]) == set()
    assert not ac.can_access("tool:delete_records")
    assert ac.has_role("analyst", "tool:database_query")
    assert not ac.has_role("admin", "tool:delete_records")
    # other domains are ignored unless asked for explicitly
    assert ac.has_role("analyst", "tool:delete_records", domain="other")
    assert not ac.has_role("analyst", "tool:delete_records")


def test_ac_context_accepts_snake_case_and_serialises_camel_case() -> None:
    snake = {
        "user_id": "@a:x",
        "active_acl_domain": "d",
        "active_roles": ["r"],
        "superuser_groups": [],
        "roles": {"d": [{"name": "r", "instances": ["tool:t"]}]},
    }
    ac = AcContext.model_validate(snake)
    assert ac.can_access("tool:t")
    wire = ac.to_wire()
    assert set(wire) == {"userId", "activeAclDomain", "activeRoles", "superuserGroups", "roles"}
    assert AcContext.model_validate(json.loads(json.dumps(wire))) == ac


def test_superuser_bypasses_checks() -> None:
    ac = AcContext.model_validate({**CAMEL, "superuserGroups": ["vagent-admins"], "activeRoles": []})
    assert ac.is_superuser()
    assert ac.can_access("tool:delete_records")
    assert ac.has_role("nothing", "tool:anything")


def test_wildcard_grant_covers_one_kind_only() -> None:
    ac = AcContext.model_validate(
        {**CAMEL, "roles": {"acme": [{"name": "analyst", "instances": ["tool:*"]}]}}
    )
    assert ac.can_access("tool:delete_records")
    assert not ac.can_access("agent:vagent")
    assert not ac.can_access("document:x")


def test_only_a_whole_kind_is_a_wildcard() -> None:
    ac = AcContext.model_validate(
        {
            **CAMEL,
            "roles": {"acme": [{"name": "analyst", "instances": ["document:q3:*", "document_tag:pub*"]}]},
        }
    )
    assert ac.can_access("document:q3:*") and ac.can_access("document_tag:pub*")
    assert not ac.can_access("document:q3:secret")
    assert not ac.can_access("document_tag:public")


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"userId": "", "activeAclDomain": "d"},
        {"userId": "u", "activeAclDomain": "d", "roles": {"d": [{"instances": ["x"]}]}},
        {"userId": "u", "activeAclDomain": "d", "activeRoles": "admin"},
    ],
)
def test_malformed_ac_context_is_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        AcContext.model_validate(bad)


def test_resource_helpers() -> None:
    assert res.agent("vagent") == "agent:vagent"
    assert res.tool("delete_records") == "tool:delete_records"
    assert res.document("d1") == "document:d1"
    assert res.document_category("hr") == "document_category:hr"
    assert res.document_tag("t") == "document_tag:t"
    assert res.entity("e") == "entity:e"
    assert res.entity_type("customer") == "entity_type:customer"
    assert res.entity_tag("vip") == "entity_tag:vip"
    assert res.Resource.parse("document_tag:x") == (res.Resource.DOCUMENT_TAG, "x")
    with pytest.raises(ValueError):
        res.tool("")
    with pytest.raises(ValueError):
        res.Resource.parse("weird:thing")


def test_bot_message_must_match_its_session_id() -> None:
    sid = "!r:localhost:main:@alice:localhost"
    ok = BotMessage(session_id=sid, room_id="!r:localhost", user_id="@alice:localhost", message="hi")
    assert ok.session.user_id == "@alice:localhost"
    with pytest.raises(ValidationError, match="room_id"):
        BotMessage(session_id=sid, room_id="!other:localhost", user_id="@alice:localhost", message="hi")
    with pytest.raises(ValidationError, match="user_id"):
        BotMessage(session_id=sid, room_id="!r:localhost", user_id="@mallory:localhost", message="hi")
    with pytest.raises(ValidationError):
        FeedbackRequest(session_id="garbage", response="yes")


def test_sse_events_round_trip_by_name() -> None:
    ev = HitlRequest(question="Delete?", options=["yes", "no"], timeout_seconds=60, interrupt_id="abc")
    assert parse_sse_event(ev.EVENT, ev.sse_data()) == ev
    assert parse_sse_event("done", "{}") == Done()
    chunk = TextChunk(content="a", chunk_index=0)
    assert parse_sse_event("text_chunk", chunk.sse_data()) == chunk
    with pytest.raises(ValueError):
        parse_sse_event("nonsense", "{}")
