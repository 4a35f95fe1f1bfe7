"""Session ids: `{room_id}:{thread_id|main}:{user_id}`.

Both parts around the thread contain ':' (user ids always, room ids of older room
versions), so parsing anchors on the only unambiguous separators: the user id starts
at the LAST ':@' and the thread part is `main` or starts with '$'.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

MAIN_THREAD = "main"


class SessionId(BaseModel):
    """One conversation: a user in a room, in the main timeline or in one thread."""

    model_config = ConfigDict(frozen=True)

    room_id: str
    thread_id: str | None = None
    user_id: str

    @field_validator("room_id")
    @classmethod
    def _room(cls, v: str) -> str:
        if not v.startswith("!") or len(v) < 2 or any(c.isspace() for c in v) or "$" in v:
            raise ValueError(f"invalid room id {v!r}: must start with '!'")
        return v

    @field_validator("thread_id")
    @classmethod
    def _thread(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith("$") or len(v) < 2 or any(c.isspace() for c in v):
            raise ValueError(f"invalid thread id {v!r}: must be an event id starting with '$'")
        return v

    @field_validator("user_id")
    @classmethod
    def _user(cls, v: str) -> str:
        local, sep, server = v[1:].partition(":")
        if not v.startswith("@") or not sep or not local or not server or "@" in server:
            raise ValueError(f"invalid user id {v!r}: must look like @name:server")
        if any(c.isspace() for c in v):
            raise ValueError(f"invalid user id {v!r}: contains white space")
        return v

    def __str__(self) -> str:
        return self.format()

    def format(self) -> str:
        return f"{self.room_id}:{self.thread_id or MAIN_THREAD}:{self.user_id}"

    @classmethod
    def parse(cls, value: str) -> SessionId:
        """Parse a formatted session id; raises ValueError with a readable reason."""
        head, sep, user = value.rpartition(":@")
        if not sep:
            raise ValueError(f"invalid session id {value!r}: no ':@user' part")
        user_id = "@" + user
        if head.endswith(":" + MAIN_THREAD):
            room_id, thread_id = head[: -len(MAIN_THREAD) - 1], None
        else:
            room_id, sep, thread = head.partition(":$")
            if not sep:
                raise ValueError(f"invalid session id {value!r}: thread part must be 'main' or an event id")
            thread_id = "$" + thread
        return cls(room_id=room_id, thread_id=thread_id, user_id=user_id)

    @classmethod
    def is_valid(cls, value: str) -> bool:
        try:
            cls.parse(value)
        except ValueError:
            return False
        return True
