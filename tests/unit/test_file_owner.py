"""Whose file a turn may use (vagent_bot.access.file_owner): the requester's own only."""

from __future__ import annotations

import pytest

from vagent_bot.access.file_owner import file_use

BOT = "@vagent:example.org"
ALICE = "@alice:example.org"


def test_the_requesters_own_file_is_used() -> None:
    assert file_use(ALICE, ALICE, BOT) == "use"


def test_a_file_the_bot_posted_is_not_read_back() -> None:
    assert file_use(BOT, ALICE, BOT) == "ignore"


@pytest.mark.parametrize(
    "sender",
    [
        "@bob:example.org",  # a colleague's file: the finding
        "@alice:example.org.evil",  # look-alikes of the requester
        "@alice:example.org:8448",
        "@Alice:example.org",  # user ids are compared exactly
        " @alice:example.org",
        "@alice:example.org\u200b",
        "@alic:example.org",
        "@vagent:example.org.evil",  # ... and of the bot: not ignored, refused
    ],
)
def test_anyone_elses_file_is_refused(sender: str) -> None:
    assert file_use(sender, ALICE, BOT) == "refuse"


@pytest.mark.parametrize("sender", [None, "", 42, ["@alice:example.org"], {"id": ALICE}])
def test_a_sender_that_cannot_be_told_is_someone_else(sender: object) -> None:
    assert file_use(sender, ALICE, BOT) == "refuse"
