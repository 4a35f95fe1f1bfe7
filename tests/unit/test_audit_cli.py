"""`vagent audit`'s pure parts: times to stream ids, the filter, the table, JSON lines."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from vagent_graph import cli
from vagent_graph.cli import audit as audit_cli
from vagent_graph.cli.audit import COLUMNS, Query, format_time, json_line, spans_days, table_header, table_row
from vagent_graph.cli.output import cell
from vagent_graph.observability.audit_reader import Filter, id_before, parse_when, stream_id
from vagent_shared.audit import AuditEvent

NOW = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def event(**over: object) -> AuditEvent:
    base: dict[str, object] = {
        "timestamp": NOW,
        "service": "graph",
        "user_id": "@alice:localhost",
        "session_id": "!r:localhost:main:@alice:localhost",
        "domain": "acme",
        "event_type": "tool_access",
        "resource": "tool:delete_records",
        "decision": "denied",
        "reason": "not granted",
        "metadata": {"args": {"older_than": "2018-01-01"}},
    }
    return AuditEvent.model_validate(base | over)


def parse_args(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Query:
    """What `vagent audit ARGV` asks the stream for, without reading it."""
    asked: list[Query] = []
    monkeypatch.setattr(audit_cli, "read", lambda _show, q: asked.append(q))
    with pytest.raises(SystemExit) as exc:
        cli.main(["audit", *argv])
    assert exc.value.code == 0 and len(asked) == 1
    return asked[0]


@pytest.mark.parametrize(
    ("text", "back"),
    [
        ("90s", timedelta(seconds=90)),
        ("30m", timedelta(minutes=30)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("1w", timedelta(weeks=1)),
        (" 1.5H ", timedelta(minutes=90)),
        ("0s", timedelta(0)),
    ],
)
def test_durations_count_back_from_now(text: str, back: timedelta) -> None:
    assert parse_when(text, NOW) == NOW - back


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T09:30:00Z", datetime(2026, 11, 22, 9, 30, tzinfo=UTC)),
        ("2026-11-22T09:30:00", datetime(2026, 11, 22, 9, 30, tzinfo=UTC)),  # naive: UTC
        ("2026-11-22T11:30:00+02:00", datetime(2026, 11, 22, 9, 30, tzinfo=UTC)),
        ("2026-11-22", datetime(2026, 11, 22, tzinfo=UTC)),
        ("2026-11-22T09:30:00.250Z", datetime(2026, 11, 22, 9, 30, 0, 250000, tzinfo=UTC)),
    ],
)
def test_iso_times_are_read_as_utc(text: str, expected: datetime) -> None:
    got = parse_when(text, NOW)
    assert got == expected and got.tzinfo is not None and got.utcoffset() == timedelta(0)


@pytest.mark.parametrize("text", ["", "yesterday", "1y", "-1h", "h", "1 hour", "2026-13-01", "12:00"])
def test_bad_times_say_which_forms_are_accepted(text: str) -> None:
    with pytest.raises(ValueError, match=r"neither a duration \(90s, 30m, 1h, 2d, 1w\) nor an ISO-8601"):
        parse_when(text, NOW)


def test_a_bad_since_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["audit", "tail", "--since", "yesterday"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--since': 'yesterday' is neither a duration" in err


def test_until_before_since_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["audit", "export", "--since", "2026-11-22T10:00:00Z", "--until", "2026-11-21T10:00:00Z"])
    assert exc.value.code == 2 and "--until is before --since" in capsys.readouterr().err


def test_times_become_millisecond_stream_ids() -> None:
    assert stream_id(NOW) == f"{NOW_MS}-0"
    assert stream_id(NOW, end=True) == f"{NOW_MS}-{2**64 - 1}"
    assert stream_id(NOW + timedelta(microseconds=1999)) == f"{NOW_MS + 1}-0"  # within its ms
    assert id_before(NOW) == f"{NOW_MS - 1}-{2**64 - 1}"
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert stream_id(epoch - timedelta(days=1)) == "0-0" and id_before(epoch) == "0-0"
    other_zone = NOW.astimezone(timezone(timedelta(hours=5)))
    assert stream_id(other_zone) == stream_id(NOW)


def test_stream_ids_order_like_the_times() -> None:
    times = [parse_when(t, NOW) for t in ("2d", "1h", "30m", "90s", "0s")]
    ids = [tuple(int(p) for p in stream_id(t).split("-")) for t in times]
    assert ids == sorted(ids)


def test_filter_matches_every_given_field_exactly() -> None:
    e = event()
    assert Filter().matches(e)
    assert Filter(user="@alice:localhost", decision="denied", event_type="tool_access").matches(e)
    assert not Filter(user="@al:localhost").matches(e)  # no prefix matches
    assert not Filter(user="@alice:localhost.evil").matches(e)
    assert not Filter(user="@ALICE:localhost").matches(e)
    assert not Filter(decision="allowed").matches(e)
    assert not Filter(event_type="rag_query").matches(e)
    assert not Filter(user="@alice:localhost", decision="allowed").matches(e)


def test_the_cli_offers_exactly_the_contracts_decisions_and_types(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_args(["tail", "--decision", "expired", "--type", "user_forgotten"], monkeypatch)
    assert (args.decision, args.event_type, args.count, args.follow, args.json) == (
        "expired",
        "user_forgotten",
        50,
        False,
        False,
    )
    with pytest.raises(SystemExit):
        cli.main(["audit", "tail", "--decision", "maybe"])
    with pytest.raises(SystemExit):
        cli.main(["audit", "tail", "--count", "-3"])


def test_times_are_utc_clock_or_full_iso() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=-7)))
    assert format_time(local, full=False) == "10:00:00"
    assert format_time(local, full=True) == "2026-11-22T10:00:00Z"


def test_dates_are_shown_when_the_range_spans_days() -> None:
    today = [event(), event(timestamp=NOW - timedelta(hours=9))]
    assert not spans_days(None, today, NOW)
    assert not spans_days(NOW - timedelta(hours=20), today, NOW)
    assert spans_days(NOW - timedelta(days=2), [], NOW)
    assert spans_days(None, [*today, event(timestamp=NOW - timedelta(hours=11))], NOW)  # yesterday


def test_table_rows_line_up_under_the_header() -> None:
    rows = [
        table_row(event(), False),
        table_row(event(service="bot", event_type="agent_access", decision="allowed", reason=""), False),
        table_row(event(user_id="@" + "x" * 80 + ":example.org", resource="tool:" + "r" * 90), False),
    ]
    header = table_header(False)
    starts = [header.index(title) for title, _ in COLUMNS]
    assert header.startswith("TIME (UTC)")
    for row in rows:
        assert row.startswith("10:00:00")
        for start in starts[1:]:
            # each column starts where its title does (an empty last cell is not padded)
            assert row[start - 2 : start] == "  " or (start == starts[-1] and len(row) < start)
    assert rows[0][starts[0] :].startswith("graph")
    assert rows[0][starts[3] :].startswith("@alice:localhost")
    assert rows[0].endswith("not granted")
    assert rows[1].endswith("tool:delete_records")  # an empty last cell: no trailing spaces


def test_long_cells_are_cut_and_full_time_widens_the_first_column() -> None:
    long_user = "@" + "x" * 80 + ":example.org"
    row = table_row(event(user_id=long_user, reason="why " * 50), True)
    assert row.startswith("2026-11-22T10:00:00Z  graph")
    assert long_user not in row and "@xxxx" in row and "…" in row
    assert len(row) == len(table_header(True)) - len("REASON") + COLUMNS[-1][1]
    assert cell("abc", 3) == "abc" and cell("abcd", 3) == "ab…"


def test_cells_never_carry_terminal_escapes_or_line_breaks() -> None:
    row = table_row(event(reason="evil\x1b[2J\nnext line\r\u2028", resource="tool:\x07bell"), False)
    assert "\x1b" not in row and "\n" not in row and "\r" not in row and "\x07" not in row
    assert "\u2028" not in row and "evil?[2J?next line" in row


def test_json_lines_round_trip_exactly() -> None:
    original = event(metadata={"count": 3, "nested": {"a": [1, "b"]}, "text": "line\nbreak"})
    line = json_line(original)
    assert "\n" not in line and line == original.model_dump_json()
    assert AuditEvent.model_validate_json(line) == original
    assert AuditEvent.from_stream({b"event": line.encode()}) == original
    assert json.loads(line)["user_id"] == "@alice:localhost"


def test_count_zero_is_allowed_with_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_args(["tail", "-n", "0", "-f", "--json"], monkeypatch)
    assert args.count == 0 and args.follow and args.json
