"""Forgetting one user (a GDPR erasure request): what vagent keeps about them in Redis, found
exactly, then deleted, with one audit record kept as proof. `vagent admin forget` runs it.

ERASED, for every session of the user (`{room}:{thread|main}:{user}`: all rooms, all threads):
  - the LangGraph checkpoints (the conversation, tool calls and results, pending questions):
    `checkpoint:`, `checkpoint_write:`, `checkpoint_blob:`, `checkpoint_latest:` and
    `write_keys_zset:` keys of their sessions; RediSearch drops the documents from its indexes;
  - `session:{sid}`, the pending question `hitl_pending:{sid}` and every `hitl_question:{event}`
    pointer whose value is one of their sessions;
  - the graph's session locks `lock:session:{sid}` and question hints `graph:question_pending:{sid}`;
  - their cached credentials `credential_cache:{user}|...` and flood window `bot:flood:{user}`;
  - their token usage: their fields (`u|{user}|...`, `r|{tenant}|{user}|...`) in every day hash
    `usage:{day}`, their budget holds `usage:held:u|{user}` and "80% used" notices
    `usage:notified:{day}:{user}` (the tenants' day totals stay: they name nobody);
  - their turn traces (docs/traces.md): every turn in `trace:user:{user}` or in the
    `trace:session:{sid}` of one of their sessions (`trace:turn:{id}`), those index sets, the
    bot's `trace:event:{event}` pointers to those turns, and the turns' entries in `trace:all`;
  - their memories (docs/memory.md), in every tenant: the memory store's documents
    `vagent_memory:{id}` and their embeddings `vagent_memory_vectors:{id}` whose namespace is
    theirs (`memory.{memory_label(user)}.{tenant}`: the document's own `prefix` field says so);
  - their scheduled tasks (docs/schedules.md): each job `schedule:job:{id}` whose JSON names
    them as `owner` (found through their set `schedule:user:{user}`), its entry in the due set
    `schedule:due` (ZREM), their set, their number counter `schedule:seq:{user}` and their time
    zone `schedule:tz:{user}` (the same keys ScheduleStore.delete_all_of deletes; run markers
    `schedule:run:{job}@{due}` name no user and expire; a claimed run of a deleted job is
    never started);
  - their gateway threads (docs/gateway.md): each thread record `gateway:thread:{id}` whose
    JSON names them as `owner` (found through their index `gateway:user:{user}`, and among
    all thread records, so one their index lost is found too), and that index; the gateway's
    token cache entries `gateway:token:{hash}` that hold their id (it expires within
    GATEWAY_TOKEN_CACHE_SECONDS anyway). A thread's conversation is a session of theirs:
    its checkpoints, traces and questions go with their other sessions above;
  - so every file they sent: the bot gives a file only to a turn of the person who sent it
    (vagent_bot.access.file_owner), and the graph keeps it nowhere but in that session's checkpoint
    (its text, its facts) and names it nowhere but in that turn's trace, both erased above;
    no other Redis key holds a file (neither service caches downloads);
  - on request: their entries in the audit stream (user_id is them, or the session is one of
    theirs), but not earlier `user_forgotten` records.
Then ONE audit record is written and kept on purpose: `user_forgotten`, resource `user:{id}`,
decision `done`, metadata = how many keys of each kind went (the proof the erasure was done).

KEPT:
  - other users' data that mentions them: another person's conversation (their checkpoints)
    may quote or name them; it is that person's data. Other users' audit entries whose
    metadata mentions them;
  - unless asked, their audit entries (often kept under a legal obligation);
  - keys that hold no user id: `bot:thread:{room}:{root}` (a thread the bot takes part in,
    shared by everyone in it), `bot:event_seen:{event}`, the bot's `bot:sync_token:`;
    documents and entity graphs (the organisation's knowledge, not per person);
  - outside Redis: the services' logs (audit lines included: your log retention), the
    Matrix homeserver (the files themselves too: erase there with its own tools), the
    Credential Registry, the demo records database.
Keys of an unknown kind whose name still mentions the user are listed, not deleted.

Ownership is decided exactly, never by a name pattern alone: SCAN MATCH (patterns built with
redis_keys, glob characters escaped) only finds candidates. A session id ends with its user's
id and is parsed (SessionId.parse); a checkpoint document's own `thread_id` is used; for the
other checkpointer keys the session id ends at the key's last `:@`. So `@al:localhost` never
matches `@alice:localhost`, nor `@alice:localhost` `@alice:localhost.evil` or
`@alice:localhost:8448` (a key that could be either is left alone).

Why two halves: deciding what is theirs is pure (names, values and events in, keys out), so
it is tested without Redis and any caller can reuse it with its own client (the admin API is
asynchronous); the Redis I/O below it (synchronous, for the command) only fetches candidates
and deletes what the plan holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis import Redis

from vagent_graph.observability.audit_reader import Entry, StreamReader
from vagent_graph.observability.trace_store import turn_ids
from vagent_graph.observability.usage import their_fields
from vagent_shared import redis_keys
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import stream_bounds
from vagent_shared.session import SessionId
from vagent_shared.settings import CommonSettings

#: Keys per SCAN reply, pipeline, UNLINK and XDEL.
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
    "usage_held",
    "usage_notified",
    "trace_turn",
    "trace_session",
    "trace_user",
    "trace_event",
    "memories",
    "memory_vectors",
    "schedules",
    "schedule_keys",
    "gateway_threads",
    "gateway_index",
    "gateway_tokens",
)
#: The memory store's key prefixes, by kind (`{prefix}:{id}`, JSON documents with a `prefix`
#: field: the namespace they belong to).
MEMORY_KINDS: dict[str, str] = {
    "memories": redis_keys.MEMORY_STORE_PREFIX,
    "memory_vectors": redis_keys.MEMORY_VECTOR_PREFIX,
}

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
    """An audit entry an erasure with the audit trail deletes (never a `user_forgotten` record)."""
    if event.event_type == "user_forgotten":
        return False
    return event.user_id == user_id or (
        event.session_id is not None and session_owner(event.session_id) == user_id
    )


# ---- the plan (pure): from what Redis holds to what goes ---------------------------------------


def key_name(key: bytes) -> str:
    """A key's name as text; bytes that are not UTF-8 survive (and never match a user id)."""
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
    #: Their turns' ids: their entries in `trace:all` go too (ZREM).
    trace_ids: list[str] = field(default_factory=list)
    #: Their fields in each day hash of token usage (usage.py): deleted with HDEL.
    usage_fields: dict[bytes, list[str]] = field(default_factory=dict)

    def total(self) -> int:
        return sum(len(v) for v in self.keys.values())


def thread_id(json_get_reply: object) -> str | None:
    """The `thread_id` in a `JSON.GET key $.thread_id` reply (None: not a JSON document, or
    none in it)."""
    if not isinstance(json_get_reply, bytes | str):
        return None
    try:
        found = json.loads(json_get_reply)
    except ValueError:
        return None
    return found[0] if isinstance(found, list) and found and isinstance(found[0], str) else None


def their_checkpoint_keys(
    candidates: Sequence[bytes], thread_ids: Sequence[str | None], prefix: str, user_id: str
) -> list[bytes]:
    """The candidates that are the user's: by the document's own `thread_id` when it has one,
    else by the key's name."""
    theirs = []
    for key, thread in zip(candidates, thread_ids, strict=True):
        if thread is not None:  # the document says whose it is
            if session_owner(thread) == user_id:
                theirs.append(key)
        elif checkpoint_key_session(key_name(key), prefix, user_id) is not None:
            theirs.append(key)
    return theirs


def their_session_keys(candidates: Iterable[bytes], prefix: str, user_id: str) -> list[bytes]:
    return [k for k in candidates if owns_session_key(key_name(k), prefix, user_id)]


def namespace_of(json_get_reply: object) -> tuple[str, ...] | None:
    """The namespace in a `JSON.GET key $.prefix` reply of the memory store (None: not such a
    document). The store keeps it as RediSearch text: its labels joined by '.', punctuation
    escaped with a backslash."""
    if not isinstance(json_get_reply, bytes | str):
        return None
    try:
        found = json.loads(json_get_reply)
    except ValueError:
        return None
    if not (isinstance(found, list) and found and isinstance(found[0], str)):
        return None
    return tuple(re.sub(r"\\(.)", r"\1", found[0]).split("."))


def their_memory_keys(candidates: Sequence[bytes], replies: Sequence[object], user_id: str) -> list[bytes]:
    """The memory store's keys (with their `$.prefix` replies) in one of the user's
    namespaces: `memory.{memory_label(user)}...`, any tenant."""
    label = redis_keys.memory_label(user_id)
    theirs = []
    for key, reply in zip(candidates, replies, strict=True):
        ns = namespace_of(reply)
        if ns is not None and len(ns) >= 2 and ns[:2] == (redis_keys.MEMORY_NAMESPACE, label):
            theirs.append(key)
    return theirs


def owner_of(reply: object) -> str | None:
    """The `owner` of a JSON document read with GET (or `JSON.GET key $`, a list of one);
    None when the reply is no such document (missing, another type, not JSON)."""
    if not isinstance(reply, bytes | str):
        return None
    try:
        doc = json.loads(reply)
    except ValueError:
        return None
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]
    owner = doc.get("owner") if isinstance(doc, dict) else None
    return owner if isinstance(owner, str) else None


def their_jobs(candidates: Sequence[bytes], replies: Sequence[object], user_id: str) -> list[bytes]:
    """The job keys (with their GET replies) whose job is the user's: its own `owner` says so
    (a job named in their set but owned by someone else is left alone)."""
    return [key for key, reply in zip(candidates, replies, strict=True) if owner_of(reply) == user_id]


def their_gateway_threads(
    candidates: Sequence[bytes], replies: Sequence[object], user_id: str
) -> list[bytes]:
    """The gateway thread records (with their GET replies) that are the user's: the record's
    own `owner` says so, whichever index named it (another person's thread id put in their
    index is left alone)."""
    return [key for key, reply in zip(candidates, replies, strict=True) if owner_of(reply) == user_id]


def token_holder(reply: object) -> str | None:
    """The user id a gateway token cache entry holds: the value itself, or a JSON document's
    `user_id` (or `user`)."""
    if not isinstance(reply, bytes | str):
        return None
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply
    try:
        doc = json.loads(text)
    except ValueError:
        return text
    if isinstance(doc, str):
        return doc
    if isinstance(doc, dict):
        held = doc.get("user_id", doc.get("user"))
        return held if isinstance(held, str) else None
    return None


def their_gateway_tokens(entries: Iterable[tuple[bytes, object]], user_id: str) -> list[bytes]:
    """`gateway:token:{hash}` keys (with their GET replies) that hold exactly this user's id."""
    return [key for key, reply in entries if token_holder(reply) == user_id]


def job_id_of(key: bytes) -> str:
    """`schedule:job:{id}` -> the id (the member of `schedule:due`)."""
    return key_name(key).removeprefix(redis_keys.schedule_job(""))


def their_question_pointers(pointers: Iterable[tuple[bytes, object]], user_id: str) -> list[bytes]:
    """`hitl_question:{event}` keys (with their GET replies) that point at one of their sessions."""
    return [
        key
        for key, value in pointers
        if isinstance(value, bytes) and session_owner(value.decode("utf-8", "replace")) == user_id
    ]


def their_credential_keys(candidates: Iterable[bytes], user_id: str) -> list[bytes]:
    return [k for k in candidates if owns_credential_key(key_name(k), user_id)]


def their_notice_keys(candidates: Iterable[bytes], user_id: str) -> list[bytes]:
    """`usage:notified:{YYYY-MM-DD}:{user}` keys of exactly this user."""
    prefix = redis_keys.usage_notified("", "")[: -len(":")]
    out = []
    for k in candidates:
        name = key_name(k)
        day, sep, owner = name.removeprefix(prefix).partition(":")
        if name.startswith(prefix) and sep and len(day) == 10 and owner == user_id:
            out.append(k)
    return out


def their_trace_pointers(pointers: Iterable[tuple[bytes, object]], turns: Iterable[str]) -> list[bytes]:
    """`trace:event:{event}` keys (with their GET replies) that point at one of their turns."""
    theirs = set(turns)
    return [
        key
        for key, value in pointers
        if isinstance(value, bytes) and value.decode("utf-8", "replace") in theirs
    ]


def unknown_keys(candidates: Iterable[bytes], plan: Plan, stream: str) -> list[bytes]:
    """Keys that mention the user, of no kind the plan deletes (the audit stream excepted)."""
    planned = {k for keys in plan.keys.values() for k in keys}
    return [
        k
        for k in candidates
        if k not in planned and mentions(key_name(k), plan.user_id) and key_name(k) != stream
    ]


def their_audit_ids(entries: Iterable[Entry], user_id: str) -> list[str]:
    return [eid for eid, event in entries if event_is_theirs(event, user_id)]


def forgotten_event(user_id: str, counts: dict[str, int], reason: str) -> AuditEvent:
    """The record an erasure leaves: who, and how many of each kind went (`reason`: by what)."""
    return AuditEvent(
        service="admin",
        user_id=user_id,
        event_type="user_forgotten",
        resource=f"user:{user_id}",
        decision="done",
        reason=reason,
        metadata=counts,
    )


# ---- Redis I/O (synchronous) -------------------------------------------------------------------


def _batches(items: Sequence[Any], size: int = BATCH) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _scan(redis: Redis, pattern: str) -> list[bytes]:
    return sorted(set(cast(Iterator[bytes], redis.scan_iter(match=pattern, count=1000))))


def _thread_ids(redis: Redis, keys: Sequence[bytes]) -> list[str | None]:
    out: list[str | None] = []
    for part in _batches(keys):
        pipe = redis.pipeline(transaction=False)
        for key in part:
            pipe.execute_command("JSON.GET", key, "$.thread_id")  # type: ignore[no-untyped-call]
        out += [thread_id(reply) for reply in pipe.execute(raise_on_error=False)]
    return out


def _json_paths(redis: Redis, keys: Sequence[bytes], path: str) -> list[object]:
    out: list[object] = []
    for part in _batches(keys):
        pipe = redis.pipeline(transaction=False)
        for key in part:
            pipe.execute_command("JSON.GET", key, path)  # type: ignore[no-untyped-call]
        out += pipe.execute(raise_on_error=False)
    return out


def _values(redis: Redis, keys: Sequence[bytes]) -> Iterator[tuple[bytes, object]]:
    for part in _batches(keys):
        pipe = redis.pipeline(transaction=False)
        for key in part:
            pipe.get(key)
        yield from zip(part, pipe.execute(raise_on_error=False), strict=True)


def plan(redis: Redis, user_id: str, stream: str, audit: bool) -> Plan:
    """Find what forgetting `user_id` deletes (with `audit`, their entries in `stream` too)."""
    p = Plan(user_id)
    for kind, prefix in CHECKPOINT_KINDS.items():
        candidates = _scan(redis, redis_keys.user_checkpoint_keys_pattern(prefix, user_id))
        p.keys[kind] = their_checkpoint_keys(candidates, _thread_ids(redis, candidates), prefix, user_id)
    for kind, prefix in SESSION_KINDS.items():
        candidates = _scan(redis, redis_keys.user_session_keys_pattern(prefix, user_id))
        p.keys[kind] = their_session_keys(candidates, prefix, user_id)
    pointers = _values(redis, _scan(redis, redis_keys.hitl_question_pattern()))
    p.keys["hitl_question"] = their_question_pointers(pointers, user_id)
    p.keys["credential_cache"] = their_credential_keys(
        _scan(redis, redis_keys.credential_cache_pattern(user_id)), user_id
    )
    flood = redis_keys.flood(user_id).encode()
    p.keys["flood"] = [flood] if redis.exists(flood) else []
    held = redis_keys.usage_held(f"u|{user_id}").encode()
    p.keys["usage_held"] = [held] if redis.exists(held) else []
    p.keys["usage_notified"] = their_notice_keys(
        _scan(redis, redis_keys.usage_notified_pattern(user_id)), user_id
    )
    p.usage_fields = _usage_fields(redis, user_id)
    _plan_traces(redis, p)
    for kind, prefix in MEMORY_KINDS.items():
        candidates = _scan(redis, redis_keys.glob_escape(prefix + ":") + "*")
        p.keys[kind] = their_memory_keys(candidates, _json_paths(redis, candidates, "$.prefix"), user_id)
    _plan_schedules(redis, p)
    _plan_gateway(redis, p)
    p.unknown = unknown_keys(_scan(redis, redis_keys.mentioning_pattern(user_id)), p, stream)
    if audit:
        reader = StreamReader(redis, stream)
        p.audit_ids = their_audit_ids(reader.forward(), user_id)
        p.audit_skipped = reader.skipped
    return p


def _usage_fields(redis: Redis, user_id: str) -> dict[bytes, list[str]]:
    """Their fields in every day hash (HSCAN finds candidates, usage.their_fields decides)."""
    match = f"*|{redis_keys.glob_escape(user_id)}|*"
    found: dict[bytes, list[str]] = {}
    for day in _scan(redis, redis_keys.USAGE_DAYS_PATTERN):
        pairs = cast(Iterator[tuple[bytes, bytes]], redis.hscan_iter(day, match=match, count=1000))
        names = [key_name(name) for name, _ in pairs]
        theirs = their_fields(names, user_id)
        if theirs:
            found[day] = theirs
    return found


def _plan_traces(redis: Redis, p: Plan) -> None:
    """Their turn traces: the turns their index sets name, the sets, the pointers to them."""
    prefix = redis_keys.trace_session("")
    p.keys["trace_session"] = their_session_keys(
        _scan(redis, redis_keys.user_session_keys_pattern(prefix, p.user_id)), prefix, p.user_id
    )
    user_set = redis_keys.trace_user(p.user_id).encode()
    p.keys["trace_user"] = [user_set] if redis.exists(user_set) else []
    ids: set[str] = set()
    for key in [*p.keys["trace_user"], *p.keys["trace_session"]]:
        ids.update(turn_ids(cast(list[bytes], redis.zrange(key, 0, -1))))
    p.trace_ids = sorted(ids)
    turns = [redis_keys.trace_turn(i).encode() for i in p.trace_ids]
    p.keys["trace_turn"] = [k for k, value in _values(redis, turns) if value is not None]
    pointers = _scan(redis, redis_keys.glob_escape(redis_keys.trace_event("")) + "*")
    p.keys["trace_event"] = their_trace_pointers(_values(redis, pointers), p.trace_ids)


def _plan_schedules(redis: Redis, p: Plan) -> None:
    """Their scheduled jobs (by their set, each checked by its owner) and their per-user keys."""
    ids = sorted(
        key_name(i) for i in cast(set[bytes], redis.smembers(redis_keys.schedule_jobs_of(p.user_id)))
    )
    candidates = [redis_keys.schedule_job(i).encode() for i in ids]
    replies = [value for _, value in _values(redis, candidates)]
    p.keys["schedules"] = their_jobs(candidates, replies, p.user_id)
    per_user = [
        redis_keys.schedule_jobs_of(p.user_id),
        redis_keys.schedule_numbers(p.user_id),
        redis_keys.schedule_timezone(p.user_id),
    ]
    p.keys["schedule_keys"] = [k.encode() for k in per_user if redis.exists(k)]


def _documents(redis: Redis, keys: Sequence[bytes]) -> list[object]:
    """Each key's JSON text: its value when it is a string, else (a RedisJSON document)
    `JSON.GET key $`; None when it is gone or neither."""
    replies = [value for _, value in _values(redis, keys)]
    other = [i for i, value in enumerate(replies) if not isinstance(value, bytes | str | None)]
    for i, reply in zip(other, _json_paths(redis, [keys[i] for i in other], "$"), strict=True):
        replies[i] = reply if isinstance(reply, bytes | str) else None
    return replies


def _plan_gateway(redis: Redis, p: Plan) -> None:
    """Their gateway threads (named in their index or found among all records, each checked
    by its owner), their index, and the token cache entries that hold their id."""
    index = redis_keys.gateway_threads_of(p.user_id)
    listed = {
        redis_keys.gateway_thread(key_name(i)).encode() for i in cast(list[bytes], redis.zrange(index, 0, -1))
    }
    records = _scan(redis, redis_keys.glob_escape(redis_keys.gateway_thread("")) + "*")
    candidates = sorted(listed | set(records))
    p.keys["gateway_threads"] = their_gateway_threads(candidates, _documents(redis, candidates), p.user_id)
    p.keys["gateway_index"] = [index.encode()] if redis.exists(index) else []
    tokens = _scan(redis, redis_keys.glob_escape(redis_keys.gateway_token("")) + "*")
    p.keys["gateway_tokens"] = their_gateway_tokens(_values(redis, tokens), p.user_id)


def erase(redis: Redis, p: Plan, stream: str, audit: bool) -> dict[str, int]:
    """Delete what `p` found; how many of each kind went (keys that expired meanwhile do not count)."""
    # Out of the due set first: no scheduler claims a job from here on.
    for part in _batches(p.keys["schedules"]):
        redis.zrem(redis_keys.SCHEDULE_DUE, *[job_id_of(k) for k in part])
    counts: dict[str, int] = {}
    for kind in KINDS:
        counts[kind] = 0
        for part in _batches(p.keys[kind]):
            counts[kind] += int(redis.unlink(*part))
    for part in _batches(p.trace_ids):
        redis.zrem(redis_keys.TRACES_ALL, *part)
    counts["usage_fields"] = 0
    for day, names in p.usage_fields.items():
        for part in _batches(names):
            counts["usage_fields"] += int(redis.hdel(day, *part))
    if audit:
        counts["audit_entries"] = 0
        for part in _batches(p.audit_ids):
            counts["audit_entries"] += int(redis.xdel(stream, *part))
    return counts


def record_forgotten(
    redis: Redis, settings: CommonSettings, user_id: str, counts: dict[str, int], reason: str
) -> str:
    """Append the `user_forgotten` record to the audit stream; its entry id."""
    event = forgotten_event(user_id, counts, reason)
    bounds = stream_bounds(settings.AUDIT_STREAM_MAXLEN, settings.AUDIT_STREAM_MAX_AGE_HOURS * 3600)
    entry_id = redis.xadd(settings.AUDIT_STREAM, event.to_stream(), **bounds)  # type: ignore[arg-type]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
