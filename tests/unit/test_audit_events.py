"""The audit trail's pure parts and its writer's promise: the request never waits for, or
fails because of, the audit stream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from vagent_shared.audit import REDACTED, AuditEvent, scrub_arguments
from vagent_shared.audit_trail import AuditTrail, stream_bounds


def test_secrets_are_removed_by_name_and_by_shape() -> None:
    args = {
        "api_key": "k-123",
        "Password": "hunter2",
        "headers": {"Authorization": "Bearer abc.def", "X-Trace": "t"},
        "note": "use Bearer eyJhbGciOi.x.y please",
        "credential": {"anything": 1},
    }
    out = scrub_arguments(args, include_content=True)
    text = json.dumps(out)
    for secret in ("k-123", "hunter2", "abc.def", "eyJhbGciOi"):
        assert secret not in text
    assert out["api_key"] == out["Password"] == out["credential"] == REDACTED
    assert out["headers"]["X-Trace"] == "t"


def test_a_key_inside_a_free_text_argument_is_masked_and_the_rest_kept() -> None:
    key = "sk-proj-4f9c2a7b1e8d3c6a9f0b2d4e"
    out = scrub_arguments({"title": f"rotate {key} today", "customer": "dev-key-7f3c9a2e51b84d06x"}, True)
    assert key not in json.dumps(out) and "7f3c9a2e51b84d06" not in json.dumps(out)
    assert out["title"] == f"rotate {REDACTED} today" and out["customer"] == REDACTED


def test_message_bodies_are_kept_only_when_configured() -> None:
    args = {"title": "VPN down", "description": "my home address is 1 Main St", "priority": "high"}
    out = scrub_arguments(args)
    assert out["title"] == "VPN down" and out["priority"] == "high"
    assert out["description"] == "[omitted: 28 chars]"
    assert scrub_arguments(args, include_content=True)["description"] == args["description"]
    assert scrub_arguments({"query": "salary of bob"})["query"] == "[omitted: 13 chars]"


def test_long_values_lists_and_depth_are_bounded() -> None:
    out = scrub_arguments({"title": "x" * 1000, "ids": list(range(100)), "a": {"b": {"c": {"d": {"e": 1}}}}})
    assert len(out["title"]) < 250 and "1000 chars" in out["title"]
    assert len(out["ids"]) == 20
    assert "[nested]" in json.dumps(out)


def test_events_round_trip_through_a_stream_entry() -> None:
    event = AuditEvent(
        service="graph", user_id="@a:x", event_type="tool_access", resource="tool:t", decision="allowed"
    )
    fields = {k.encode(): v.encode() for k, v in event.to_stream().items()}
    assert AuditEvent.from_stream(fields) == event
    with pytest.raises(ValueError):
        AuditEvent.from_stream({b"other": b"1"})


def test_stream_bounds_by_count_or_by_age() -> None:
    assert stream_bounds(1000, 0) == {"maxlen": 1000, "approximate": True}
    assert stream_bounds(1000, 3600, now=10_000) == {
        "minid": f"{(10_000 - 3600) * 1000}-0",
        "approximate": True,
    }
    assert stream_bounds(0, 0) == {}


class FakeStream:
    """A Redis stand-in for the trail's one use of it: XADDs in a pipeline."""

    def __init__(self, fail: BaseException | None = None, delay: float = 0) -> None:
        self.fail, self.delay, self.added = fail, delay, []  # type: ignore[var-annotated]
        self.round_trips = 0

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        assert transaction is False
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, stream: FakeStream) -> None:
        self.stream, self.queued = stream, []  # type: ignore[var-annotated]

    def xadd(self, name: str, fields: dict[str, str], **kw: Any) -> None:
        self.queued.append((name, fields, kw))

    async def execute(self, raise_on_error: bool = True) -> list[str]:
        assert raise_on_error is False
        self.stream.round_trips += 1
        await asyncio.sleep(self.stream.delay)
        if self.stream.fail:
            raise self.stream.fail
        self.stream.added += self.queued
        return ["1-0"] * len(self.queued)


def trail(redis: FakeStream | None, failures: list[str], **kw: Any) -> AuditTrail:
    return AuditTrail("bot", redis, "audit", on_failure=failures.append, **kw)


async def test_recorded_events_reach_the_stream_with_their_bound() -> None:
    stream, failures = FakeStream(), []  # type: ignore[var-annotated]
    t = trail(stream, failures, maxlen=50)
    t.start()
    t.record("agent_access", user_id="@a:x", resource="agent:vagent", decision="allowed")
    await t.aclose()
    ((name, fields, kw),) = stream.added
    assert name == "audit" and kw == {"maxlen": 50, "approximate": True}
    assert AuditEvent.model_validate_json(fields["event"]).user_id == "@a:x"
    assert failures == []


@pytest.mark.parametrize(
    "stream", [FakeStream(fail=ConnectionError("down")), FakeStream(delay=5)], ids=["error", "hang"]
)
async def test_a_failing_stream_is_counted_and_never_raised(stream: FakeStream) -> None:
    failures: list[str] = []
    t = trail(stream, failures, write_timeout=0.1)
    t.start()
    event = t.record("tool_access", user_id="@a:x", resource="tool:t", decision="denied")  # returns at once
    assert event.decision == "denied"
    await t.flush(within=2)
    assert failures in (["ConnectionError"], ["timeout"])
    await t.aclose()


async def test_a_full_queue_drops_and_counts_instead_of_waiting() -> None:
    failures: list[str] = []
    t = trail(FakeStream(delay=5), failures, queue_size=2)  # not started: nothing drains
    for _ in range(5):
        t.record("rag_query", user_id="@a:x", resource="tool:search_documents", decision="allowed")
    assert failures == ["queue_full"] * 3


async def test_a_burst_is_written_in_few_round_trips_and_nothing_is_held() -> None:
    stream, failures = FakeStream(delay=0.01), []  # type: ignore[var-annotated]
    t = trail(stream, failures)
    t.start()
    for i in range(1200):
        t.record("tool_offered", user_id=f"@u{i}:x", resource="agent:vagent", decision="allowed")
    await t.flush(within=5)
    assert [AuditEvent.model_validate_json(f["event"]).user_id for _, f, _ in stream.added] == [
        f"@u{i}:x" for i in range(1200)
    ]
    assert stream.round_trips <= 4 and t._queue.empty() and failures == []
    await t.aclose()


def test_without_redis_events_are_still_logged(capsys: pytest.CaptureFixture[str]) -> None:
    from vagent_shared.logs import configure_logging

    configure_logging("INFO", service="test")
    t = AuditTrail("graph", None, "audit")
    t.record("access_denied", user_id="unknown", resource="api:/x", decision="denied", reason="no token")
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "audit" and line["audit"]["event_type"] == "access_denied"


def test_tool_arguments_are_scrubbed_into_metadata() -> None:
    t = AuditTrail("graph", None, "audit")
    e = t.record(
        "tool_access",
        user_id="@a:x",
        resource="tool:create_ticket",
        decision="allowed",
        arguments={"title": "t", "description": "private words", "token": "s3cr3t"},
    )
    assert e.metadata["arguments"] == {"title": "t", "description": "[omitted: 13 chars]", "token": REDACTED}
