"""The Matrix test infrastructure itself: local Synapse + HumanClient, plain and encrypted DMs.

If these fail, every bot end-to-end test would fail for reasons unrelated to the bot.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from synapse_local import SynapseServer, homeserver_config
from tests.support.matrix_human import Event, HumanClient, new_human

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "synapse_local.py"


@pytest.fixture
async def pair(synapse: SynapseServer, tmp_path: Path) -> AsyncIterator[tuple[HumanClient, HumanClient]]:
    alice = await new_human(synapse, "alice", tmp_path)
    bob = await new_human(synapse, "bob", tmp_path)
    try:
        yield alice, bob
    finally:
        await alice.close()
        await bob.close()


def reaction_to(event_id: str, key: str) -> Callable[[Event], bool]:
    def match(e: Event) -> bool:
        rel = e.relates_to
        return e.type == "m.reaction" and rel.get("event_id") == event_id and rel.get("key") == key

    return match


async def test_dm_thread_reaction_edit(pair: tuple[HumanClient, HumanClient]) -> None:
    alice, bob = pair
    room = await alice.create_dm(bob.user_id)
    await bob.wait_joined(room, bob.user_id)
    assert room.startswith("!")

    root = await alice.send(room, "root message", mentions=[bob.user_id])
    in_thread = await alice.send(room, "in the thread", thread_root=root)
    reply = await alice.send(room, "a real reply in the thread", thread_root=root, reply_to=in_thread)
    reaction = await alice.react(room, root, "👍")

    got = await bob.wait_for_reply(alice.user_id, room, lambda m: m.event_id == reply)
    assert (got.thread_root, got.in_reply_to, got.is_falling_back) == (root, in_thread, False)
    msgs = {m.event_id: m for m in await bob.messages_from(alice.user_id, room)}
    assert msgs[root].body.startswith(bob.user_id)
    assert msgs[root].content["m.mentions"] == {"user_ids": [bob.user_id]}
    assert (msgs[root].thread_root, msgs[root].in_reply_to) == (None, None)
    fallback = msgs[in_thread]
    assert (fallback.thread_root, fallback.in_reply_to, fallback.is_falling_back) == (root, root, True)
    seen = await bob.wait_for(reaction_to(root, "👍"))
    assert seen.event_id == reaction and seen.sender == alice.user_id

    # an edit, sent raw the way any client does it
    resp = await alice.client.room_send(
        room,
        "m.room.message",
        {
            "msgtype": "m.text",
            "body": "* root message, edited",
            "m.new_content": {"msgtype": "m.text", "body": "root message, edited"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": root},
        },
    )
    assert resp.event_id
    edited = await bob.wait_for_reply(alice.user_id, room, lambda m: m.edits == 1)
    assert (edited.event_id, edited.body) == (root, "root message, edited")
    assert len(await bob.messages_from(alice.user_id, room)) == 3  # the edit is not a message
    assert not bob.typing_seen_from(alice.user_id, room)
    await bob.assert_no_message_from(alice.user_id, room, within=0.3)
    await alice.client.room_typing(room, True, timeout=5000)
    await bob.wait_typing_from(alice.user_id, room, timeout=5)


async def test_encrypted_dm(pair: tuple[HumanClient, HumanClient]) -> None:
    alice, bob = pair
    room = await alice.create_dm(bob.user_id, encrypted=True)
    await bob.wait_joined(room, bob.user_id)
    assert alice.client.rooms[room].encrypted

    secret = f"secret {secrets.token_hex(4)}"
    first = await alice.send(room, secret)
    got = await bob.wait_for_reply(alice.user_id, room, lambda m: m.event_id == first)
    assert got.body == secret
    assert any(e.event_id == first and e.encrypted for e in bob.events)

    threaded = await alice.send(room, "encrypted thread", thread_root=first)
    await alice.react(room, first, "✅")
    await alice.edit(room, first, "secret, edited")
    got = await bob.wait_for_reply(alice.user_id, room, lambda m: m.event_id == threaded)
    assert got.thread_root == first  # m.relates_to travels in clear and survives decryption
    reaction = await bob.wait_for(reaction_to(first, "✅"))
    assert reaction.encrypted
    edited = await bob.wait_for_reply(alice.user_id, room, lambda m: m.edits == 1)
    assert edited.body == "secret, edited"

    # and the other way round, bob's device had to be found by alice
    back = await bob.send(room, "got it")
    got = await alice.wait_for_reply(bob.user_id, room, lambda m: m.event_id == back)
    assert got.body == "got it"


def test_config_builder_and_cli(tmp_path: Path) -> None:
    config = homeserver_config(
        9999,
        tmp_path,
        "example.test",
        dict.fromkeys(("registration_shared_secret", "macaroon_secret_key", "form_secret"), "x"),
    )
    assert config["listeners"][0]["bind_addresses"] == ["127.0.0.1"]
    assert config["rc_message"]["per_second"] >= 1000
    assert config["caches"]["sync_response_cache_duration"] == 0
    cli = subprocess.run(
        [sys.executable, str(SCRIPT), "--port", "9999", "--dir", str(tmp_path / "cli"), "--print-config"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    written = yaml.safe_load(cli.stdout)
    assert written["listeners"][0]["port"] == 9999 and written["bcrypt_rounds"] == 12
    assert (tmp_path / "cli" / "secrets.json").exists()


def test_register_exists_ok(synapse: SynapseServer) -> None:
    name = f"carol-{secrets.token_hex(4)}"
    user_id = synapse.register_user(name, "pw-1")
    assert user_id == f"@{name}:localhost"
    assert synapse.register_user(name, "pw-1") == user_id  # exists ok
    with pytest.raises(ValueError, match="different password"):
        synapse.register_user(name, "pw-2")


async def test_relogin_same_store(pair: tuple[HumanClient, HumanClient], synapse: SynapseServer) -> None:
    alice, bob = pair
    room = await alice.create_dm(bob.user_id, encrypted=True)
    before = await alice.send(room, "before")
    await bob.wait_for_reply(alice.user_id, room, lambda m: m.event_id == before)
    device = bob.client.device_id
    await bob.close()
    away = await alice.send(room, "while away")
    assert bob.password is not None
    bob2 = await HumanClient.login(synapse.url, bob.user_id, bob.password, bob.store_dir)
    try:
        assert bob2.client.device_id == device
        await bob2.start_sync()
        got = await bob2.wait_for_reply(alice.user_id, room, lambda m: m.event_id == away)
        assert got.body == "while away"  # same device, same olm store: still decrypts
        assert before not in {e.event_id for e in bob2.events}  # resumed from its token, no replay
    finally:
        await bob2.close()
