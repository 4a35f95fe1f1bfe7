"""The gateway's translation to LangGraph's shapes: what `langgraph_sdk` and agent-chat-ui read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from vagent_gateway import translate
from vagent_gateway.identity import token_from, token_hash
from vagent_gateway.threads import ROOM_SERVER, metadata_matches, parse_thread_id, session_for

from vagent_shared.events import HitlAction, HitlRequest
from vagent_shared.session import SessionId

QUESTION = "Delete the records older than 2020-01-01?\n- older_than: 2020-01-01"


def hitl(actions: list[HitlAction] | None = None, options: list[str] | None = None) -> HitlRequest:
    return HitlRequest(
        question=QUESTION, options=options or ["yes", "no"], interrupt_id="int-1", actions=actions or []
    )


def test_interrupt_is_langchains_hitl_request_with_approve_and_reject_only() -> None:
    got = translate.interrupt(hitl([HitlAction(name="delete_records", args={"older_than": "2020-01-01"})]))
    assert got == {
        "id": "int-1",
        "value": {
            "action_requests": [
                {"name": "delete_records", "args": {"older_than": "2020-01-01"}, "description": QUESTION}
            ],
            "review_configs": [{"action_name": "delete_records", "allowed_decisions": ["approve", "reject"]}],
        },
    }


def test_a_question_without_actions_is_one_action_named_after_it() -> None:
    (request,) = translate.interrupt_value(hitl())["action_requests"]
    assert request == {
        "name": "Delete the records older than 2020-01-01?",
        "args": {},
        "description": QUESTION,
    }


def test_values_hold_messages_and_the_pending_interrupt() -> None:
    msgs = [translate.human_message("hi", "h1"), translate.ai_message("hello", "a1")]
    assert translate.values(msgs) == {"messages": msgs}
    with_question = translate.values(msgs, hitl())
    assert with_question["messages"] == msgs and with_question["__interrupt__"][0]["id"] == "int-1"


def test_messages_are_langchain_dicts() -> None:
    from langchain_core.messages import messages_from_dict

    human, ai = translate.human_message("hi", "h1"), translate.ai_message("hello", "a1")
    loaded = messages_from_dict([{"type": m["type"], "data": m} for m in (human, ai)])
    assert [type(m).__name__ for m in loaded] == ["HumanMessage", "AIMessage"]
    chunk = translate.ai_chunk("hel", "a1")
    assert chunk["type"] == "AIMessageChunk" and chunk["id"] == "a1" and chunk["content"] == "hel"


@pytest.mark.parametrize(
    ("resume", "answer"),
    [
        ({"decisions": [{"type": "approve"}]}, "yes"),
        ({"decisions": [{"type": "reject", "message": "not now"}]}, "no"),
        ("yes", "yes"),
        (" No. ", "no"),
        ("y", "yes"),
        ({"int-1": {"decisions": [{"type": "approve"}]}}, "yes"),
    ],
)
def test_resume_answers(resume: Any, answer: str) -> None:
    assert translate.resume_answer(resume, ["yes", "no"]) == answer


@pytest.mark.parametrize(
    "resume",
    [
        {"decisions": [{"type": "edit", "edited_action": {"name": "delete_records", "args": {}}}]},
        {"decisions": [{"type": "approve"}, {"type": "approve"}]},
        {"decisions": []},
        {"decisions": "approve"},
        "maybe",
        42,
        None,
    ],
)
def test_resumes_that_are_not_the_confirmed_answer_are_refused(resume: Any) -> None:
    with pytest.raises(translate.BadResume):
        translate.resume_answer(resume, ["yes", "no"])


@pytest.mark.parametrize(
    ("run_input", "text"),
    [
        ({"messages": [{"type": "human", "content": "a"}, {"type": "ai", "content": "b"}]}, "a"),
        ({"messages": [{"role": "user", "content": "first"}, {"role": "user", "content": "last"}]}, "last"),
        ({"messages": [{"type": "human", "content": [{"type": "text", "text": "parts"}]}]}, "parts"),
        ({"messages": {"type": "human", "content": "one"}}, "one"),
        ({"messages": [{"type": "ai", "content": "only ai"}]}, None),
        ({}, None),
        (None, None),
        ("text", None),
    ],
)
def test_the_turn_is_the_last_human_message(run_input: Any, text: str | None) -> None:
    assert translate.last_human_text(run_input) == text


def test_modes_keep_the_supported_ones() -> None:
    assert translate.modes(None) == {"values"}
    assert translate.modes("messages-tuple") == {"messages-tuple"}
    assert translate.modes(["values", "debug", "updates"]) == {"values", "updates"}


def test_sse_frame_is_one_event_of_json() -> None:
    frame = translate.sse_frame("values", {"messages": [{"content": "a\nb"}]}).decode()
    event, data, blank, end = frame.split("\n")
    assert event == "event: values" and blank == end == ""
    assert json.loads(data.removeprefix("data: ")) == {"messages": [{"content": "a\nb"}]}


def test_thread_sessions_are_synthetic_rooms_no_homeserver_can_have() -> None:
    tid = parse_thread_id("E3219B8D-1BA4-4998-B1FB-0AC80E77A109")
    assert tid == "e3219b8d-1ba4-4998-b1fb-0ac80e77a109"
    sid = session_for(tid, "@alice:localhost")
    assert sid.room_id.endswith(":" + ROOM_SERVER) and sid.thread_id is None
    assert SessionId.parse(sid.format()) == sid
    assert parse_thread_id("../etc") is None and parse_thread_id("") is None


def test_metadata_filter() -> None:
    assert metadata_matches({"a": 1, "b": "x"}, {"a": 1})
    assert not metadata_matches({"a": 1}, {"a": 2})
    assert not metadata_matches({}, {"a": None})
    assert metadata_matches({"a": 1}, None)


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        ({"authorization": "Bearer syt_abc"}, "syt_abc"),
        ({"authorization": "bearer syt_abc"}, "syt_abc"),
        ({"x-api-key": "syt_key"}, "syt_key"),
        ({"authorization": "Basic dXNlcg==", "x-api-key": "syt_key"}, "syt_key"),
        ({"authorization": "Bearer "}, None),
        ({"x-api-key": "has space"}, None),
        ({"x-api-key": "x" * 5000}, None),
        ({"x-api-key": "syt_key\xa0"}, None),  # a non-breaking space is not HTTP's white space
        ({"authorization": "Bearer syt_abc\xa0"}, None),
        ({}, None),
    ],
)
def test_token_from_headers(headers: dict[str, str], token: str | None) -> None:
    assert token_from(headers) == token


def test_the_token_cache_key_is_a_hash_not_the_token() -> None:
    assert "syt_secret" not in token_hash("syt_secret") and len(token_hash("syt_secret")) == 64
