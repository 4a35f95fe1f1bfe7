"""`make chat` against a real Synapse: a stored login the homeserver no longer knows (a fresh
Synapse, another VAGENT_DATA_DIR) means logging in again with the password, saying so, instead
of dying with `RoomCreateError: M_UNKNOWN_TOKEN`; when that fails too, one line says how to
recover and the chat exits non-zero without a traceback; a homeserver that goes away and comes
back is one line each."""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from synapse_local import SynapseServer
from tests.support.tcp_proxy import RoundRobinProxy
from vagent_dev.chat import Chat, Session, Transcript
from vagent_dev.chat_hints import relogged_in

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent


def new_user(synapse: SynapseServer) -> tuple[str, str]:
    password = secrets.token_hex(8)
    return synapse.register_user(f"chat-{secrets.token_hex(4)}", password), password


async def logged_in_then_forgotten(
    synapse: SynapseServer, store: Path, user: str, password: str
) -> dict[str, str]:
    """A store with a login the homeserver then forgets (its token logged out): what a chat
    store looks like to a fresh Synapse."""
    first = Session(
        Namespace(homeserver=synapse.url, user=user, password=password), store, Transcript(io.StringIO())
    )
    try:
        await first.start()
    finally:
        await first.close()
    old: dict[str, str] = json.loads((store / "credentials.json").read_text())
    assert (store / f"{user}_{old['device_id']}.db").exists()
    async with httpx.AsyncClient() as http:
        resp = await http.post(
            f"{synapse.url}/_matrix/client/v3/logout",
            headers={"Authorization": f"Bearer {old['access_token']}"},
        )
    assert resp.status_code == 200, resp.text
    return old


async def test_a_refused_stored_login_logs_in_again_as_a_new_device(
    synapse: SynapseServer, tmp_path: Path
) -> None:
    user, password = new_user(synapse)
    store = tmp_path / "store"
    store.mkdir()
    old = await logged_in_then_forgotten(synapse, store, user, password)

    out = io.StringIO()
    session = Session(Namespace(homeserver=synapse.url, user=user, password=password), store, Transcript(out))
    try:
        await session.start()
        joined = await session.client.joined_rooms()  # the new login works
        assert hasattr(joined, "rooms"), joined
    finally:
        await session.close()
    assert relogged_in(user) in out.getvalue()
    new = json.loads((store / "credentials.json").read_text())
    assert new["device_id"] != old["device_id"] and new["access_token"] != old["access_token"]
    assert not (store / f"{user}_{old['device_id']}.db").exists()  # the stale crypto store is gone


async def test_when_logging_in_again_fails_too_one_line_says_how_to_recover(
    synapse: SynapseServer, tmp_path: Path
) -> None:
    user, password = new_user(synapse)
    chat_store = tmp_path / "chat"
    store = chat_store / user.strip("@").replace(":", "_")
    store.mkdir(parents=True)
    await logged_in_then_forgotten(synapse, store, user, password)
    env = {
        **os.environ,
        "CHAT_HOMESERVER": synapse.url,
        "CHAT_USER": user,
        "CHAT_PASSWORD": "not-" + password,
        "CHAT_STORE": str(chat_store),
        "PYTHONWARNINGS": "always",
    }
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "vagent-chat")],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    errors = proc.stderr.strip()
    assert "Traceback" not in errors and "Unclosed" not in errors, errors
    assert "\n" not in errors and errors.startswith(f"chat: login as {user} on {synapse.url} failed"), errors
    assert f"delete {store}" in errors, errors


async def wait_until(condition: Callable[[], bool], what: str, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_the_homeserver_going_away_and_coming_back_is_one_line_each(
    synapse: SynapseServer, tmp_path: Path
) -> None:
    user, password = new_user(synapse)
    proxy = RoundRobinProxy([("127.0.0.1", synapse.port)]).start()
    port = proxy.port
    out = io.StringIO()
    transcript = Transcript(out)
    session = Session(Namespace(homeserver=proxy.url, user=user, password=password), tmp_path, transcript)
    back: RoundRobinProxy | None = None
    sync: asyncio.Task[None] | None = None
    try:
        await session.start()
        sync = asyncio.create_task(
            session.sync_forever(Chat(session.client, "@vagent:localhost", transcript))
        )
        await asyncio.to_thread(proxy.stop)
        await wait_until(
            lambda: "unreachable" in out.getvalue(), f"no line about the homeserver:\n{out.getvalue()}"
        )
        assert f"homeserver {proxy.url} is unreachable; retrying…" in out.getvalue()
        back = RoundRobinProxy([("127.0.0.1", synapse.port)])
        back.port = port
        back.start()
        await wait_until(lambda: "homeserver is back" in out.getvalue(), f"not back:\n{out.getvalue()}")
        assert out.getvalue().count("unreachable") == 1 and not sync.done()
    finally:
        if sync is not None:
            sync.cancel()
        await session.close()
        if back is not None:
            await asyncio.to_thread(back.stop)
