"""Whose file may a turn use: only the requester's own.

A message can point at a file that is not in it: a rich reply names the event it answers, a
thread can be started on a file. Those event ids are clear text even in an encrypted room,
and the bot holds the key of every file sent while it was there. Without this rule, Bob, who
joined after Alice posted `salaries.pdf` and holds no key for it, could reply `!ai summarise`
to it: the bot would read it to him and keep it in his conversation, where forgetting Alice
does not reach. So a file goes only into a turn of the person who sent it
(docs/attachments.md, "Whose files"). Pure: `turn_files` asks before anything is downloaded.
"""

from __future__ import annotations

from typing import Literal

#: `use`: the requester's own file. `ignore`: one the bot posted (not read back: it would go
#: to whoever replies to it). `refuse`: anyone else's: the turn ends with NOT_YOURS.
FileUse = Literal["use", "ignore", "refuse"]

NOT_YOURS = "I can only read files you sent yourself."


def file_use(file_sender: object, requester: str, bot_user_id: str) -> FileUse:
    """May a file sent by `file_sender` (the `sender` of its event, as the homeserver gave it)
    go into `requester`'s turn? Exact ids only: a look-alike, another case, or a sender that
    is missing or not a string is someone else."""
    if not isinstance(file_sender, str) or not file_sender:
        return "refuse"
    if file_sender == requester:
        return "use"
    if file_sender == bot_user_id:
        return "ignore"
    return "refuse"
