"""Writing the audit trail: one JSON log line per event, and the same event appended to a
bounded Redis stream by a background task.

Why a queue: the user's request must never wait for, or fail because of, the audit
stream. `record` only formats, logs and enqueues; a full queue, a Redis error or a slow
XADD is counted through `on_failure` (each service's metric) and the request goes on.
The JSON log line is written synchronously, so a decision is on record even when Redis is
down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from vagent_shared.audit import AuditEvent, AuditEventType, Decision, scrub_arguments
from vagent_shared.settings import CommonSettings

log = structlog.get_logger("vagent.audit")


#: A redis.asyncio.Redis (or a cluster client): only `xadd` is used. The services' own
#: dependency, not this package's, so it is not imported here.
StreamWriter = Any


def stream_bounds(maxlen: int, max_age_seconds: float, now: float | None = None) -> dict[str, Any]:
    """XADD trimming arguments: by age (MINID ~) when `max_age_seconds` is set, else by count
    (MAXLEN ~); Redis takes one of the two per XADD."""
    if max_age_seconds > 0:
        oldest_ms = int(((time.time() if now is None else now) - max_age_seconds) * 1000)
        return {"minid": f"{max(oldest_ms, 0)}-0", "approximate": True}
    if maxlen > 0:
        return {"maxlen": maxlen, "approximate": True}
    return {}


def from_settings(
    settings: CommonSettings, service: str, redis: StreamWriter | None, on_failure: Callable[[str], None]
) -> AuditTrail:
    """The trail as AUDIT_* configure it."""
    return AuditTrail(
        service,
        redis,
        settings.AUDIT_STREAM,
        maxlen=settings.AUDIT_STREAM_MAXLEN,
        max_age_seconds=settings.AUDIT_STREAM_MAX_AGE_HOURS * 3600,
        on_failure=on_failure,
        include_content=settings.AUDIT_INCLUDE_CONTENT,
    )


class AuditTrail:
    """Records AuditEvents of one service. `start()` runs the stream writer; without it (or
    without Redis) events still reach the log."""

    def __init__(
        self,
        service: str,
        redis: StreamWriter | None,
        stream: str,
        *,
        maxlen: int = 1_000_000,
        max_age_seconds: float = 0,
        on_failure: Callable[[str], None] = lambda _reason: None,
        queue_size: int = 10_000,
        write_timeout: float = 2.0,
        include_content: bool = False,
    ) -> None:
        self.service, self.redis, self.stream = service, redis, stream
        #: AUDIT_INCLUDE_CONTENT: message bodies and free-text arguments are recorded as written.
        self.include_content = include_content
        self.maxlen, self.max_age_seconds = maxlen, max_age_seconds
        self.on_failure, self.write_timeout = on_failure, write_timeout
        self._queue: asyncio.Queue[AuditEvent] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None

    def record(
        self,
        event_type: AuditEventType,
        *,
        user_id: str,
        resource: str,
        decision: Decision,
        session_id: str | None = None,
        domain: str | None = None,
        reason: str = "",
        metadata: dict[str, Any] | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> AuditEvent:
        """Log the event and queue it for the stream; `arguments` (a tool call's) are scrubbed
        into `metadata["arguments"]`."""
        if arguments is not None:
            metadata = {**(metadata or {}), "arguments": scrub_arguments(arguments, self.include_content)}
        event = AuditEvent(
            service=self.service,
            user_id=user_id,
            session_id=session_id,
            domain=domain,
            event_type=event_type,
            resource=resource,
            decision=decision,
            reason=reason,
            metadata=metadata or {},
        )
        log.info("audit", audit=event.model_dump(mode="json"))
        if self.redis is not None:
            try:
                self._queue.put_nowait(event)
            except asyncio.QueueFull:
                self.on_failure("queue_full")
        return event

    def start(self) -> None:
        if self._task is None and self.redis is not None:
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="audit-stream")

    async def aclose(self, flush_within: float = 2.0) -> None:
        """Write what is queued (for at most `flush_within` seconds), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), flush_within)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def flush(self, within: float = 2.0) -> None:
        """Wait until every queued event was written (tests, and the CLI before it exits)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), within)

    async def _drain(self) -> None:
        """Write what is queued, up to BATCH events per round trip (one pipeline): one XADD
        per round trip fell behind a busy event loop, and the queue then held thousands of
        events in memory and dropped the rest (bench-capacity, parking 10 000 sessions)."""
        assert self.redis is not None
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                raise
            finally:
                for _ in batch:
                    self._queue.task_done()

    #: Events written per round trip at most.
    BATCH = 500

    async def _write(self, batch: list[AuditEvent]) -> None:
        """One pipeline (no transaction); each failed XADD counted once, never raised."""
        assert self.redis is not None
        pipe = self.redis.pipeline(transaction=False)
        bounds = stream_bounds(self.maxlen, self.max_age_seconds)
        for event in batch:
            pipe.xadd(self.stream, event.to_stream(), **bounds)
        try:
            results = await asyncio.wait_for(pipe.execute(raise_on_error=False), self.write_timeout)
        except TimeoutError:
            reasons = ["timeout"] * len(batch)
        except Exception as exc:  # Redis down, OOM, wrong type: counted, never raised
            reasons = [type(exc).__name__] * len(batch)
        else:
            reasons = [type(r).__name__ for r in results if isinstance(r, Exception)]
        for reason in reasons:
            self.on_failure(reason)
