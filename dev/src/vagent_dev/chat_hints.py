"""The decisions of `make chat` (`vagent-chat`) that a newcomer notices, without a Matrix client:
what a typed line is sent as, when to say that no reply came, when the homeserver is down or
back, and when a stored login must be replaced. chat.py does the I/O around them.

Why they exist: a silent bot (by design, for people without access), a homeserver that is down
and a login the homeserver no longer knows all looked the same in the terminal: nothing at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vagent_shared.settings import BotSettings

#: The bot's own group-room prefix (the bot's COMMAND_PREFIX setting, read from the same name).
DEFAULT_PREFIX: str = BotSettings.model_fields["COMMAND_PREFIX"].default
DEFAULT_SILENCE_HINT_SECONDS = 15.0
SILENCE_HINT = (
    "(no reply: the bot stays silent for people without access, by design — see the README's Quick start)"
)
#: The Matrix error of an access token the homeserver does not know (logged out, or another homeserver).
UNKNOWN_TOKEN = "M_UNKNOWN_TOKEN"  # noqa: S105 (an error code, not a secret)


def address_bot(text: str, prefix: str = DEFAULT_PREFIX) -> str:
    """What a typed line is sent as in a group room, where the bot answers only when addressed:
    the prefix in front unless it is already there. The bot strips the prefix and then reads
    its commands (`!ai !help`, `!ai !reset`), so commands get the prefix like any question."""
    stripped = text.strip()
    prefix = prefix.strip()
    if not stripped or not prefix:
        return stripped
    head = stripped[: len(prefix)]
    rest = stripped[len(prefix) :]
    if head.lower() == prefix.lower() and (not rest or rest[0].isspace()):
        return stripped  # "!ai what is ..." is addressed already ("!aiden" is not)
    return f"{prefix} {stripped}"


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where `make run` and `make chat` keep what they write (VAGENT_DATA_DIR, default `.data`)."""
    return Path((os.environ if env is None else env).get("VAGENT_DATA_DIR") or ".data")


def silence_hint_seconds(env: Mapping[str, str] | None = None) -> float:
    """CHAT_SILENCE_HINT_SECONDS (default 15; 0 turns the hint off; nonsense: the default)."""
    raw = (os.environ if env is None else env).get("CHAT_SILENCE_HINT_SECONDS", "").strip()
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_SILENCE_HINT_SECONDS
    return value if value >= 0 else DEFAULT_SILENCE_HINT_SECONDS


@dataclass
class SilenceWatch:
    """Whether the line "(no reply: ...)" is due: once per message the person sent, when the bot
    neither wrote nor typed anything in `after` seconds. The clock is the caller's (tests pass
    numbers)."""

    after: float = DEFAULT_SILENCE_HINT_SECONDS
    #: When the oldest message still without a reply was sent; None: nothing is waiting.
    waiting_since: float | None = field(default=None, init=False)

    def sent(self, now: float) -> None:
        """The person sent something; a message already waiting keeps its own start."""
        if self.waiting_since is None:
            self.waiting_since = now

    def bot_spoke(self) -> None:
        """The bot wrote or started typing: whatever was waiting got its reply."""
        self.waiting_since = None

    def due(self, now: float) -> bool:
        """True once, when a message has waited `after` seconds; 0 never says it."""
        if self.after <= 0 or self.waiting_since is None or now - self.waiting_since < self.after:
            return False
        self.waiting_since = None
        return True


@dataclass
class HomeserverStatus:
    """One line when the homeserver stops answering and one when it answers again, however
    many syncs fail in between."""

    url: str
    down: bool = False

    def failed(self) -> str | None:
        if self.down:
            return None
        self.down = True
        return f"homeserver {self.url} is unreachable; retrying…"

    def worked(self) -> str | None:
        if not self.down:
            return None
        self.down = False
        return "homeserver is back"


def token_refused(errcode: str | None) -> bool:
    """The stored access token is not known to the homeserver: log in again (a fresh Synapse,
    another VAGENT_DATA_DIR, a logout elsewhere); any other error is not fixed by that."""
    return errcode == UNKNOWN_TOKEN


def relogged_in(user_id: str) -> str:
    return f"Stored login was refused by the homeserver (new homeserver?); logged in again as {user_id}."


def login_failed(user_id: str, reason: str, homeserver: str, store: Path) -> str:
    """One line on what failed and what to do about it."""
    return (
        f"chat: login as {user_id} on {homeserver} failed: {reason}. "
        "Is `make run` running (with the same VAGENT_DATA_DIR), and are CHAT_USER and "
        f"CHAT_PASSWORD right? To start over, delete {store}."
    )


def why_note(event_id: str) -> str:
    """What `/why` says it did, with the event id `vagent trace show` takes."""
    return f"🔍 asked about {event_id} (vagent trace show '{event_id}')"
