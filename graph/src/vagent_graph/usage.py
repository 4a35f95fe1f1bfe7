"""Token usage per user and tenant per UTC day, and the reservation that keeps concurrent
turns inside a budget (docs/budgets.md). Pure helpers first, then the thin Redis I/O.

What is counted: each LLM call's tokens as the provider reported them (`usage_metadata`:
ChatOpenAI streams with `stream_options.include_usage`; the offline model reports
deterministic counts). A call that reports none counts as a call of 0 tokens; a call that
is cancelled midway (the client went away) reports nothing and is not counted.

Where: one hash per UTC day, `usage:{YYYY-MM-DD}` (redis_keys.usage_day), fields
`u|{user}|in|out` (the user's day), `t|{tenant}|in|out|calls` (the tenant's day) and
`r|{tenant}|{user}|in|out|calls` (the rows `vagent usage` shows). One MULTI adds a call's
tokens to all of them, so a crash never leaves them half-counted, and every replica adds
to the same hash. A day hash expires DAY_TTL_SECONDS (400 days: a year of history plus a
margin for "the same month last year") after its last write.

Why a reservation: two replicas checking "used < limit" at the same time would both start
a call, and N concurrent turns would overshoot by N calls. Before each LLM call a Lua
script (atomic on the Redis server) drops lapsed holds, refuses if used + held >= limit,
else adds a hold of the call's ESTIMATE (the prompt's approx_tokens, as window_for_llm
counts them, plus OUTPUT_ALLOWANCE for the answer) to `usage:held:{scope}`, scored by when
it lapses (the run's timeout: a crashed replica's holds free themselves). Recording the
real usage removes the hold in the same MULTI. So the day's total passes the limit by at
most about one call's usage (the last call admitted below the limit), as long as a call's
output stays within the allowance; a turn crossing the limit mid-way stops at its next call.

Fail OPEN: counting is not a security boundary. If the budget check or the counting fails
(Redis hiccup, a script error) it is logged and the call goes ahead; if Redis is really
down, the run fails anyway (its checkpointer is there).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Literal

import structlog
from langchain_core.messages import BaseMessage
from redis.asyncio import Redis

from vagent_graph import metrics
from vagent_graph.budgets import Budgets
from vagent_graph.history import approx_tokens
from vagent_shared import redis_keys
from vagent_shared.budgets import NOTICE_SHARE, UsageRow, usage_day

log = structlog.get_logger(__name__)

#: What an answer is assumed to cost before it is written (the estimate's output part).
OUTPUT_ALLOWANCE = 500
#: A day hash lives this long after its last write (docs/budgets.md).
DAY_TTL_SECONDS = 400 * 86400
#: The "80% used" marker outlives its day (a turn just after midnight UTC must not find
#: yesterday's marker gone and today's not yet relevant: it is per day anyway).
NOTIFIED_TTL_SECONDS = 2 * 86400
#: `vagent usage --since` reaches back at most this far (the day hashes' lifetime).
MAX_DAYS = 400

Scope = Literal["user", "tenant"]


# ---- pure --------------------------------------------------------------------------------------


def estimate(prompt: Sequence[BaseMessage]) -> int:
    """What a call is held for: the prompt's tokens (approx_tokens, as the history window
    counts them) plus OUTPUT_ALLOWANCE for its answer."""
    return approx_tokens(prompt) + OUTPUT_ALLOWANCE


def user_field(user: str, what: str) -> str:
    return f"u|{user}|{what}"


def tenant_field(tenant: str, what: str) -> str:
    return f"t|{tenant}|{what}"


def row_field(tenant: str, user: str, what: str) -> str:
    return f"r|{tenant}|{user}|{what}"


@dataclass(frozen=True)
class Field:
    """A day hash's field, read back: `kind` u (user), t (tenant) or r (row)."""

    kind: str
    tenant: str
    user: str
    what: str


def parse_field(name: str) -> Field | None:
    """A field's parts, read from the RIGHT (a Matrix id holds no '|'; a tenant might)."""
    kind, _, rest = name.partition("|")
    if kind == "u":
        user, _, what = rest.rpartition("|")
        return Field("u", "", user, what) if user else None
    if kind == "t":
        tenant, _, what = rest.rpartition("|")
        return Field("t", tenant, "", what) if tenant else None
    if kind == "r":
        parts = rest.rsplit("|", 2)
        return Field("r", parts[0], parts[1], parts[2]) if len(parts) == 3 and parts[0] else None
    return None


def their_fields(names: Iterable[str], user: str) -> list[str]:
    """The fields of a day hash that are `user`'s (their day, their rows); tenant totals stay."""
    out = []
    for name in names:
        f = parse_field(name)
        if f is not None and f.kind in ("u", "r") and f.user == user:
            out.append(name)
    return out


def _text(v: bytes | str) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v


def day_rows(
    day: date, fields: Mapping[Any, Any], tenant: str | None = None, user: str | None = None
) -> list[UsageRow]:
    """A day hash as rows: one per (tenant, user), and, unless one user is asked for, one per
    tenant with user_id "" (its whole day, forgotten users included). Sorted by tenant, user."""
    rows: dict[tuple[str, str], UsageRow] = {}
    for raw_name, raw_value in fields.items():
        f = parse_field(_text(raw_name))
        if f is None or f.kind == "u" or f.what not in ("in", "out", "calls"):
            continue
        if (tenant is not None and f.tenant != tenant) or (user is not None and f.user != user):
            continue
        row = rows.setdefault((f.tenant, f.user), UsageRow(day=day, tenant=f.tenant, user_id=f.user))
        n = int(_text(raw_value))
        if f.what == "in":
            row.input_tokens += n
        elif f.what == "out":
            row.output_tokens += n
        else:
            row.llm_calls += n
    return [rows[k] for k in sorted(rows)]


def parse_since(text: str, today: date) -> date:
    """`YYYY-MM-DD`, or `Nd`: the last N days, today included (`1d` is today)."""
    text = text.strip()
    if text.endswith("d") and text[:-1].isdigit():
        n = int(text[:-1])
        if not 1 <= n <= MAX_DAYS:
            raise ValueError(f"{text!r}: between 1d and {MAX_DAYS}d")
        return today - timedelta(days=n - 1)
    try:
        found = date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a date (YYYY-MM-DD) nor a number of days (7d)") from None
    if found > today:
        raise ValueError(f"{text!r} is in the future")
    return found


def days_from(since: date, today: date) -> list[date]:
    """The UTC days from `since` to `today`, oldest first (at most MAX_DAYS)."""
    since = max(since, today - timedelta(days=MAX_DAYS - 1))
    return [since + timedelta(days=i) for i in range((today - since).days + 1)]


def notice_due(used: int, limit: int | None) -> bool:
    """The user has used NOTICE_SHARE of a (non-zero) daily budget."""
    return limit is not None and limit > 0 and used >= NOTICE_SHARE * limit


def notice_line(used: int, limit: int) -> str:
    """The one line the final answer gets, once a day."""
    if used >= limit:
        return "ℹ️ You have used all of today's token budget; it resets at midnight UTC."
    return f"ℹ️ You have used {used * 100 // limit}% of today's token budget."


def refusal_message(scope: Scope, limit: int, mid_turn: bool) -> str:
    """What the user reads instead of an answer (`mid_turn`: the turn had done some work)."""
    whose = "You have" if scope == "user" else "Your organisation has"
    text = f"{whose} used today's token budget ({limit:,} tokens). It resets at midnight UTC."
    return f"I had to stop before finishing: {text[0].lower()}{text[1:]}" if mid_turn else text


# ---- Redis I/O ---------------------------------------------------------------------------------

#: KEYS[1] the day hash, KEYS[1+i] scope i's holds; ARGV[1] the hold's member (`{id}:{tokens}`),
#: ARGV[2] its lifetime (ms), ARGV[1+2i] scope i's field prefix, ARGV[2+2i] its limit.
#: Returns {0, 0} when held, {i, used} when scope i is spent. Time is the server's (replicas'
#: clocks may differ).
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS - 1
for i = 1, n do
  local held_key = KEYS[i + 1]
  local prefix = ARGV[2 * i + 1]
  redis.call('ZREMRANGEBYSCORE', held_key, '-inf', now)
  local used = tonumber(redis.call('HGET', KEYS[1], prefix .. 'in') or '0')
    + tonumber(redis.call('HGET', KEYS[1], prefix .. 'out') or '0')
  local held = 0
  for _, m in ipairs(redis.call('ZRANGE', held_key, 0, -1)) do
    held = held + tonumber(string.match(m, ':(%d+)$') or '0')
  end
  if used + held >= tonumber(ARGV[2 * i + 2]) then
    return {i, used}
  end
end
for i = 1, n do
  redis.call('ZADD', KEYS[i + 1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('PEXPIRE', KEYS[i + 1], tonumber(ARGV[2]) + 60000)
end
return {0, 0}
"""


@dataclass
class Hold:
    """One LLM call's place in the budgets: who pays, and its reservation (if any)."""

    user: str
    tenant: str
    member: str | None = None
    held_keys: tuple[str, ...] = ()
    #: The user's tokens of the day once this call is recorded (None: not recorded).
    user_used: int | None = None


@dataclass(frozen=True)
class Refusal:
    """A spent budget: whose, its limit, what was used."""

    scope: Scope
    limit: int
    used: int


class Usage:
    """Counting and checking, on the service's Redis (`hold_seconds`: a hold's lapse, the
    run's timeout: no LLM call outlives its run)."""

    def __init__(self, redis: Redis, budgets: Budgets, hold_seconds: float) -> None:
        self.redis = redis
        self.budgets = budgets
        self.hold_ms = int(hold_seconds * 1000)
        self._reserve = redis.register_script(_RESERVE)

    async def reserve(self, user: str, tenant: str, tokens: int) -> Hold | Refusal:
        """Hold `tokens` against the user's and the tenant's limits, or the spent one."""
        policy = self.budgets.policy()
        limited: list[tuple[Scope, str, str, int]] = []
        user_limit, tenant_limit = policy.user_limit(user), policy.tenant_limit(tenant)
        if user_limit is not None:
            limited.append(("user", redis_keys.usage_held(f"u|{user}"), user_field(user, ""), user_limit))
        if tenant_limit is not None:
            limited.append(
                ("tenant", redis_keys.usage_held(f"t|{tenant}"), tenant_field(tenant, ""), tenant_limit)
            )
        if not limited:
            return Hold(user, tenant)
        member = f"{uuid.uuid4().hex}:{max(0, tokens)}"
        args: list[Any] = [member, self.hold_ms]
        for _, _, prefix, limit in limited:
            args += [prefix, limit]
        try:
            found = await self._reserve(
                keys=[redis_keys.usage_day(usage_day().isoformat()), *(k for _, k, _, _ in limited)],
                args=args,
            )
        except Exception as exc:  # fail open: counting is not a security boundary
            log.warning("budget_check_failed", error_type=type(exc).__name__)
            return Hold(user, tenant)
        spent, used = int(found[0]), int(found[1])
        if spent:
            scope, _, _, limit = limited[spent - 1]
            return Refusal(scope, limit, used)
        return Hold(user, tenant, member, tuple(k for _, k, _, _ in limited))

    async def record(self, hold: Hold, model: str, usage: Mapping[str, Any] | None) -> None:
        """Add one call's reported tokens to the day (and free its hold), in one MULTI."""
        inp = int((usage or {}).get("input_tokens") or 0)
        out = int((usage or {}).get("output_tokens") or 0)
        day = redis_keys.usage_day(usage_day().isoformat())
        u, t = hold.user, hold.tenant
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hincrby(day, user_field(u, "in"), inp)
            pipe.hincrby(day, user_field(u, "out"), out)
            pipe.hincrby(day, tenant_field(t, "in"), inp)
            pipe.hincrby(day, tenant_field(t, "out"), out)
            pipe.hincrby(day, tenant_field(t, "calls"), 1)
            pipe.hincrby(day, row_field(t, u, "in"), inp)
            pipe.hincrby(day, row_field(t, u, "out"), out)
            pipe.hincrby(day, row_field(t, u, "calls"), 1)
            pipe.expire(day, DAY_TTL_SECONDS)
            for key in hold.held_keys:
                pipe.zrem(key, hold.member or "")
            done = await pipe.execute()
            hold.user_used = int(done[0]) + int(done[1])
        except Exception as exc:  # fail open (see the module's docstring)
            log.warning("usage_record_failed", error_type=type(exc).__name__)
        metrics.TENANT_TOKENS.labels(t, model, "input").inc(inp)
        metrics.TENANT_TOKENS.labels(t, model, "output").inc(out)

    async def release(self, hold: Hold) -> None:
        """Free a hold whose call failed (nothing reported, nothing counted)."""
        if hold.member is None:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for key in hold.held_keys:
                pipe.zrem(key, hold.member)
            await pipe.execute()
        except Exception as exc:  # it lapses by itself
            log.debug("usage_release_failed", error_type=type(exc).__name__)

    async def notice(self, hold: Hold) -> str | None:
        """The "80% used" line, the first time today the user's recorded total reaches it."""
        limit = self.budgets.policy().user_limit(hold.user)
        if hold.user_used is None or limit is None or not notice_due(hold.user_used, limit):
            return None
        try:
            key = redis_keys.usage_notified(usage_day().isoformat(), hold.user)
            first = await self.redis.set(key, "1", nx=True, ex=NOTIFIED_TTL_SECONDS)
        except Exception as exc:
            log.warning("usage_notice_failed", error_type=type(exc).__name__)
            return None
        return notice_line(hold.user_used, limit) if first else None


async def read_rows(
    redis: Redis, days: Sequence[date], tenant: str | None = None, user: str | None = None
) -> list[UsageRow]:
    """The rows of `days` (oldest first), filtered (the admin API's read)."""
    pipe = redis.pipeline(transaction=False)
    for day in days:
        pipe.hgetall(redis_keys.usage_day(day.isoformat()))
    found = await pipe.execute()
    return [
        row for day, fields in zip(days, found, strict=True) for row in day_rows(day, fields, tenant, user)
    ]
