"""`vagent admin`: operator commands.

    vagent admin forget USER_ID [--audit] [--dry-run]
    vagent admin genkey

`forget` erases what vagent keeps in Redis about one person (a GDPR erasure request; what goes
and what stays: vagent_graph.state.erasure). Revoke their access first (the AccessControlProvider):
forget does not stop a run in progress, and a run that ends afterwards writes its checkpoint
again. Forget then says so; run it again. Exit codes: 0 done, 1 Redis failed midway (part may
be erased: run it again), 2 bad usage or Redis unreachable.

`genkey` prints a new Fernet key for the graph's CREDENTIAL_CACHE_KEY. It is here, in the
graph image, because production needs it and must not need a development tool for it.
"""

from __future__ import annotations

from typing import Annotated

import typer
from cryptography.fernet import Fernet
from redis import Redis
from redis.exceptions import RedisError

from vagent_graph.cli.common import connect, load_settings
from vagent_graph.cli.output import complain, plural, printable, say, skipped, unreachable
from vagent_graph.state import erasure
from vagent_graph.state.erasure import KINDS, Plan, key_name
from vagent_shared.redis_connect import RedisUrlError
from vagent_shared.settings import CommonSettings

PROG = "vagent admin"

app = typer.Typer(
    help="vagent operator commands.",
    short_help="Operator commands: forget a user (GDPR), make a credential-cache key.",
    no_args_is_help=True,
)


def report_dry_run(p: Plan, audit: bool) -> None:
    audit_part = f" and {plural(len(p.audit_ids), 'audit entry', 'audit entries')}" if audit else ""
    what = plural(p.total(), "key", "keys") + audit_part
    say(f"Dry run, nothing was deleted. Forgetting {p.user_id} would delete {what}:")
    for kind in KINDS:
        if p.keys[kind]:
            say(f"  {kind} ({len(p.keys[kind])})")
            for key in p.keys[kind]:
                say(f"    {printable(key_name(key))}")
    if p.usage_fields:  # their counters in the days' token usage hashes: `{key} {field}`
        say(f"  usage_fields ({sum(len(v) for v in p.usage_fields.values())})")
        for day, names in p.usage_fields.items():
            for name in names:
                say(f"    {printable(key_name(day))} {printable(name)}")


def report(p: Plan, counts: dict[str, int], audit: bool, entry_id: str, stream: str) -> None:
    keys = sum(n for kind, n in counts.items() if kind not in ("audit_entries", "usage_fields"))
    audit_part = (
        f" and {plural(counts.get('audit_entries', 0), 'audit entry', 'audit entries')}" if audit else ""
    )
    say(f"Forgot {p.user_id}: deleted {plural(keys, 'key', 'keys')}{audit_part}.")
    for kind, n in counts.items():
        if n:
            say(f"  {kind:<18} {n}")
    if not audit:
        say("Their audit entries were kept (--audit erases them too).")
    if counts.get("session_lock"):
        say(
            f"Note: {counts['session_lock']} of their sessions were running; a run that ends now may "
            "write its checkpoint again. Revoke their access and run forget again."
        )
    say(f"Recorded user_forgotten in {stream} (entry {entry_id}).")


def run_forget(redis: Redis, settings: CommonSettings, user_id: str, audit: bool, dry_run: bool) -> None:
    stream = settings.AUDIT_STREAM
    p = erasure.plan(redis, user_id, stream, audit)
    if dry_run:
        report_dry_run(p, audit)
    else:
        counts = erasure.erase(redis, p, stream, audit)
        entry_id = erasure.record_forgotten(redis, settings, user_id, counts, reason=f"{PROG} forget")
        report(p, counts, audit, entry_id, stream)
    if p.unknown:
        say(
            f"Left {plural(len(p.unknown), 'key', 'keys')} whose name mentions {p.user_id} but of no kind "
            "forget erases (check them):"
        )
        for key in p.unknown:
            say(f"  {printable(key_name(key))}")
    if p.audit_skipped:
        complain(PROG, skipped(p.audit_skipped))


def _user_id(text: str) -> str:
    if not erasure.valid_user_id(text):
        raise typer.BadParameter(f"{text!r} is not a Matrix user id (@name:server)")
    return text


@app.command(short_help="Erase what vagent keeps about one user (GDPR).")
def forget(
    user_id: Annotated[
        str, typer.Argument(parser=_user_id, metavar="USER_ID", help="the Matrix user id, @name:server")
    ],
    audit: Annotated[
        bool, typer.Option("--audit", help="also delete their entries in the audit stream")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="list what would be deleted; delete nothing")
    ] = False,
) -> None:
    """Erase a user's sessions, checkpoints, pending questions, cached credentials, flood
    window, turn traces, memories, scheduled tasks and gateway threads from Redis; with
    --audit also their audit entries. One
    `user_forgotten` audit record is written and kept."""
    settings = load_settings(PROG, CommonSettings)
    try:
        redis = connect(settings.REDIS_URL)
    except RedisUrlError as exc:
        complain(PROG, str(exc))
        raise typer.Exit(2) from None
    except RedisError as exc:
        complain(PROG, unreachable(settings.REDIS_URL, exc))
        raise typer.Exit(2) from None
    try:
        run_forget(redis, settings, user_id, audit, dry_run)
    except RedisError as exc:
        complain(
            PROG,
            f"Redis failed ({type(exc).__name__}: {exc}); part may be erased already: "
            "run the same command again",
        )
        raise typer.Exit(1) from None
    finally:
        redis.close()


@app.command(short_help="Print a new Fernet key for CREDENTIAL_CACHE_KEY.")
def genkey() -> None:
    """Print a new Fernet key for CREDENTIAL_CACHE_KEY (the encrypted credential cache)."""
    say(Fernet.generate_key().decode())
