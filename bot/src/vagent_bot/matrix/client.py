"""matrix-nio glue: one device across restarts, E2EE store, sends that honour rate limits."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import structlog
from nio import (
    AsyncClient,
    AsyncClientConfig,
    LoginResponse,
    RoomSendError,
    RoomSendResponse,
    WhoamiResponse,
)

from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

CREDENTIALS_FILE = "credentials.json"

#: While one incoming event is handled: its id (hashed) and how many messages were sent for it.
_handling: ContextVar[tuple[str, list[int]] | None] = ContextVar("handling", default=None)


@contextlib.contextmanager
def handling(event_id: str) -> Iterator[None]:
    """Messages sent for `event_id` in the block (tasks started in it included) get transaction
    ids derived from it: `{hash}.0`, `{hash}.1`, ... A bot that handles the event again after a
    crash sends them again under the same ids, and the homeserver answers a repeated transaction
    id of the same device with the event it already created instead of a second message."""
    digest = hashlib.sha256(event_id.encode()).hexdigest()[:32]
    token = _handling.set((f"vagent.{digest}", [0]))
    try:
        yield
    finally:
        _handling.reset(token)


def _next_txn_id() -> str | None:
    """The next transaction id of the event being handled; None (nio picks one) otherwise."""
    current = _handling.get()
    if current is None:
        return None
    base, counter = current
    counter[0] += 1
    return f"{base}.{counter[0] - 1}"


def sync_filter(timeline_limit: int) -> dict[str, Any]:
    """A large timeline so bursts are not silently cut to 10 events per room."""
    return {
        "room": {
            "timeline": {"limit": timeline_limit},
            "state": {"lazy_load_members": True},
            "ephemeral": {"not_types": ["*"]},
            "account_data": {"not_types": ["*"]},
        },
        "presence": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
    }


class MatrixLoginError(RuntimeError):
    pass


def make_client(settings: BotSettings) -> AsyncClient:
    store = Path(settings.MATRIX_STORE_PATH)
    store.mkdir(parents=True, exist_ok=True)
    config = AsyncClientConfig(
        encryption_enabled=True,
        store_sync_tokens=False,  # the sync token lives in Redis
        max_limit_exceeded=0,  # we honour M_LIMIT_EXCEEDED ourselves
        max_timeouts=3,
        request_timeout=60,
    )
    return AsyncClient(settings.MATRIX_HOMESERVER, settings.MATRIX_USER, store_path=str(store), config=config)


async def login(client: AsyncClient, settings: BotSettings) -> None:
    """Reuse the device (and its crypto store) from earlier runs; log in only when needed."""
    creds_path = Path(settings.MATRIX_STORE_PATH) / CREDENTIALS_FILE
    saved: dict[str, str] = {}
    if creds_path.exists():
        try:
            saved = json.loads(creds_path.read_text())
        except ValueError:
            saved = {}
    token = settings.MATRIX_ACCESS_TOKEN.get_secret_value() if settings.MATRIX_ACCESS_TOKEN else None
    if token:
        client.access_token = token
        who = await client.whoami()
        if not isinstance(who, WhoamiResponse) or not who.device_id:
            raise MatrixLoginError("MATRIX_ACCESS_TOKEN was refused by the homeserver")
        client.restore_login(who.user_id, who.device_id, token)
        log.info("matrix_login", method="access_token", device_id=who.device_id)
        return
    if saved.get("access_token") and saved.get("device_id") and saved.get("user_id") == client.user:
        client.restore_login(saved["user_id"], saved["device_id"], saved["access_token"])
        who = await client.whoami()
        if isinstance(who, WhoamiResponse):
            log.info("matrix_login", method="restored", device_id=saved["device_id"])
            return
        log.warning("matrix_saved_login_rejected", device_id=saved["device_id"])
        client.device_id = saved["device_id"]  # log in again on the same device
    if not settings.MATRIX_PASSWORD:
        raise MatrixLoginError("set MATRIX_PASSWORD or MATRIX_ACCESS_TOKEN")
    resp = await client.login(
        settings.MATRIX_PASSWORD.get_secret_value(), device_name=settings.MATRIX_DEVICE_NAME
    )
    if not isinstance(resp, LoginResponse):
        raise MatrixLoginError(f"login failed: {getattr(resp, 'message', resp)}")
    creds_path.write_text(
        json.dumps({"user_id": resp.user_id, "device_id": resp.device_id, "access_token": resp.access_token})
    )
    os.chmod(creds_path, 0o600)
    log.info("matrix_login", method="password", device_id=resp.device_id)


async def send(
    client: AsyncClient, room_id: str, content: dict[str, Any], *, attempts: int = 5
) -> str | None:
    """A new message (never an edit: see `handling`), waiting out M_LIMIT_EXCEEDED
    (retry_after_ms) a few times, under one transaction id; the event id or None."""
    txn_id = _next_txn_id()
    for _ in range(attempts):
        event_id, retry_after_ms = await try_send_once(client, room_id, content, txn_id=txn_id)
        if retry_after_ms is None:
            return event_id
        log.info("matrix_rate_limited", retry_after_s=retry_after_ms / 1000)
        await asyncio.sleep(min(retry_after_ms / 1000, 30))
    return None


async def try_send_once(
    client: AsyncClient, room_id: str, content: dict[str, Any], *, txn_id: str | None = None
) -> tuple[str | None, int | None]:
    """One attempt: (event id, None) or (None, retry_after_ms if rate limited else None)."""
    resp = await client.room_send(
        room_id, "m.room.message", content, tx_id=txn_id, ignore_unverified_devices=True
    )
    if isinstance(resp, RoomSendResponse):
        return str(resp.event_id), None
    if isinstance(resp, RoomSendError) and resp.status_code == "M_LIMIT_EXCEEDED":
        return None, int(resp.retry_after_ms or 1000)
    log.error("matrix_send_failed", room_id=room_id, error=getattr(resp, "status_code", type(resp).__name__))
    return None, None
