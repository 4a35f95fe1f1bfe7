"""Every Redis key name the services use, in one place."""

from __future__ import annotations

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
