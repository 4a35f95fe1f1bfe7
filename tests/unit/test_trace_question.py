"""Which question a turn answered: what a TurnTrace keeps of the user's message (one line, at
most 80 characters, never a secret), and how `vagent trace list` / `show` print it."""

from __future__ import annotations

import pytest

from tests.support.factories import ac
from vagent_graph.cli.output import header
from vagent_graph.cli.trace import COLUMNS, describe, table_row
from vagent_graph.observability.recorder import TurnRecorder, new_trace
from vagent_shared.traces import QUESTION_CHARS, TurnTrace, question_line

ALICE = "@alice:localhost"
KEY = "sk-proj-" + "Q7v2Lx9Rk4Tz8Wm3Pn6Hs1Jd5Fb0Gc"


def trace(question: str) -> TurnTrace:
    return TurnTrace(
        turn_id="b" * 32, session_id=f"!r:localhost:main:{ALICE}", user_id=ALICE, question=question
    )


def test_a_short_question_is_kept_as_written_on_one_line() -> None:
    assert question_line("What was the Q3 revenue?") == "What was the Q3 revenue?"
    assert (
        question_line("  what is\non my\t\tcalendar\r\n this week? ") == "what is on my calendar this week?"
    )
    assert question_line("") == question_line(" \n ") == ""


def test_a_long_message_keeps_its_first_80_characters() -> None:
    long = "Please summarise " + "the quarterly report " * 800  # 16 000+ characters
    kept = question_line(long)
    assert len(kept) == QUESTION_CHARS == 80 and long.startswith(kept)


@pytest.mark.parametrize(
    "message",
    [
        f"my api key is {KEY}, can you store it",
        "use password: Hunter2-Hunter2 for the share",
        "my password is Tr0ub4dor&3 please remember",
        f"{'pad ' * 17}{KEY}",  # the key straddles the cut at 80 characters
        "token=ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        "connect to postgres://admin:s3cr3t-pw@db.internal/app please",
    ],
)
def test_secret_looking_parts_never_reach_the_trace(message: str) -> None:
    kept = question_line(message)
    assert "[REDACTED]" in kept
    for secret in (KEY, KEY[:20], "Hunter2-Hunter2", "Tr0ub4dor&3", "ghp_a1B2", "s3cr3t-pw"):
        assert secret not in kept
    assert len(kept) <= QUESTION_CHARS


def test_the_words_around_a_secret_stay_readable() -> None:
    assert (
        question_line(f"my api key is {KEY}, can you store it")
        == "my api key is [REDACTED], can you store it"
    )


def test_a_new_turn_records_its_question_and_a_resume_keeps_it() -> None:
    who = ac(ALICE, [], domain="localhost")
    t = new_trace("s", who, None, f"delete old records\nkey {KEY}")
    assert t.question == "delete old records key [REDACTED]"
    assert new_trace("s", who, None).question == ""  # a resume whose trace is gone: not the answer
    assert new_trace("s", who, None, "", ["report.pdf", "notes.docx"]).question == "[report.pdf] [notes.docx]"
    assert new_trace("s", who, None, "what is this?", ["report.pdf"]).question == "what is this?"
    resumed = TurnRecorder.resumed(TurnTrace.model_validate_json(t.model_dump_json())).finish("answered")
    assert resumed.question == t.question


def test_trace_list_ends_each_row_with_the_question_cut_to_its_column() -> None:
    assert header(COLUMNS).split()[-1] == "QUESTION" and COLUMNS[-1] == ("QUESTION", 40)
    short = table_row(trace("what is on my calendar this week?"))
    assert short.endswith("  what is on my calendar this week?")
    long = table_row(trace("How many records are older than 2019 in the records database of acme?"))
    assert long.endswith("  How many records are older than 2019 in…")
    assert table_row(trace("")).endswith("  -")  # stored by an older version
    assert table_row(trace("clear \x1b[2J the screen")).endswith("clear ?[2J the screen")
    titles = header(COLUMNS)
    assert short.index("what is on my") == titles.index("QUESTION")  # under its title


def test_trace_show_prints_the_question() -> None:
    lines = describe(trace("what is the outlook?"))
    assert lines[2] == "  question 'what is the outlook?'"
    assert describe(trace(""))[2] == "  question not recorded"
    assert "\x1b" not in "\n".join(describe(trace("a \x1b[31m red")))


def test_the_question_is_in_the_json_and_an_older_trace_reads_without_it() -> None:
    assert '"question":"what is the outlook?"' in trace("what is the outlook?").model_dump_json()
    old = trace("x").model_dump(mode="json")
    del old["question"]
    assert TurnTrace.model_validate(old).question == ""
