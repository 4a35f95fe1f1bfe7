"""Budgets and usage, the pure parts: the policy file (its errors say where), re-reading it,
whose limit applies, the 80% notice, the estimate a call is held for, the usage counters'
fields (whose they are, what `vagent usage` shows)."""

from __future__ import annotations

import json
import os
from datetime import date
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from structlog.testing import capture_logs

from vagent_graph.cli.usage import table_header, table_row
from vagent_graph.models.offline_model import OfflineChatModel
from vagent_graph.observability.budgets import Budgets, PolicyError, parse_policy
from vagent_graph.observability.tokens import approx_tokens
from vagent_graph.observability.usage import (
    OUTPUT_ALLOWANCE,
    Attempt,
    Charge,
    Meter,
    charge,
    day_rows,
    days_from,
    delta_chars,
    estimate,
    notice_due,
    notice_line,
    parse_since,
    prompt_tokens,
    refusal_message,
    reported_usage,
    row_field,
    schema_tokens,
    streamed_tokens,
    tenant_field,
    their_fields,
    user_field,
)
from vagent_graph.state.erasure import their_notice_keys
from vagent_shared import redis_keys
from vagent_shared.budgets import BudgetPolicy

EXAMPLE = """\
default_user_daily_tokens: 200000        # users not listed below
tenants:
  acme: {daily_tokens: 5000000}
users:
  "@alice:example.org": {daily_tokens: 100000}
llm_calls_per_turn: 12                   # beside the agent's max_turns
"""


# ---- the policy file ---------------------------------------------------------------------------


def test_the_documented_example_parses_and_limits_apply_by_user_then_default() -> None:
    p = parse_policy(EXAMPLE)
    assert p.user_limit("@alice:example.org") == 100000
    assert p.user_limit("@bob:example.org") == 200000  # the default
    assert p.tenant_limit("acme") == 5000000 and p.tenant_limit("other") is None
    assert p.llm_calls_per_turn == 12


def test_an_empty_file_or_no_default_means_no_limit() -> None:
    assert parse_policy("") == BudgetPolicy()
    p = parse_policy("users: {'@a:x': {daily_tokens: 5}}")
    assert p.user_limit("@a:x") == 5 and p.user_limit("@b:x") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'users:\n  "@alice:example.org": {daily_tokens: -1}\n',
            'users."@alice:example.org".daily_tokens: Input should be greater than or equal to 0',
        ),
        ("tenants:\n  acme: {daily_token: 5}\n", "tenants.acme.daily_token: Extra inputs are not permitted"),
        ("tenants:\n  acme: {}\n", "tenants.acme.daily_tokens: Field required"),
        ("llm_calls_per_turn: 0\n", "llm_calls_per_turn: Input should be greater than or equal to 1"),
        ("default_user_daily_tokens: lots\n", "default_user_daily_tokens: Input should be a valid integer"),
        ("budgets: 5\n", "budgets: Extra inputs are not permitted"),
    ],
)
def test_validation_errors_say_where(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy(text)
    assert message in str(exc.value)


def test_yaml_errors_give_line_and_column_without_quoting_the_file() -> None:
    with pytest.raises(PolicyError) as exc:
        parse_policy("tenants:\n  acme: {daily_tokens: 5\nusers: secret-ish\n")
    text = str(exc.value)
    assert text.startswith("not valid YAML: line 3, column") and "secret-ish" not in text
    with pytest.raises(PolicyError, match="must be a mapping"):
        parse_policy("- 1\n- 2\n")


def test_the_file_is_re_read_when_it_changes_and_a_broken_edit_keeps_the_last_good(tmp_path: Path) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text("default_user_daily_tokens: 100\n")
    now = [0.0]
    budgets = Budgets(path, clock=lambda: now[0])
    assert budgets.policy().user_limit("@a:x") == 100

    path.write_text("default_user_daily_tokens: 2000\n")
    assert budgets.policy().user_limit("@a:x") == 100  # looked at most once a second
    now[0] += 1.0
    assert budgets.policy().user_limit("@a:x") == 2000

    with capture_logs() as logs:
        path.write_text('users:\n  "@alice:example.org": {daily_tokens: -5}\n')
        now[0] += 1.0
        assert budgets.policy().user_limit("@a:x") == 2000  # the last good policy
        now[0] += 1.0
        budgets.policy()  # the same problem is logged once
    [warning] = [e for e in logs if e["event"] == "budgets_file_invalid"]
    assert warning["log_level"] == "warning" and warning["kept"] == "the last good policy"
    assert warning["problem"].startswith('users."@alice:example.org".daily_tokens: Input should be greater')

    path.write_text("default_user_daily_tokens: 7\n")
    os.utime(path, ns=(1, 1))  # even with an older mtime: the size differs
    now[0] += 1.0
    assert budgets.policy().user_limit("@a:x") == 7


def test_no_file_configured_or_a_missing_one_means_no_limits(tmp_path: Path) -> None:
    assert Budgets(None).policy() == BudgetPolicy()
    with capture_logs() as logs:
        missing = Budgets(tmp_path / "nope.yaml")
    assert missing.policy() == BudgetPolicy()
    assert [e["kept"] for e in logs if e["event"] == "budgets_file_invalid"] == ["no limits"]


# ---- the notice, the messages, the estimate ----------------------------------------------------


def test_the_notice_is_due_from_80_percent_of_a_real_budget() -> None:
    assert not notice_due(799, 1000) and notice_due(800, 1000) and notice_due(5000, 1000)
    assert not notice_due(10, None) and not notice_due(10, 0)
    assert notice_line(850, 1000) == "ℹ️ You have used 85% of today's token budget."
    assert "all of today's token budget" in notice_line(1000, 1000)


def test_refusal_messages_name_whose_budget_and_when_it_resets() -> None:
    assert refusal_message("user", 100000, mid_turn=False) == (
        "You have used today's token budget (100,000 tokens). It resets at midnight UTC."
    )
    assert refusal_message("tenant", 5, mid_turn=False).startswith("Your organisation has used")
    assert refusal_message("user", 5, mid_turn=True).startswith("I had to stop before finishing: you have")


def test_the_estimate_is_the_prompt_plus_the_output_allowance() -> None:
    short = [SystemMessage(content="be brief"), HumanMessage(content="hi")]
    long = [SystemMessage(content="be brief"), HumanMessage(content="word " * 400)]
    assert estimate(short) == approx_tokens(short) + OUTPUT_ALLOWANCE
    assert estimate(long) - estimate(short) >= 400


def big_schema(properties: int) -> dict[str, object]:
    """An MCP tool's schema: a form of `properties` described fields."""
    fields = {
        f"field_{i}": {"type": "string", "description": "a field of the form " * 4} for i in range(properties)
    }
    return {
        "type": "function",
        "function": {
            "name": "fill_form",
            "description": "Fill the form.",
            "parameters": {"properties": fields},
        },
    }


def test_the_offered_tools_schemas_are_part_of_the_prompt_and_of_the_estimate() -> None:
    prompt = [SystemMessage(content="be brief"), HumanMessage(content="hi")]
    schema = big_schema(800)
    assert schema_tokens([schema]) >= 25_000  # what an MCP server's tools can weigh
    assert schema_tokens([schema]) == len(json.dumps(schema, separators=(",", ":"))) // 4
    assert prompt_tokens(prompt, [schema]) == approx_tokens(prompt) + schema_tokens([schema])
    assert estimate(prompt, [schema]) == prompt_tokens(prompt, [schema]) + OUTPUT_ALLOWANCE
    assert prompt_tokens(prompt) == approx_tokens(prompt)  # no tools offered


# ---- what a call is charged --------------------------------------------------------------------


def test_each_answered_attempt_is_charged_its_usage_else_the_prompt_and_what_it_streamed() -> None:
    sent = 1200
    assert charge([], sent) == Charge(0, 0, 0)  # nothing reached the provider
    assert charge([Attempt(usage=(900, 40))], sent) == Charge(900, 40, 1)  # the provider's word
    stopped = Attempt(streamed_chars=401)  # `!stop` after 401 characters: no usage block came
    assert charge([stopped], sent) == Charge(1200, 101, 1)
    refused_then_answered = [Attempt(status=500), Attempt(status=429), Attempt(usage=(950, 12))]
    assert charge(refused_then_answered, sent) == Charge(1200 + 1200 + 950, 12, 3)  # every retry counts
    assert charge([Attempt(status=200)], sent) == Charge(1200, 0, 1)  # broke before its first delta
    assert streamed_tokens(0) == 0 and streamed_tokens(1) == 1 and streamed_tokens(8) == 2


def test_every_kind_of_delta_counts_and_the_usage_block_is_read() -> None:
    text = {"choices": [{"index": 0, "delta": {"content": "Hello"}}]}
    reasoning = {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm, let me see"}}]}
    call = {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"name": "add", "arguments": '{"a": 1'}}]},
            }
        ]
    }
    assert [delta_chars(c) for c in (text, reasoning, call)] == [5, 15, 3 + 7]
    odd = {"choices": [None, {"delta": None}, {"delta": {"content": None, "tool_calls": [None]}}]}
    assert delta_chars(odd) == 0 and delta_chars({}) == 0
    usage = {"choices": [], "usage": {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38}}
    assert reported_usage(usage) == (31, 7) and reported_usage(text) is None


async def test_the_meter_follows_attempts_chunks_and_the_final_answer() -> None:
    retries: list[int] = []

    async def before_retry() -> None:
        retries.append(1)

    meter = Meter(before_retry)
    await meter.sending()
    meter.answered(500)
    await meter.sending()  # the SDK's retry: held for first
    meter.answered(200)
    meter.streamed({"choices": [{"delta": {"content": "abcd"}}]})
    meter.streamed({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}})
    assert retries == [1]
    assert meter.attempts == [Attempt(500), Attempt(200, 4, (10, 2))]

    moved = Meter(before_retry)  # a redirect is followed, not retried: one attempt, no hold
    await moved.sending()
    moved.answered(307)
    await moved.sending()
    moved.answered(200)
    assert retries == [1] and moved.attempts == [Attempt(200)]

    offline = Meter()  # a model without HTTP hooks (the offline model): its answer is the attempt
    offline.finished(
        AIMessage(content="hi", usage_metadata={"input_tokens": 5, "output_tokens": 1, "total_tokens": 6})
    )
    assert offline.attempts == [Attempt(usage=(5, 1))]
    silent = Meter()  # a provider that reports no usage: the answer's text is estimated
    silent.finished(AIMessage(content="x" * 40))
    assert charge(silent.attempts, 100) == Charge(100, 10, 1)


# ---- the counters' fields ----------------------------------------------------------------------


def test_a_users_fields_are_found_exactly() -> None:
    alice = "@alice:localhost"
    fields = [
        user_field(alice, "in"),
        row_field("acme", alice, "calls"),
        row_field("a|b", alice, "out"),  # a tenant with '|' still parses (from the right)
        user_field("@alice:localhost:8448", "in"),
        user_field("@al:localhost", "in"),
        row_field("acme", "@alice:localhost.evil", "in"),
        tenant_field("acme", "in"),  # the tenant's total: nobody's
        "junk",
    ]
    assert their_fields(fields, alice) == fields[:3]


def test_a_day_hash_reads_as_rows_with_the_tenant_totals() -> None:
    day = date(2026, 11, 22)
    raw = {
        b"u|@a:x|in": b"10",
        b"r|acme|@a:x|in": b"10",
        b"r|acme|@a:x|out": b"5",
        b"r|acme|@a:x|calls": b"2",
        b"r|acme|@b:x|in": b"1",
        b"r|beta|@a:x|in": b"3",
        b"t|acme|in": b"111",  # a forgotten user's tokens still count here
        b"t|acme|calls": b"9",
    }
    rows = day_rows(day, raw)
    assert [(r.tenant, r.user_id, r.total_tokens, r.llm_calls) for r in rows] == [
        ("acme", "", 111, 9),
        ("acme", "@a:x", 15, 2),
        ("acme", "@b:x", 1, 0),
        ("beta", "@a:x", 3, 0),
    ]
    assert [(r.tenant, r.user_id) for r in day_rows(day, raw, user="@a:x")] == [
        ("acme", "@a:x"),
        ("beta", "@a:x"),
    ]
    assert [r.user_id for r in day_rows(day, raw, tenant="beta")] == ["@a:x"]
    assert table_header().split() == ["DAY", "(UTC)", "TENANT", "USER", "INPUT", "OUTPUT", "TOTAL", "CALLS"]
    assert table_row(rows[0]).split() == ["2026-11-22", "acme", "*", "111", "0", "111", "9"]


def test_since_is_a_date_or_a_number_of_days_today_included() -> None:
    today = date(2026, 11, 22)
    assert parse_since("1d", today) == today
    assert parse_since("7d", today) == date(2026, 11, 16)
    assert parse_since("2026-11-01", today) == date(2026, 11, 1)
    assert len(days_from(date(2026, 11, 16), today)) == 7
    for bad in ("0d", "yesterday", "2026-12-01", "401d"):
        with pytest.raises(ValueError):
            parse_since(bad, today)


async def test_the_offline_model_reports_the_same_non_zero_usage_every_time() -> None:
    """The demo's budgets count real numbers: the offline model's usage, as streamed."""

    async def usage() -> tuple[int, int]:
        chunks = [c async for c in OfflineChatModel().astream([HumanMessage(content="what can you do?")])]
        found = [c.usage_metadata for c in chunks if c.usage_metadata]
        assert len(found) == 1
        return found[0]["input_tokens"], found[0]["output_tokens"]

    first = await usage()
    assert min(first) > 0 and first == await usage()


def test_forget_finds_exactly_the_users_notice_keys() -> None:
    alice = "@alice:localhost"
    keys = [
        redis_keys.usage_notified("2026-11-22", alice).encode(),
        redis_keys.usage_notified("2026-11-22", "@alice:localhost:8448").encode(),
        f"usage:notified:{alice}:{alice}".encode(),  # no day
        b"usage:notified:" + alice.encode(),
    ]
    assert their_notice_keys(keys, alice) == keys[:1]
