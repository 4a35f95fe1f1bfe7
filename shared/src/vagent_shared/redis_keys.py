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
    """A document's metadata (hash; `vagent-docs list` reads these)."""
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
