"""Every Redis key name the services use, in one place."""

from __future__ import annotations

import hashlib

#: Prefix of the LangGraph checkpointer's keys (langgraph-checkpoint-redis default names).
CHECKPOINT_PREFIX = "checkpoint"
#: Prefixes the official Redis checkpointers use; used to measure/clean a session's bytes.
CHECKPOINT_KEY_PREFIXES = (
    "checkpoint:",
    "checkpoint_write:",
    "checkpoint_blob:",
    "checkpoint_latest:",
    "write_keys_zset:",
)


def session(session_id: str) -> str:
    """Per-session metadata hash (bot side)."""
    return f"session:{session_id}"


def hitl_pending(session_id: str) -> str:
    """The question the bot is waiting for an answer to; TTL = the question's timeout."""
    return f"hitl_pending:{session_id}"


def session_lock(session_id: str) -> str:
    """Held by the graph while one run of the session is in progress."""
    return f"lock:session:{session_id}"


def sync_token(user_id: str) -> str:
    """The bot's saved Matrix sync `next_batch`."""
    return f"bot:sync_token:{user_id}"


def event_seen(event_id: str) -> str:
    """SET NX marker so each Matrix event is handled at most once."""
    return f"bot:event_seen:{event_id}"


def events_unfinished(user_id: str) -> str:
    """Sorted set of the events the bot `user_id` claimed but has not finished handling, scored
    by when the claim's lease ends: a bot killed mid-answer leaves them to the next one."""
    return f"bot:events_unfinished:{user_id}"


def event_unfinished(event_id: str) -> str:
    """The claimed event itself ({"room_id", "source"} JSON), for whoever takes its lease over."""
    return f"bot:event_unfinished:{event_id}"


def flood(user_id: str) -> str:
    """Sliding-window sorted set for per-user flood control."""
    return f"bot:flood:{user_id}"


def hitl_question(event_id: str) -> str:
    """The session whose pending question is the bot message `event_id` (for reactions)."""
    return f"hitl_question:{event_id}"


def bot_thread(room_id: str, thread_root: str) -> str:
    """Marks a thread the bot takes part in (it answers there without a mention)."""
    return f"bot:thread:{room_id}:{thread_root}"


def graph_question_pending(session_id: str) -> str:
    """Set by the graph while a run of the session waits for a human (a fast-path hint)."""
    return f"graph:question_pending:{session_id}"


# ---- documents (graph): every key of a document index starts with `{index}:` ---------------


def doc_key(domain: str, doc_id: str) -> str:
    """A fixed-size, collision-free key part for (domain, doc_id): both may contain ':'."""
    return hashlib.sha256(f"{domain}\x00{doc_id}".encode()).hexdigest()[:32]


def doc_chunk_prefix(index: str) -> str:
    """Prefix of every chunk hash the RediSearch index `index` covers."""
    return f"{index}:chunk:"


def doc_chunk(index: str, domain: str, doc_id: str, position: int) -> str:
    """One chunk of a document (a hash: text, metadata and its vector)."""
    return f"{doc_chunk_prefix(index)}{doc_key(domain, doc_id)}:{position:05d}"


def doc_meta(index: str, domain: str, doc_id: str) -> str:
    """A document's metadata (hash; `vagent docs list` reads these)."""
    return f"{index}:doc:{doc_key(domain, doc_id)}"


def doc_meta_pattern(index: str) -> str:
    return f"{index}:doc:*"


def docs_index_meta(index: str) -> str:
    """Which embedding model (and dimensions) built the index."""
    return f"{index}:meta"


def entity_graph(prefix: str, domain: str) -> str:
    """The FalkorDB graph of one domain's entities: one graph per tenant."""
    return f"{prefix}:{domain}"


def docs_write_lock(index: str) -> str:
    """Held while a document (or the whole index) is written: one writer at a time."""
    return f"{index}:write_lock"


# ---- credentials (graph) ---------------------------------------------------------------------

CREDENTIAL_CACHE_PREFIX = "credential_cache:"


def credential_cache(user_id: str, domain: str, resource_id: str) -> str:
    """A user's cached credential (Fernet-encrypted). '|' cannot occur in a Matrix user id,
    so `credential_cache_pattern(user)` matches that user's entries and nobody else's."""
    return f"{CREDENTIAL_CACHE_PREFIX}{user_id}|{domain}|{resource_id}"


def glob_escape(text: str) -> str:
    """`text` as a literal inside a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def credential_cache_pattern(user_id: str) -> str:
    return f"{CREDENTIAL_CACHE_PREFIX}{glob_escape(user_id)}|*"


# ---- turn traces (docs/traces.md): all expire after TRACE_TTL_SECONDS ----------------------

TRACE_PREFIX = "trace:"
#: Every stored turn, scored by its start (epoch seconds): `vagent trace list` without --user.
TRACES_ALL = "trace:all"


def trace_turn(turn_id: str) -> str:
    """One TurnTrace (JSON)."""
    return f"trace:turn:{turn_id}"


def trace_event(event_id: str) -> str:
    """The turn whose answer (or question) is the bot's Matrix event `event_id` (the bot writes it)."""
    return f"trace:event:{event_id}"


def trace_session(session_id: str) -> str:
    """Sorted set of a session's turn ids, scored by their start."""
    return f"trace:session:{session_id}"


def trace_user(user_id: str) -> str:
    """Sorted set of a user's turn ids, scored by their start (`trace list --user`, forget)."""
    return f"trace:user:{user_id}"


# ---- token usage and budgets (docs/budgets.md) ---------------------------------------------


def usage_day(day: str) -> str:
    """One UTC day's token counters (a hash; `day` is YYYY-MM-DD). Fields: `u|{user}|in`,
    `u|{user}|out`, `t|{tenant}|in`, `t|{tenant}|out`, `t|{tenant}|calls`, and per row
    `r|{tenant}|{user}|in`, `...|out`, `...|calls` (vagent_graph.observability.usage builds and parses
    them). '|' cannot occur in a Matrix user id, so fields are parsed from the right."""
    return f"usage:{day}"


#: SCAN MATCH for every day hash (not the holds or the notices).
USAGE_DAYS_PATTERN = "usage:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"


def usage_held(scope: str) -> str:
    """Tokens reserved by LLM calls in flight for `u|{user}` or `t|{tenant}` (a sorted set:
    member `{id}:{tokens}`, scored by when the reservation lapses)."""
    return f"usage:held:{scope}"


def usage_notified(day: str, user_id: str) -> str:
    """Set once the user was told they used 80% of the day's budget."""
    return f"usage:notified:{day}:{user_id}"


def usage_notified_pattern(user_id: str) -> str:
    """Candidates for the user's `usage_notified` keys (the owner is checked by parsing)."""
    return f"usage:notified:*:{glob_escape(user_id)}"


# ---- erasure (vagent admin forget) ----
# SCAN MATCH patterns that find the CANDIDATE keys of one user; the caller checks the owner of
# each one by parsing (a pattern alone cannot tell `@alice:localhost` from `@alice:localhost:8448`).


def user_session_keys_pattern(prefix: str, user_id: str) -> str:
    """Keys `{prefix}{session_id}` (session, hitl_pending, lock:session, ...) of the user's
    sessions: a session id ends with its user's id."""
    return f"{glob_escape(prefix)}*:{glob_escape(user_id)}"


def user_checkpoint_keys_pattern(prefix: str, user_id: str) -> str:
    """Checkpointer keys `{prefix}{session_id}:{namespace}...` (prefix: one of
    CHECKPOINT_KEY_PREFIXES) of the user's sessions."""
    return f"{glob_escape(prefix)}*:{glob_escape(user_id)}:*"


def hitl_question_pattern() -> str:
    """Every question pointer (their names hold event ids; the value is the session id)."""
    return f"{glob_escape(hitl_question(''))}*"


def mentioning_pattern(user_id: str) -> str:
    """Any key whose name contains the user id (also other users' ids that extend it)."""
    return f"*{glob_escape(user_id)}*"


# ---- memory (docs/memory.md) ---------------------------------------------------------------
#: Key prefixes of the memory store (LangGraph's AsyncRedisStore: `store_prefix` /
#: `vector_prefix`; also its two RediSearch index names): `vagent_memory:{uuid}` holds a
#: memory (JSON: prefix, key, value, ...), `vagent_memory_vectors:{uuid}` its embedding.
MEMORY_STORE_PREFIX = "vagent_memory"
MEMORY_VECTOR_PREFIX = "vagent_memory_vectors"
#: The first label of every memory namespace.
MEMORY_NAMESPACE = "memory"


def memory_label(value: str) -> str:
    """A user id or tenant as one namespace label: 32 hex characters. The store matches
    namespaces as text (a user id's '.', ':' and '@' would split into words, and a store
    label may not contain '.'); a fixed-length hex word matches exactly one user or tenant."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def memory_namespace(user_id: str, domain: str | None = None) -> tuple[str, ...]:
    """A user's memories in one tenant (`domain`), or in every tenant (None: a prefix)."""
    base = (MEMORY_NAMESPACE, memory_label(user_id))
    return base if domain is None else (*base, memory_label(domain))


# ---- scheduled tasks (bot runs them; the graph's schedule_task tool writes them) ------------

#: Sorted set of job ids scored by their next due time (epoch seconds): what is due next.
SCHEDULE_DUE = "schedule:due"
#: Sorted set of runs (`RunClaim.run_id`) claimed but not yet started, scored by the end of
#: the claimant's lease: a bot that died before starting one leaves it to be taken over.
SCHEDULE_CLAIMED = "schedule:claimed"
#: Sorted set of runs started and still answering, scored by the end of their runner's lease
#: (renewed while it answers): a bot that died mid-run leaves its run to be recorded failed.
SCHEDULE_RUNNING = "schedule:running"


def schedule_job(job_id: str) -> str:
    """The job itself (ScheduledJob JSON)."""
    return f"schedule:job:{job_id}"


def schedule_jobs_of(user_id: str) -> str:
    """Set of the job ids `user_id` owns (listing, limits, erasure)."""
    return f"schedule:user:{user_id}"


def schedule_numbers(user_id: str) -> str:
    """Counter giving `user_id`'s next job number (stable: never reused)."""
    return f"schedule:seq:{user_id}"


def schedule_run(run_id: str) -> str:
    """A run's identity marker ("claimed" / "started" / the outcome), SET NX when claimed,
    kept for a while after: the same (job, due) is never run twice."""
    return f"schedule:run:{run_id}"


def schedule_timezone(user_id: str) -> str:
    """The user's time zone (`!timezone Europe/Oslo`), an IANA name."""
    return f"schedule:tz:{user_id}"


# ---- the gateway (docs/gateway.md) ---------------------------------------------------------
def gateway_thread(thread_id: str) -> str:
    """One gateway thread: JSON with its owner, tenant, creation time, metadata, status."""
    return f"gateway:thread:{thread_id}"


def gateway_threads_of(user_id: str) -> str:
    """Sorted set of the thread ids `user_id` owns, scored by last update (search, erasure)."""
    return f"gateway:user:{user_id}"


def gateway_token(token_hash: str) -> str:
    """A verified access token's user id, under a hash of the token; TTL =
    GATEWAY_TOKEN_CACHE_SECONDS. The token itself is never stored."""
    return f"gateway:token:{token_hash}"


def gateway_runs_of(user_id: str) -> str:
    """Sorted set of `user_id`'s live gateway runs on every replica: run id -> lease expiry
    (ms, Redis time). Counts GATEWAY_MAX_STREAMS_PER_USER across replicas; expired members
    are ignored and trimmed, and the key expires with the last lease (no erasure needed)."""
    return f"gateway:runs:{user_id}"


def gateway_run(run_id: str) -> str:
    """Hash of one live gateway run (owner, thread, `cancel` once asked to stop), so any
    replica can find and stop it; TTL = the run's lease, renewed while it lives."""
    return f"gateway:run:{run_id}"


def gateway_cancel_channel() -> str:
    """Pub/sub channel every gateway replica listens on: a run id to stop, if it is theirs."""
    return "gateway:cancel"
