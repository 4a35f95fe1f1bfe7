#!/usr/bin/env python3
"""The floor for `bench_bot.py`: the least a Matrix bot can do, with the same matrix-nio.

It logs in (unencrypted, no store), joins every room it is invited to, and answers each
text message of another user with the same text as a rich reply, the moment its sync
returns it. No Redis, no access check, no LLM, no edits: what remains is Synapse, the
sync long-poll and one send. The vagent bot runs as a separate process, so this runs as
one too (same interpreter, same library, its own event loop and GIL).

    python bench/echo_bot.py --homeserver URL --user @echo:localhost --ready-file PATH
    (password in $ECHO_BOT_PASSWORD, so it never shows in `ps`)

It writes `--ready-file` once its first sync is done (history before that is never
answered), exits on SIGTERM/SIGINT, and exits by itself when its parent process goes
away, so a killed benchmark leaves nothing behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import nio

#: A big timeline so a burst is never cut to Synapse's default of 10 events per sync;
#: nothing the bot does not need (presence, typing, receipts, account data).
SYNC_FILTER: dict[str, Any] = {
    "room": {
        "timeline": {"limit": 500},
        "state": {"lazy_load_members": True},
        "ephemeral": {"not_types": ["*"]},
        "account_data": {"not_types": ["*"]},
    },
    "presence": {"not_types": ["*"]},
    "account_data": {"not_types": ["*"]},
}


def reply_content(event_id: str, text: str) -> dict[str, Any]:
    """The echo: the same text as a rich reply (m.in_reply_to), like the vagent bot's answer."""
    return {
        "msgtype": "m.text",
        "body": text,
        "m.mentions": {},
        "m.relates_to": {"m.in_reply_to": {"event_id": event_id}},
    }


def to_echo(me: str, event: dict[str, Any]) -> str | None:
    """The text to echo for a raw timeline event, or None (own events, edits, non-text)."""
    if event.get("type") != "m.room.message" or event.get("sender") == me:
        return None
    content = event.get("content")
    if not isinstance(content, dict) or content.get("msgtype") != "m.text":
        return None
    rel = content.get("m.relates_to")
    if isinstance(rel, dict) and rel.get("rel_type") == "m.replace":
        return None
    body = content.get("body")
    return body if isinstance(body, str) else None


class EchoBot:
    """Sync, reply, repeat. Sends are awaited inline: one message per sync is the common case."""

    def __init__(self, client: nio.AsyncClient, sync_timeout_ms: int, parent_pid: int | None) -> None:
        self.client = client
        self.sync_timeout_ms = sync_timeout_ms
        self.parent_pid = parent_pid
        self.replies = 0

    async def first_sync(self) -> None:
        """Join pending invites and take the sync token: older messages are not answered."""
        resp = await self.client.sync(timeout=0, sync_filter=SYNC_FILTER, full_state=True)
        if not isinstance(resp, nio.SyncResponse):
            raise RuntimeError(f"first sync failed: {resp}")
        await self._join(resp)

    async def run(self) -> None:
        """The sync loop; transient errors back off briefly instead of ending the floor."""
        failures = 0
        while self.parent_pid is None or os.getppid() == self.parent_pid:
            resp = await self.client.sync(timeout=self.sync_timeout_ms, sync_filter=SYNC_FILTER)
            if not isinstance(resp, nio.SyncResponse):
                failures += 1
                if failures > 20:
                    raise RuntimeError(f"sync keeps failing: {resp}")
                await asyncio.sleep(0.2)
                continue
            failures = 0
            await self._join(resp)
            for room_id, info in resp.rooms.join.items():
                for ev in info.timeline.events:
                    src = getattr(ev, "source", None)
                    if not isinstance(src, dict):
                        continue
                    text = to_echo(self.client.user_id, src)
                    if text is not None:
                        await self._reply(room_id, str(src["event_id"]), text)

    async def _reply(self, room_id: str, event_id: str, text: str) -> None:
        resp = await self.client.room_send(room_id, "m.room.message", reply_content(event_id, text))
        if isinstance(resp, nio.RoomSendResponse):
            self.replies += 1
        else:
            print(f"echo-bot: send to {room_id} failed: {resp}", file=sys.stderr, flush=True)

    async def _join(self, resp: nio.SyncResponse) -> None:
        for room_id in resp.rooms.invite:
            joined = await self.client.join(room_id)
            if not isinstance(joined, nio.JoinResponse):
                print(f"echo-bot: join {room_id} failed: {joined}", file=sys.stderr, flush=True)


async def amain(args: argparse.Namespace) -> int:
    """Log in, first sync, signal readiness, then echo until told to stop."""
    password = os.environ.get("ECHO_BOT_PASSWORD")
    if not password:
        print("echo-bot: set ECHO_BOT_PASSWORD", file=sys.stderr)
        return 2
    config = nio.AsyncClientConfig(
        encryption_enabled=False, store_sync_tokens=False, max_limit_exceeded=0, request_timeout=60
    )
    client = nio.AsyncClient(args.homeserver, args.user, config=config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        login = await client.login(password, device_name="bench echo bot")
        if not isinstance(login, nio.LoginResponse):
            print(f"echo-bot: login failed: {login}", file=sys.stderr)
            return 1
        bot = EchoBot(client, args.sync_timeout_ms, args.parent_pid)
        await bot.first_sync()
        if args.ready_file:
            await asyncio.to_thread(Path(args.ready_file).write_text, "ready\n")
        run = asyncio.create_task(bot.run())
        stop = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        for task in (run, stop):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if run in done and not run.cancelled() and run.exception() is not None:
            print(f"echo-bot: {run.exception()}", file=sys.stderr)
            return 1
        print(f"echo-bot: stopped after {bot.replies} replies", file=sys.stderr)
        return 0
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    """Command line; exit 0 on a clean stop."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--homeserver", required=True)
    p.add_argument("--user", required=True, help="full user id, e.g. @echo:localhost")
    p.add_argument("--ready-file", type=Path, help="written once the first sync is done")
    p.add_argument("--sync-timeout-ms", type=int, default=1000, help="long-poll timeout (default 1000)")
    p.add_argument("--parent-pid", type=int, help="exit when this process is no longer our parent")
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
