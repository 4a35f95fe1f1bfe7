"""`make run`'s console: one short readable line per audit event (the full record stays in
the audit stream and the JSON logs), other JSON log lines as `time level event key=value`."""

from __future__ import annotations

import json

from run_local import AUDIT_WIDTH, TAG_WIDTH, readable


def tag(service: str) -> str:
    return f"{service:<{TAG_WIDTH}} "


def audit_log_line(**audit: object) -> str:
    record = {
        "timestamp": "2026-11-25T12:00:01.123456Z",
        "level": "info",
        "event": "audit",
        "logger": "vagent.audit",
        "service": "graph",
        "audit": {
            "timestamp": "2026-11-25T12:00:01.120000Z",
            "service": "graph",
            "user_id": "@alice:localhost",
            "session_id": "!room:localhost/$thread",
            "domain": "localhost",
            "event_type": "tool_access",
            "resource": "tool:delete_records",
            "decision": "allowed",
            "reason": "",
            "metadata": {"arguments": {"before": "2020-01-01"}, "tools": ["a"] * 40},
            **audit,
        },
    }
    return json.dumps(record)


def test_an_audit_event_is_one_short_line() -> None:
    out = readable("graph", audit_log_line(), color=False)
    assert (
        out
        == tag("graph") + "12:00:01 info    audit tool_access allowed @alice:localhost tool:delete_records"
    )


def test_the_reason_is_shown_and_a_long_or_hostile_event_stays_one_short_line() -> None:
    out = readable(
        "bot",
        audit_log_line(decision="denied", reason="not_offered", user_id="@x\x1b[2J\n:evil" + "y" * 500),
        color=False,
    )
    assert out is not None
    assert "\n" not in out and "\x1b" not in out
    assert out.startswith(tag("bot") + "12:00:01 info    audit tool_access denied @x?[2J?:evil")
    assert len(out) <= len(tag("bot") + "12:00:01 info    ") + AUDIT_WIDTH and out.endswith("…")


def test_other_log_lines_keep_their_fields() -> None:
    line = json.dumps(
        {"timestamp": "2026-11-25T12:00:02Z", "level": "warning", "event": "acp_started", "port": 8090}
    )
    assert readable("acp", line, color=False) == tag("acp") + "12:00:02 warning acp_started port=8090"
    assert readable("graph", "plain text\n", color=False) == tag("graph") + "plain text"
    assert readable("graph", "\n", color=False) is None


def flood_log_line(**fields: object) -> str:
    """The bot's `flood_limited` warning as structlog writes it (vagent_bot/access/flood.py)."""
    record = {
        "user_id": "@alice:localhost",
        "room_id": "!demo:localhost",
        "limit": 10,
        "window": 60.0,
        "event": "flood_limited",
        "level": "warning",
        "logger": "vagent_bot.access.flood",
        "timestamp": "2026-11-25T12:00:03.000001Z",
        "service": "bot",
        **fields,
    }
    return json.dumps(record)


def test_a_flood_refusal_is_one_readable_line() -> None:
    out = readable("bot", flood_log_line(), color=False)
    assert out == (
        tag("bot") + "12:00:03 warning flood_limited @alice:localhost refused: over 10 messages in 60 s"
        " (room !demo:localhost)"
    )


def test_a_hostile_flood_refusal_stays_one_short_line() -> None:
    out = readable("bot", flood_log_line(user_id="@x\x1b[2J\n:evil" + "y" * 500), color=False)
    assert out is not None and "\n" not in out and "\x1b" not in out
    assert len(out) <= len(tag("bot") + "12:00:03 warning ") + AUDIT_WIDTH and out.endswith("…")
