"""`vagent trace`: how a turn came about, from its stored TurnTrace (docs/traces.md).

    vagent trace show EVENT_ID|TURN_ID [--json]
    vagent trace list [--user @alice:example.org] [--since 1d|2026-11-22] [--outcome denied]
                      [--limit 50] [--json]

`show` takes the turn id (the `turn` event of the graph's stream, `trace list`) or the
Matrix event id of the bot's answer or question (quote it: `'$…'`), and prints the turn: the
question it answered (the start of the user's message, secrets masked), outcome, timings,
every LLM call with its tokens, every tool call with its access decision, confirmation,
credential use and outcome, and the documents, entities and files it used, each with what it
was derived from (its scope: who may be told about it). `list` prints the
newest matching turns first, one line each, ending with the question the turn answered (its
first 40 characters). --json prints the TurnTrace (show) or a JSON
array of them (list), exactly what `/admin/v1/traces` answers.

Arguments are shown as stored: scrubbed as the audit trail scrubs them. Times are UTC.
Reads REDIS_URL (and TRACE_TTL_SECONDS). Exit codes: 0 done, 1 no such trace or Redis refused
a command, 2 bad usage or Redis unreachable.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, TypeVar, get_args

import typer
from redis.asyncio import Redis

from vagent_graph.cli.common import load_settings, on_redis
from vagent_graph.cli.output import cell, complain, header, printable, say
from vagent_graph.observability.audit_reader import parse_when
from vagent_graph.observability.trace_store import MAX_LIMIT, TraceFilter, TraceStore
from vagent_graph.state.erasure import valid_user_id
from vagent_shared.readers import ResultScope
from vagent_shared.settings import CommonSettings
from vagent_shared.traces import ToolCallTrace, TurnOutcome, TurnTrace

PROG = "vagent trace"
T = TypeVar("T")

app = typer.Typer(
    help="Read the stored traces of turns: why the agent answered what it answered.",
    short_help="How a turn came about: show, list.",
    no_args_is_help=True,
)


# ---- the text (pure) ---------------------------------------------------------------------------


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f} s" if ms >= 10_000 else f"{ms:.0f} ms"


def _tokens(n: int | None) -> str:
    return "?" if n is None else str(n)


def _labelled(name: str, labels: tuple[str, ...]) -> str:
    shown = [label for label in labels if label]
    return f"{name} ({'; '.join(shown)})" if shown else name


def scope_words(scope: ResultScope | None) -> str:
    """What an item was derived from (who may be told about it): `acme: document q3 (finance;
    confidential)`, `personal to @alice:x`; empty for nobody's data."""
    if scope is None:
        return "scope not recorded"
    parts = [f"document {_labelled(d.doc_id, (d.category, *d.tags))}" for d in scope.documents]
    parts += [f"entity {_labelled(e.id, (e.entity_type, *e.tags))}" for e in scope.entities]
    words = f"{scope.domain}: {', '.join(parts)}" if parts else ""
    if scope.personal_to is not None:
        words += f"{', ' if words else ''}personal to {scope.personal_to or '(nobody)'}"
    return printable(words)


def tool_line(t: ToolCallTrace) -> str:
    """One tool call: what was called, the decision, the confirmation, the outcome."""
    parts = [t.name, t.source, t.decision, t.outcome, _ms(t.duration_ms)]
    if t.confirmation_asked:
        answered = (
            f"answered {t.confirmation_answer} after {t.confirmation_seconds:.1f} s"
            if t.confirmation_answer is not None and t.confirmation_seconds is not None
            else f"answered {t.confirmation_answer}"
            if t.confirmation_answer is not None
            else "not answered"
        )
        parts.append(f"confirmation asked, {answered}")
    if t.credential_used:
        parts.append("with the user's credential")
    if t.result_chars:
        parts.append(f"result {t.result_chars} chars")
    if not t.room_may_see:
        parts.append("for the asker only")
    if words := scope_words(t.scope):
        parts.append(f"derived from {words}" if t.scope is not None else words)
    line = "  ".join(printable(p) for p in parts)
    if t.arguments:
        line += "\n      arguments " + printable(json.dumps(t.arguments, ensure_ascii=False, sort_keys=True))
    return line


def describe(t: TurnTrace) -> list[str]:
    """The turn as `vagent trace show` prints it."""
    where = "a group room" if t.group else "a direct conversation"
    reason = f" ({t.reason})" if t.reason else ""
    lines = [
        f"Turn {t.turn_id}: {t.outcome}{reason}",
        f"  user {printable(t.user_id)}, tenant {printable(t.tenant) or '-'}, in {where}",
        f"  question {printable(t.question)!r}" if t.question else "  question not recorded",
        f"  session {printable(t.session_id)}",
        f"  started {_when(t.started_at)}, took {_ms(t.total_ms)}, first answer text after "
        f"{_ms(t.first_token_ms)}",
    ]
    if t.event_ids:
        lines.append("  Matrix events " + ", ".join(printable(e) for e in t.event_ids))
    if t.otel_trace_ids:
        lines.append("  OpenTelemetry traces " + ", ".join(t.otel_trace_ids))
    lines.append(f"LLM calls: {len(t.llm_calls)} ({t.input_tokens} tokens in, {t.output_tokens} out)")
    for n, c in enumerate(t.llm_calls, 1):
        lines.append(
            f"  {n}. {printable(c.model)}  {c.purpose}  in {_tokens(c.input_tokens)}  "
            f"out {_tokens(c.output_tokens)}  first token {_ms(c.first_token_ms)}  "
            f"took {_ms(c.duration_ms)}  finish {printable(c.finish_reason or '-')}"
        )
    lines.append(f"Tool calls: {len(t.tool_calls)}")
    lines += [f"  {n}. {tool_line(c)}" for n, c in enumerate(t.tool_calls, 1)]
    lines.append(f"Sources: {len(t.sources)}")
    for s in t.sources:
        only = "" if s.room_may_see else "  (for the asker only)"
        title = f" {printable(s.title)!r}" if s.title and s.title != s.id else ""
        scope = f"  [{scope_words(s.scope)}]" if s.scope is not None and not s.scope.empty else ""
        lines.append(f"  {s.kind} {printable(s.id)}{title}{only}{scope}")
    return lines


#: (title, width) of `list`'s columns; the last one is not padded.
COLUMNS: tuple[tuple[str, int], ...] = (
    ("STARTED (UTC)", 20),
    ("TURN", 32),
    ("OUTCOME", 11),
    ("USER", 28),
    ("LLM", 3),
    ("TOKENS", 13),
    ("TOOLS", 5),
    ("TIME", 8),
    #: The question the turn answered, cut to this (the trace keeps QUESTION_CHARS of it).
    ("QUESTION", 40),
)


def table_row(t: TurnTrace) -> str:
    """One turn, in COLUMNS' order; the question last ("-": not recorded)."""
    values = (
        _when(t.started_at),
        t.turn_id,
        t.outcome,
        t.user_id,
        str(len(t.llm_calls)),
        f"{t.input_tokens}/{t.output_tokens}",
        str(len(t.tool_calls)),
        _ms(t.total_ms),
        t.question or "-",
    )
    return "  ".join(cell(v, w).ljust(w) for v, (_, w) in zip(values, COLUMNS, strict=True)).rstrip()


# ---- Redis -------------------------------------------------------------------------------------


def with_store(work: Callable[[TraceStore], Awaitable[T]]) -> T:
    """Run `work` on the trace store, turning Redis' failures into one line and the exit code."""
    settings = load_settings(PROG, CommonSettings)

    async def run(redis: Redis) -> T:
        return await work(TraceStore(redis, settings.TRACE_TTL_SECONDS))

    return on_redis(PROG, settings.REDIS_URL, run, timeout=10)


# ---- the command line --------------------------------------------------------------------------


def _since(text: str) -> datetime:
    try:
        return parse_when(text, datetime.now(UTC))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _user(text: str) -> str:
    if not valid_user_id(text):
        raise typer.BadParameter(f"{text!r} is not a Matrix user id (@name:server)")
    return text


def _outcome(text: str) -> str:
    if text not in get_args(TurnOutcome):
        raise typer.BadParameter(f"{text!r} is not one of {', '.join(get_args(TurnOutcome))}")
    return text


AsJson = Annotated[bool, typer.Option("--json", help="the stored TurnTrace as JSON")]


@app.command()
def show(
    ref: Annotated[str, typer.Argument(metavar="EVENT_ID|TURN_ID", help="a turn id, or the bot's event id")],
    as_json: AsJson = False,
) -> None:
    """One turn: its outcome, LLM calls, tool calls and sources."""
    found = with_store(lambda store: store.resolve(ref))
    if found is None:
        complain(PROG, f"no trace for {printable(ref)!r} (not a turn id or answer event id, or it expired)")
        raise typer.Exit(1)
    if as_json:
        say(found.model_dump_json(indent=2))
        return
    for line in describe(found):
        say(line)


@app.command("list")
def list_(
    user: Annotated[
        str | None, typer.Option(parser=_user, metavar="USER_ID", help="only this Matrix user id")
    ] = None,
    since: Annotated[
        datetime | None,
        typer.Option(parser=_since, metavar="WHEN", help="from then on: 30m, 1d, 1w, or YYYY-MM-DD (UTC)"),
    ] = None,
    outcome: Annotated[
        str | None,
        typer.Option(parser=_outcome, metavar="OUTCOME", help=f"only: {', '.join(get_args(TurnOutcome))}"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=MAX_LIMIT, help="at most this many")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON array of TurnTraces")] = False,
) -> None:
    """Stored turns, newest first."""
    flt = TraceFilter(user, since, outcome, limit)  # type: ignore[arg-type]  # checked by _outcome
    found = with_store(lambda store: store.recent(flt))
    if as_json:
        say(json.dumps([t.model_dump(mode="json") for t in found], indent=2))
        return
    say(header(COLUMNS))
    for t in found:
        say(table_row(t))
