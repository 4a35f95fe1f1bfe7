"""`vagent-admin`: operator commands.

    vagent-admin forget USER_ID [--audit] [--dry-run]

`forget` erases what vagent keeps in Redis about one person (a GDPR erasure request). Revoke
their access first (the AccessControlProvider): forget does not stop a run in progress, and a
run that ends afterwards writes its checkpoint again. Forget then says so; run it again.

ERASED, for every session of the user (`{room}:{thread|main}:{user}`: all rooms, all threads):
  - the LangGraph checkpoints (the conversation, tool calls and results, pending questions):
    `checkpoint:`, `checkpoint_write:`, `checkpoint_blob:`, `checkpoint_latest:` and
    `write_keys_zset:` keys of their sessions; RediSearch drops the documents from its indexes;
  - `session:{sid}`, the pending question `hitl_pending:{sid}` and every `hitl_question:{event}`
    pointer whose value is one of their sessions;
  - the graph's session locks `lock:session:{sid}` and question hints `graph:question_pending:{sid}`;
  - their cached credentials `credential_cache:{user}|...` and flood window `bot:flood:{user}`;
  - with --audit: their entries in the audit stream (user_id is them, or the session is one of
    theirs), but not earlier `user_forgotten` records.
Then ONE audit record is written and kept on purpose: `user_forgotten`, resource `user:{id}`,
decision `done`, metadata = how many keys of each kind went (the proof the erasure was done).

KEPT:
  - other users' data that mentions them: another person's conversation (their checkpoints)
    may quote or name them; it is that person's data. Other users' audit entries whose
    metadata mentions them;
  - without --audit, their audit entries (often kept under a legal obligation);
  - keys that hold no user id: `bot:thread:{room}:{root}` (a thread the bot takes part in,
    shared by everyone in it), `bot:event_seen:{event}`, the bot's `bot:sync_token:`;
    documents and entity graphs (the organisation's knowledge, not per person);
  - outside Redis: the services' logs (audit lines included: your log retention), the
    Matrix homeserver (erase there with its own tools), the Credential Registry, the demo
    records database.
Keys of an unknown kind whose name still mentions the user are listed, not deleted.

Ownership is decided exactly, never by a name pattern alone: SCAN MATCH (patterns built with
redis_keys, glob characters escaped) only finds candidates. A session id ends with its user's
id and is parsed (SessionId.parse); a checkpoint document's own `thread_id` is used; for the
other checkpointer keys the session id ends at the key's last `:@`. So `@al:localhost` never
matches `@alice:localhost`, nor `@alice:localhost` `@alice:localhost.evil` or
`@alice:localhost:8448` (a key that could be either is left alone).

Exit codes: 0 done, 1 Redis failed midway (part may be erased: run it again), 2 bad usage or
Redis unreachable.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vagent_graph.audit_cli import StreamReader, connect, load_settings, printable, skipped_message, where
from vagent_shared import redis_keys
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import stream_bounds
from vagent_shared.redis_connect import RedisUrlError
from vagent_shared.session import SessionId
from vagent_shared.settings import CommonSettings

PROG = "vagent-admin"
BATCH = 500

#: Keys named `{prefix}{session_id}`, by kind.
SESSION_KINDS: dict[str, str] = {
    "session": redis_keys.session(""),
    "hitl_pending": redis_keys.hitl_pending(""),
    "session_lock": redis_keys.session_lock(""),
    "question_hint": redis_keys.graph_question_pending(""),
}
#: The checkpointer's keys `{prefix}{session_id}:...`, by kind.
CHECKPOINT_KINDS: dict[str, str] = {p.rstrip(":"): p for p in redis_keys.CHECKPOINT_KEY_PREFIXES}
KINDS: tuple[str, ...] = (
    *CHECKPOINT_KINDS,
    *SESSION_KINDS,
    "hitl_question",
    "credential_cache",
    "flood",
)

# A Matrix user id: `@localpart:server`. The localpart may be any printable ASCII but ':'
# (historical ids), minus '@' and '|' (the session id and credential-cache key formats rely on
# both being absent); the server is a host name, an IPv4 or a [IPv6] literal, maybe a port.
_LOCAL = r"[\x21-\x39\x3b-\x3f\x41-\x7b\x7d\x7e]+"
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
_USER_ID = re.compile(rf"@{_LOCAL}:{_HOST}(?::\d{{1,5}})?")
_WITH_PORT = re.compile(rf"@{_LOCAL}:{_HOST}:\d{{1,5}}")
#: What follows a user id that ENDS another one: `@alice:localhost` -> `@alice:localhost:8448`.
_PORT_NEXT = re.compile(r"\d{1,5}(?::|$)")


# ---- who owns what (pure) ----------------------------------------------------------------------


def valid_user_id(text: str) -> bool:
    return len(text) <= 255 and _USER_ID.fullmatch(text) is not None


def session_owner(session_id: str) -> str | None:
    try:
        return SessionId.parse(session_id).user_id
    except ValueError:
        return None


def owns_session_key(name: str, prefix: str, user_id: str) -> bool:
    """`{prefix}{session_id}` of one of the user's sessions."""
    return name.startswith(prefix) and session_owner(name[len(prefix) :]) == user_id


def checkpoint_key_session(name: str, prefix: str, user_id: str) -> str | None:
    """The user's session id a checkpointer key `{prefix}{session_id}:{namespace...}` belongs
    to, or None. The user id is the part after the name's last `:@` (room and thread ids
    hold no `:@` after a user id; namespaces, checkpoint and task ids none at all); a key whose
    rest could be the port of a longer user id is not theirs."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    at = rest.rfind(":@")
    if at < 0 or not rest.startswith(user_id + ":", at + 1):
        return None
    sid = rest[: at + 1 + len(user_id)]
    after = rest[len(sid) + 1 :]
    if _WITH_PORT.fullmatch(user_id) is None and _PORT_NEXT.match(after):
        return None
    return sid if session_owner(sid) == user_id else None


def owns_credential_key(name: str, user_id: str) -> bool:
    prefix = redis_keys.CREDENTIAL_CACHE_PREFIX
    return name.startswith(prefix) and name[len(prefix) :].partition("|")[0] == user_id


def mentions(text: str, user_id: str) -> bool:
    """`text` holds the user id as a whole (not as the start of a longer one)."""
    return re.search(re.escape(user_id) + r"(?![A-Za-z0-9.\-\]])(?!:\d)", text) is not None


def event_is_theirs(event: AuditEvent, user_id: str) -> bool:
    """An audit entry --audit erases (never a `user_forgotten` record)."""
    if event.event_type == "user_forgotten":
        return False
    return event.user_id == user_id or (
        event.session_id is not None and session_owner(event.session_id) == user_id
    )


# ---- finding and erasing -----------------------------------------------------------------------


def _name(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


@dataclass
class Plan:
    """What forgetting one user deletes, found before anything is deleted."""

    user_id: str
    keys: dict[str, list[bytes]] = field(default_factory=lambda: {k: [] for k in KINDS})
    audit_ids: list[str] = field(default_factory=list)
    #: Keys whose name mentions the user but of no kind forget knows: listed, left.
    unknown: list[bytes] = field(default_factory=list)
    audit_skipped: int = 0

    def total(self) -> int:
        return sum(len(v) for v in self.keys.values())


def _batches(items: Sequence[Any], size: int = BATCH) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _scan(redis: Redis, pattern: str) -> list[bytes]:
    return sorted(set(cast(Iterator[bytes], redis.scan_iter(match=pattern, count=1000))))


def _thread_ids(redis: Redis, keys: Sequence[bytes]) -> list[str | None]:
    """Each key's JSON `thread_id` (None: not a JSON document, or none in it)."""
    out: list[str | None] = []
    for part in _batches(keys):
        pipe = redis.pipeline(transaction=False)
        for key in part:
            pipe.execute_command("JSON.GET", key, "$.thread_id")  # type: ignore[no-untyped-call]
        for reply in pipe.execute(raise_on_error=False):
            thread: str | None = None
            if isinstance(reply, bytes | str):
                try:
                    found = json.loads(reply)
                except ValueError:
                    found = None
                if isinstance(found, list) and found and isinstance(found[0], str):
                    thread = found[0]
            out.append(thread)
    return out


def _checkpoint_keys(redis: Redis, prefix: str, user_id: str) -> list[bytes]:
    candidates = _scan(redis, redis_keys.user_checkpoint_keys_pattern(prefix, user_id))
    theirs = []
    for key, thread in zip(candidates, _thread_ids(redis, candidates), strict=True):
        if thread is not None:  # the document says whose it is
            if session_owner(thread) == user_id:
                theirs.append(key)
        elif checkpoint_key_session(_name(key), prefix, user_id) is not None:
            theirs.append(key)
    return theirs


def _question_pointers(redis: Redis, user_id: str) -> list[bytes]:
    keys = _scan(redis, redis_keys.hitl_question_pattern())
    theirs = []
    for part in _batches(keys):
        pipe = redis.pipeline(transaction=False)
        for key in part:
            pipe.get(key)
        for key, value in zip(part, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(value, bytes) and session_owner(value.decode("utf-8", "replace")) == user_id:
                theirs.append(key)
    return theirs


def plan(redis: Redis, user_id: str, stream: str, audit: bool) -> Plan:
    p = Plan(user_id)
    for kind, prefix in CHECKPOINT_KINDS.items():
        p.keys[kind] = _checkpoint_keys(redis, prefix, user_id)
    for kind, prefix in SESSION_KINDS.items():
        found = _scan(redis, redis_keys.user_session_keys_pattern(prefix, user_id))
        p.keys[kind] = [k for k in found if owns_session_key(_name(k), prefix, user_id)]
    p.keys["hitl_question"] = _question_pointers(redis, user_id)
    found = _scan(redis, redis_keys.credential_cache_pattern(user_id))
    p.keys["credential_cache"] = [k for k in found if owns_credential_key(_name(k), user_id)]
    flood = redis_keys.flood(user_id).encode()
    p.keys["flood"] = [flood] if redis.exists(flood) else []
    planned = {k for keys in p.keys.values() for k in keys}
    p.unknown = [
        k
        for k in _scan(redis, redis_keys.mentioning_pattern(user_id))
        if k not in planned and mentions(_name(k), user_id) and _name(k) != stream
    ]
    if audit:
        reader = StreamReader(redis, stream)
        p.audit_ids = [eid for eid, event in reader.forward() if event_is_theirs(event, user_id)]
        p.audit_skipped = reader.skipped
    return p


def erase(redis: Redis, p: Plan, stream: str, audit: bool) -> dict[str, int]:
    """Delete what `p` found; how many of each kind went (keys that expired meanwhile do not count)."""
    counts: dict[str, int] = {}
    for kind in KINDS:
        counts[kind] = 0
        for part in _batches(p.keys[kind]):
            counts[kind] += int(redis.unlink(*part))
    if audit:
        counts["audit_entries"] = 0
        for part in _batches(p.audit_ids):
            counts["audit_entries"] += int(redis.xdel(stream, *part))
    return counts


def record_forgotten(redis: Redis, settings: CommonSettings, user_id: str, counts: dict[str, int]) -> str:
    event = AuditEvent(
        service="admin",
        user_id=user_id,
        event_type="user_forgotten",
        resource=f"user:{user_id}",
        decision="done",
        reason="vagent-admin forget",
        metadata=counts,
    )
    bounds = stream_bounds(settings.AUDIT_STREAM_MAXLEN, settings.AUDIT_STREAM_MAX_AGE_HOURS * 3600)
    entry_id = redis.xadd(settings.AUDIT_STREAM, event.to_stream(), **bounds)  # type: ignore[arg-type]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


# ---- the command -------------------------------------------------------------------------------


def _user_arg(text: str) -> str:
    if not valid_user_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Matrix user id (@name:server)")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="vagent operator commands.")
    sub = p.add_subparsers(dest="command", required=True)
    fg = sub.add_parser(
        "forget",
        help="erase what vagent keeps about one user (GDPR)",
        description="Erase a user's sessions, checkpoints, pending questions, cached credentials "
        "and flood window from Redis; with --audit also their audit entries. One `user_forgotten` "
        "audit record is written and kept.",
    )
    fg.add_argument("user_id", type=_user_arg, metavar="USER_ID", help="the Matrix user id, @name:server")
    fg.add_argument("--audit", action="store_true", help="also delete their entries in the audit stream")
    fg.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    return p


def plural(n: int, noun: str, nouns: str) -> str:
    return f"{n} {noun if n == 1 else nouns}"


def say(text: str = "") -> None:
    print(text, flush=True)


def report_dry_run(p: Plan, audit: bool) -> None:
    audit_part = f" and {plural(len(p.audit_ids), 'audit entry', 'audit entries')}" if audit else ""
    what = plural(p.total(), "key", "keys") + audit_part
    say(f"Dry run, nothing was deleted. Forgetting {p.user_id} would delete {what}:")
    for kind in KINDS:
        if p.keys[kind]:
            say(f"  {kind} ({len(p.keys[kind])})")
            for key in p.keys[kind]:
                say(f"    {printable(_name(key))}")


def report(p: Plan, counts: dict[str, int], audit: bool, entry_id: str, stream: str) -> None:
    keys = sum(n for kind, n in counts.items() if kind != "audit_entries")
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


def forget(redis: Redis, settings: CommonSettings, args: argparse.Namespace) -> None:
    stream = settings.AUDIT_STREAM
    p = plan(redis, args.user_id, stream, args.audit)
    if args.dry_run:
        report_dry_run(p, args.audit)
    else:
        counts = erase(redis, p, stream, args.audit)
        entry_id = record_forgotten(redis, settings, args.user_id, counts)
        report(p, counts, args.audit, entry_id, stream)
    if p.unknown:
        say(
            f"Left {plural(len(p.unknown), 'key', 'keys')} whose name mentions {p.user_id} but of no kind "
            "forget erases (check them):"
        )
        for key in p.unknown:
            say(f"  {printable(_name(key))}")
    if p.audit_skipped:
        print(skipped_message(PROG, p.audit_skipped), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = load_settings(PROG)
    try:
        redis = connect(settings.REDIS_URL)
    except RedisUrlError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except RedisError as exc:
        print(
            f"{PROG}: cannot reach Redis at {where(settings.REDIS_URL)} (REDIS_URL): {type(exc).__name__}",
            file=sys.stderr,
        )
        return 2
    try:
        forget(redis, settings, args)
    except (RedisConnectionError, RedisTimeoutError, RedisError) as exc:
        print(
            f"{PROG}: Redis failed ({type(exc).__name__}: {exc}); part may be erased already: "
            "run the same command again",
            file=sys.stderr,
        )
        return 1
    finally:
        redis.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
