"""A session's checkpoint, read in the same round trip that takes its lock.

Every run starts with two waits on Redis: take the session lock, then (inside LangGraph) read
the checkpoint and refresh its TTL, which is two more round trips when a conversation
exists. The lock script can do all three at once (session_lock.py); this module hands what
it read to the checkpointer, so LangGraph's own read is answered without asking Redis.

How: the checkpointer gets a `PrefetchingRedis`, the same connection pool behind a client
that answers a `JSON.GET` of the prefetched checkpoint key (and the `EXPIRE` the
checkpointer sends after it) from what the lock script returned. Each prefetched read
is served once, and only within the run that took the lock (a context variable): every
other read, and a read after the first, goes to Redis as before. If the checkpointer ever
asks differently, nothing is served and it simply reads Redis itself.

The run does not wait for the lock before starting: LangGraph prepares the run (~0.2 ms)
while the lock script is on its way, and the checkpointer's first command waits for it
(`hold_reads`). Nothing of the session is read or written before the lock is held.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis


@dataclass
class Prefetched:
    """The checkpoint document as the lock script read it (None: there is none yet)."""

    key: str
    raw: bytes | None
    ttl_refreshed: bool
    served: bool = False


#: This task's source of prefetched reads: a future of what the session lock read (pending
#: while the lock is being taken: the checkpointer's commands then wait for it).
_READS: contextvars.ContextVar[asyncio.Future[Prefetched | None] | None] = contextvars.ContextVar(
    "vagent_locked_read", default=None
)


def offer(prefetched: Prefetched) -> None:
    """Make `prefetched` the answer to this task's next read of its key (and of the tasks
    it starts from now on)."""
    done: asyncio.Future[Prefetched | None] = asyncio.get_running_loop().create_future()
    done.set_result(prefetched)
    _READS.set(done)


def hold_reads(opening: asyncio.Future[Prefetched | None]) -> None:
    """The checkpointer's commands in this task (and the tasks it starts from now on) wait
    for `opening` (the lock being taken), then may be answered from its result. If it
    fails, they fail with its error: the run never touches a session it could not lock."""
    _READS.set(opening)


def _key(arg: Any) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def answer(pre: Prefetched, args: tuple[Any, ...]) -> tuple[bool, Any]:
    """(True, result) when the command `args` is answered by the prefetched read."""
    if len(args) < 2 or _key(args[1]) != pre.key:
        return False, None
    command = str(args[0]).upper()
    if command == "JSON.GET" and not pre.served and args[2:] in ((".",), (b".",)):
        pre.served = True
        return True, None if pre.raw is None else json.loads(pre.raw)
    if command == "EXPIRE" and pre.served and pre.ttl_refreshed:
        pre.ttl_refreshed = False  # the one refresh that follows the read
        return True, True
    return False, None


class PrefetchingRedis(Redis):
    """A Redis client (sharing another one's pool) whose commands wait for the session lock
    where a run holds them, and that answers the read fetched with the lock locally."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        reads = _READS.get()
        if reads is not None:
            pre = reads.result() if reads.done() else await reads
            if pre is not None:
                served, result = answer(pre, args)
                if served:
                    return result
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
