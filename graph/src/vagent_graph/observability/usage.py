"""Token usage per user and tenant per UTC day, and the reservation that keeps concurrent
turns inside a budget (docs/budgets.md). Pure helpers first, then the thin Redis I/O.

What is charged: every ATTEMPT of an LLM call that the provider answered (the SDK's retries
are attempts too), however the call ends (answered, failed midway, stopped by `!stop` or a
client gone, timed out): the tokens the provider reported for it (the stream's usage chunk,
or the model's `usage_metadata`), else an estimate: the prompt sent (`prompt_tokens`: the
messages as the history window counts them plus the offered tools' schemas) and the deltas
streamed back so far (text, reasoning, tool names and arguments: ~4 characters a token).
`Meter` follows a call's attempts as they happen, fed through the context variable METER by
the HTTP client's hooks (`on_request`, `on_response`) and the streamed chunks (`on_chunk`,
lean_openai.py); `Usage.metered` charges what it saw, in a `finally` that a cancellation
cannot skip.

Where: one hash per UTC day, `usage:{YYYY-MM-DD}` (redis_keys.usage_day), fields
`u|{user}|in|out` (the user's day), `t|{tenant}|in|out|calls` (the tenant's day) and
`r|{tenant}|{user}|in|out|calls` (the rows `vagent usage` shows). One MULTI adds a call's
tokens to all of them, so a crash never leaves them half-counted, and every replica adds
to the same hash. A day hash expires DAY_TTL_SECONDS (400 days: a year of history plus a
margin for "the same month last year") after its last write.

Why a reservation: two replicas checking "used < limit" at the same time would both start
a call, and N concurrent turns would overshoot by N calls. Before each LLM call, and before
each retry of one, a Lua script (atomic on the Redis server) drops lapsed holds, refuses if
used + held >= limit, else adds a hold of the attempt's ESTIMATE (`prompt_tokens` plus
OUTPUT_ALLOWANCE for the answer) to `usage:held:{scope}`, scored by when it lapses (the
run's timeout: a crashed replica's holds free themselves). Charging a call removes its
holds in the same MULTI. Each attempt is charged at most its hold as long as its answer
stays within the allowance and the provider counts no more prompt tokens than the
estimate, so the day's total passes the limit by less than one attempt's estimate (the last
one admitted below the limit); a turn crossing the limit mid-way stops at its next call.

Fail OPEN: counting is not a security boundary. If the budget check or the counting fails
(Redis hiccup, a script error) it is logged and the call goes ahead; if Redis is really
down, the run fails anyway (its checkpointer is there).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Literal

import structlog
from langchain_core.messages import AIMessage, BaseMessage
from redis.asyncio import Redis

from vagent_graph.observability import metrics
from vagent_graph.observability.budgets import Budgets
from vagent_graph.observability.tokens import CHARS_PER_TOKEN, approx_tokens
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


def schema_tokens(schemas: Iterable[Mapping[str, Any]]) -> int:
    """The offered tools' schemas: sent with every call (an MCP server's can be tens of
    thousands of tokens), ~4 characters a token of their JSON."""
    chars = sum(len(json.dumps(s, separators=(",", ":"), ensure_ascii=False)) for s in schemas)
    return chars // CHARS_PER_TOKEN


def prompt_tokens(prompt: Sequence[BaseMessage], schemas: Iterable[Mapping[str, Any]] = ()) -> int:
    """What sending the prompt costs: its messages (approx_tokens, as the history window
    counts them) and the offered tools' schemas."""
    return approx_tokens(prompt) + schema_tokens(schemas)


def estimate(prompt: Sequence[BaseMessage], schemas: Iterable[Mapping[str, Any]] = ()) -> int:
    """What an attempt is held for: the prompt sent (`prompt_tokens`) plus OUTPUT_ALLOWANCE
    for its answer."""
    return prompt_tokens(prompt, schemas) + OUTPUT_ALLOWANCE


def streamed_tokens(chars: int) -> int:
    """Streamed characters as tokens, rounded up (a started answer is never free)."""
    return -(-max(0, chars) // CHARS_PER_TOKEN)


def delta_chars(chunk: Mapping[str, Any]) -> int:
    """The characters one streamed chunk (the provider's JSON) adds to the answer: text,
    reasoning (billed as output though never shown), tool names and arguments."""
    n = 0
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            n += len(value) if isinstance(value, str) else 0
        for call in delta.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                for key in ("name", "arguments"):
                    value = fn.get(key)
                    n += len(value) if isinstance(value, str) else 0
    return n


def reported_usage(chunk: Mapping[str, Any]) -> tuple[int, int] | None:
    """(input, output) tokens of a chunk's usage block (`stream_options.include_usage`)."""
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def answer_chars(ai: AIMessage) -> int:
    """An answer's characters (text and tool calls), for a model that reported no usage."""
    text = ai.content if isinstance(ai.content, str) else json.dumps(ai.content)
    calls = sum(len(c["name"]) + len(json.dumps(c.get("args", {}))) for c in ai.tool_calls)
    return len(text) + calls


@dataclass
class Attempt:
    """One request of a call that the provider answered: what it streamed back so far and
    the usage it reported (None: none arrived: stopped, broken off, refused, or a provider
    that reports none)."""

    status: int = 200
    streamed_chars: int = 0
    usage: tuple[int, int] | None = None


@dataclass(frozen=True)
class Charge:
    """What a call costs the budgets: tokens in and out, and its attempts (`calls`)."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


def charge(attempts: Sequence[Attempt], sent_tokens: int) -> Charge:
    """Every attempt the provider answered is charged (a retry is one more): the usage it
    reported, else the prompt sent (`sent_tokens`, as `prompt_tokens` estimates it) plus
    the deltas it streamed. An attempt the provider never answered (no connection) is not."""
    inp = out = 0
    for a in attempts:
        if a.usage is not None:
            inp, out = inp + a.usage[0], out + a.usage[1]
        else:
            inp, out = inp + sent_tokens, out + streamed_tokens(a.streamed_chars)
    return Charge(inp, out, len(attempts))


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


# ---- following a call's attempts ---------------------------------------------------------------


class BudgetSpent(Exception):
    """A retry the budget cannot hold: it is not sent (raised from the HTTP client's hook,
    so the SDK stops retrying), and the turn ends as over budget."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(f"{refusal.scope} budget spent")
        self.refusal = refusal


@dataclass
class Meter:
    """One LLM call's attempts as they happen. `before_retry` holds budget for a retry (or
    raises BudgetSpent) before it is sent; the first request's hold was taken before the call."""

    before_retry: Callable[[], Awaitable[None]] | None = None
    attempts: list[Attempt] = field(default_factory=list)
    requests: int = 0
    #: The last answer was a redirect: the next request is the same attempt, elsewhere.
    redirected: bool = False

    async def sending(self) -> None:
        if self.redirected:
            self.redirected = False
            return
        self.requests += 1
        if self.requests > 1 and self.before_retry is not None:
            await self.before_retry()

    def answered(self, status: int) -> None:
        if 300 <= status < 400:
            self.redirected = True
            return
        self.attempts.append(Attempt(status))

    def streamed(self, chunk: Mapping[str, Any]) -> None:
        if not self.attempts:  # a client without the hooks: the stream is the attempt
            self.attempts.append(Attempt())
        last = self.attempts[-1]
        last.streamed_chars += delta_chars(chunk)
        found = reported_usage(chunk)
        if found is not None:
            last.usage = found

    def finished(self, ai: AIMessage) -> None:
        """The call answered: the model's own usage (the offline model's too) wins, and an
        answer nothing was metered for is estimated from its text."""
        if not self.attempts:
            self.attempts.append(Attempt())
        last = self.attempts[-1]
        if ai.usage_metadata:
            last.usage = (int(ai.usage_metadata["input_tokens"]), int(ai.usage_metadata["output_tokens"]))
        elif last.usage is None and last.streamed_chars == 0:
            last.streamed_chars = answer_chars(ai)


#: The call being metered in this task (Usage.metered sets it; the hooks below read it).
METER: ContextVar[Meter | None] = ContextVar("vagent_llm_meter", default=None)
_CHAT_PATH = "/chat/completions"


async def on_request(request: Any) -> None:
    """httpx request hook: a chat completion is about to be sent (the SDK's retries too)."""
    meter = METER.get()
    if meter is not None and str(request.url.path).endswith(_CHAT_PATH):
        await meter.sending()


async def on_response(response: Any) -> None:
    """httpx response hook: the provider answered a chat completion (any status)."""
    meter = METER.get()
    if meter is not None and str(response.request.url.path).endswith(_CHAT_PATH):
        meter.answered(int(response.status_code))


def on_chunk(chunk: Mapping[str, Any]) -> None:
    """A streamed chunk of the call being metered (lean_openai's parsed JSON)."""
    meter = METER.get()
    if meter is not None:
        meter.streamed(chunk)


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
    """One LLM call's place in the budgets: who pays, and its reservations (one per attempt
    held for; none when no limit applies)."""

    user: str
    tenant: str
    members: list[str] = field(default_factory=list)
    held_keys: tuple[str, ...] = ()
    #: The user's tokens of the day once this call is recorded (None: not recorded).
    user_used: int | None = None


@dataclass(frozen=True)
class Refusal:
    """A spent budget: whose, its limit, what was used."""

    scope: Scope
    limit: int
    used: int


#: Charges being written (Usage.metered), kept until they are.
_RECORDING: set[asyncio.Future[None]] = set()


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
        found = await self._hold(user, tenant, tokens)
        if isinstance(found, Refusal):
            return found
        member, keys = found
        return Hold(user, tenant, [member] if member else [], keys)

    async def hold_more(self, hold: Hold, tokens: int) -> Refusal | None:
        """Hold `tokens` more for the same call (its retry), or the spent budget."""
        found = await self._hold(hold.user, hold.tenant, tokens)
        if isinstance(found, Refusal):
            return found
        member, keys = found
        if member:
            hold.members.append(member)
            hold.held_keys = tuple(dict.fromkeys((*hold.held_keys, *keys)))
        return None

    async def _hold(self, user: str, tenant: str, tokens: int) -> tuple[str, tuple[str, ...]] | Refusal:
        """The new hold's member and keys ("" and none: no limit applies, or the check failed)."""
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
            return "", ()
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
            return "", ()
        spent, used = int(found[0]), int(found[1])
        if spent:
            scope, _, _, limit = limited[spent - 1]
            return Refusal(scope, limit, used)
        return member, tuple(k for _, k, _, _ in limited)

    async def metered(
        self, hold: Hold, model: str, sent_tokens: int, call: Callable[[], Awaitable[AIMessage]]
    ) -> AIMessage:
        """Make one LLM call with its attempts metered (METER), and charge it however it
        ends: answered, failed, or cancelled by a stop or a client gone. A retry is held for
        before it is sent (BudgetSpent when the budget cannot hold it). `sent_tokens`: the
        prompt's estimate (`prompt_tokens`)."""

        async def before_retry() -> None:
            found = await self.hold_more(hold, sent_tokens + OUTPUT_ALLOWANCE)
            if found is not None:
                raise BudgetSpent(found)

        meter = Meter(before_retry)
        token = METER.set(meter)
        try:
            ai = await call()
            meter.finished(ai)
        finally:
            METER.reset(token)
            # Its own task, shielded (and kept: the loop holds tasks weakly): a second
            # cancellation while it is written cannot lose the charge.
            recording = asyncio.ensure_future(self.record(hold, model, charge(meter.attempts, sent_tokens)))
            _RECORDING.add(recording)
            recording.add_done_callback(_RECORDING.discard)
            await asyncio.shield(recording)
        return ai

    async def record(self, hold: Hold, model: str, spent: Charge) -> None:
        """Add one call's charge to the day (and free its holds), in one MULTI; a call no
        attempt of which reached the provider only frees its holds."""
        if spent.calls == 0:
            await self.release(hold)
            return
        inp, out = spent.input_tokens, spent.output_tokens
        day = redis_keys.usage_day(usage_day().isoformat())
        u, t = hold.user, hold.tenant
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hincrby(day, user_field(u, "in"), inp)
            pipe.hincrby(day, user_field(u, "out"), out)
            pipe.hincrby(day, tenant_field(t, "in"), inp)
            pipe.hincrby(day, tenant_field(t, "out"), out)
            pipe.hincrby(day, tenant_field(t, "calls"), spent.calls)
            pipe.hincrby(day, row_field(t, u, "in"), inp)
            pipe.hincrby(day, row_field(t, u, "out"), out)
            pipe.hincrby(day, row_field(t, u, "calls"), spent.calls)
            pipe.expire(day, DAY_TTL_SECONDS)
            if hold.members:
                for key in hold.held_keys:
                    pipe.zrem(key, *hold.members)
            done = await pipe.execute()
            hold.user_used = int(done[0]) + int(done[1])
        except Exception as exc:  # fail open (see the module's docstring)
            log.warning("usage_record_failed", error_type=type(exc).__name__)
        metrics.TENANT_TOKENS.labels(t, model, "input").inc(inp)
        metrics.TENANT_TOKENS.labels(t, model, "output").inc(out)

    async def release(self, hold: Hold) -> None:
        """Free a call's holds with nothing charged."""
        if not hold.members:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for key in hold.held_keys:
                pipe.zrem(key, *hold.members)
            await pipe.execute()
        except Exception as exc:  # they lapse by themselves
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
