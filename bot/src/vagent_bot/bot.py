"""The bot process: log in, sync until stopped, then let running answers finish.

This module only builds the parts and runs them. Events come in through `sync` (each claimed
exactly once, across restarts and processes), `event_router` decides where each goes,
`conversation` takes one turn to the graph and streams the answer, `questions` handles the
answers to the agent's questions; the decisions themselves are pure functions (`routing`,
`commands`, `invites`, `audience`). `scheduler` runs scheduled tasks as turns of their owners.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog
from nio import AsyncClient, SyncResponse
from redis.asyncio import Redis

from vagent_bot.clients.graph_client import GraphClient
from vagent_bot.conversation.conversations import Conversations
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_bot.conversation.questions import Questions
from vagent_bot.conversation.sessions import SessionWorkers
from vagent_bot.matrix import client as matrix
from vagent_bot.matrix.sync import SyncHandler
from vagent_bot.matrix.tenants import Tenants
from vagent_bot.router import EventRouter
from vagent_bot.schedules.scheduler import MatrixSide, Scheduler
from vagent_shared.access_provider import AccessProvider
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.flood import FloodControl
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)


class VagentBot:
    """One bot process. Its parts get their edges (callbacks, the task spawner) from here."""

    def __init__(
        self,
        settings: BotSettings,
        client: AsyncClient,
        redis: Redis,
        graph: GraphClient,
        access: AccessProvider,
        flood: FloodControl,
        audit: AuditTrail | None = None,
    ) -> None:
        self.settings, self.client = settings, client
        self.workers = SessionWorkers()
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        hitl = HitlStore(redis)
        tenants = Tenants(client, settings.TENANT_STATE_EVENT_TYPE, settings.DEFAULT_DOMAIN)
        self.conversations = Conversations(settings, client, redis, graph, access, flood, hitl, tenants)
        self.questions = Questions(hitl, graph, self.workers, self.conversations, audit=audit)
        self.events = EventRouter(
            settings,
            client,
            redis,
            hitl=hitl,
            workers=self.workers,
            questions=self.questions,
            conversations=self.conversations,
            # the router tells the sync (built next) when an event is finished
            finished=lambda event_id: self.sync.finished(event_id),
            spawn=self._spawn,
            stopping=self._stopping,
        )
        #: Scheduled tasks: due runs claimed, checked again and answered (scheduler.py).
        self.scheduler = Scheduler(
            ScheduleStore(redis),
            MatrixSide(client, self.conversations, settings),
            grace_seconds=settings.SCHEDULE_GRACE_SECONDS,
            audit=audit,
        )
        self.sync = SyncHandler(
            settings,
            client,
            redis,
            tenants,
            on_event=self.events.dispatch,
            on_invite=self.events.on_invite,
            spawn=self._spawn,
        )

    async def run(self) -> None:
        """Sync until stop(); resumes from the token saved in Redis after every sync."""
        await matrix.login(self.client, self.settings)
        await self.events.learn_display_name()
        self.client.add_response_callback(self.sync.on_sync, SyncResponse)  # type: ignore[arg-type]
        self._spawn(self.sync.keep_leases())
        self._spawn(self.scheduler.run())  # starts once the first sync is done
        backoff = 1.0
        while not self._stopping.is_set():
            since = await self.sync.resume_token()
            sync = asyncio.create_task(
                self.client.sync_forever(
                    timeout=30_000,
                    sync_filter=matrix.sync_filter(self.settings.SYNC_TIMELINE_LIMIT),
                    since=since,
                    full_state=True,
                )
            )
            stop = asyncio.create_task(self._stopping.wait())
            done, _ = await asyncio.wait({sync, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                sync.cancel()
                await asyncio.gather(sync, return_exceptions=True)
                break
            stop.cancel()
            exc = sync.exception()
            log.error("sync_loop_failed", error_type=type(exc).__name__ if exc else None)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30)

    async def stop(self, grace_seconds: float = 20.0) -> None:
        """SIGTERM: stop syncing (the token is already saved), finish or cancel runs."""
        self._stopping.set()
        await asyncio.gather(self.workers.shutdown(grace_seconds), self.scheduler.stop(grace_seconds))
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.conversations.files.aclose()

    def sync_alive(self, max_age: float = 90.0) -> bool:
        return self.sync.alive(max_age)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A background task, cancelled by stop()."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
