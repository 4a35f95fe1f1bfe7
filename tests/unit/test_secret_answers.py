"""An answer to a pending question that looks like a secret never leaves the bot: the pure
decision (`check_answer`, `loggable`), and `Questions` refusing such an answer with one
warning, the question still pending, nothing sent and nothing logged. (Through Matrix, the
graph, the LLM and Redis: tests/e2e/test_secret_answers_e2e.py.)"""

from __future__ import annotations

import json
import secrets
from types import SimpleNamespace
from typing import Any, cast

import pytest

from vagent_bot.conversation.questions import (
    REFUSED_NOTICE,
    WITHHELD,
    AnswerCheck,
    Questions,
    check_answer,
    loggable,
)
from vagent_bot.conversation.routing import IncomingMessage
from vagent_bot.observability import metrics
from vagent_shared.access import AcContext
from vagent_shared.access_provider import AccessResult
from vagent_shared.hitl import YES_NO, PendingQuestion
from vagent_shared.logs import configure_logging
from vagent_shared.session import SessionId

ALICE, BOB = "@alice:localhost", "@bob:localhost"
ROOM = "!dm:localhost"
SID = SessionId(room_id=ROOM, user_id=ALICE).format()

KEYS = [
    "dev-tickets-key-alice-" + secrets.token_hex(8),
    "sk-proj-" + secrets.token_urlsafe(24),
    "ghp_" + secrets.token_hex(18),
    "AKIAIOSFODNN7EXAMPLE",
    "Bearer " + secrets.token_urlsafe(16),
    "my password is Tr0ub4dor&3",
    "password: hunter2hunter2",
    "here it is: dsX4mwYHSC6JSOUSGeIuwVWncPRCB-Zc",  # once missed by an early rule
    "here it is: Q9x_T2vL8mZr4KpW7sYd1NhB",
    "postgres://svc:" + secrets.token_hex(6) + "@db.internal/app",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJlX2hlcmU",
]
HARMLESS = [
    "the blue one",
    "Use the staging cluster staging-eu-west-1",
    "ticket T-1042 please",
    "550e8400-e29b-41d4-a716-446655440000",  # a UUID
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",  # a commit hash
    "https://example.org/docs/getting-started",
    "2024-01-01T10:00:00Z",
    "I don't have a key, sorry",
]


@pytest.mark.parametrize("key", KEYS)
def test_a_secret_is_refused_whatever_the_question(key: str) -> None:
    for options in ([], list(YES_NO), ["production", "staging"]):
        assert check_answer(key, options) == AnswerCheck("secret")
    assert check_answer(f"  {key}\n", []) == AnswerCheck("secret")
    assert loggable(key) == WITHHELD
    assert loggable(f"here: {key} thanks") == WITHHELD


@pytest.mark.parametrize("text", HARMLESS)
def test_ordinary_answers_pass(text: str) -> None:
    assert check_answer(text, []) == AnswerCheck("answer", text)
    assert check_answer(text, list(YES_NO)) == AnswerCheck("invalid")
    assert loggable(text) == text


@pytest.mark.parametrize(("text", "answer"), [("yes", "yes"), ("No!", "no"), ("👍", "yes"), ("n", "no")])
def test_yes_no_answers_still_normalise(text: str, answer: str) -> None:
    assert check_answer(text, list(YES_NO)) == AnswerCheck("answer", answer)
    assert check_answer(text.upper(), ["Yes", "No"]).kind == "answer"


def test_a_question_that_asks_for_a_key_refuses_any_key_like_word() -> None:
    """A random-looking word with no telling shape passes as an answer to "which build?", but
    not to a question asking for a key or password."""
    word = "v7Kq2pX9mLr4"
    assert check_answer(word, [], "Which build do you mean?") == AnswerCheck("answer", word)
    for question in ("Please paste your API key.", "What is the password?", "Your access token?"):
        assert check_answer(word, [], question) == AnswerCheck("secret")
        assert check_answer(f"sure, it is {word}", [], question) == AnswerCheck("secret")
        assert check_answer("I don't have one", [], question).kind == "answer"
        assert check_answer("550e8400-e29b-41d4-a716-446655440000", [], question).kind == "answer"


def test_options_and_blank_answers() -> None:
    assert check_answer("Staging", ["production", "staging"]) == AnswerCheck("answer", "staging")
    assert check_answer("   ", []) == AnswerCheck("invalid")
    assert check_answer("", list(YES_NO)) == AnswerCheck("invalid")


# --------------------------------------------------------------------------- Questions


class FakeHitl:
    """The pending question in memory, as HitlStore keeps it in Redis."""

    def __init__(self, pending: PendingQuestion) -> None:
        self.pending: PendingQuestion | None = pending
        self.consumed = 0

    async def peek(self, session_id: str) -> PendingQuestion | None:
        return self.pending if self.pending and self.pending.session_id == session_id else None

    async def consume(self, session_id: str) -> PendingQuestion | None:
        self.consumed += 1
        taken, self.pending = self.pending, None
        return taken


class FakeGraph:
    def __init__(self) -> None:
        self.feedback: list[Any] = []

    async def submit_feedback(self, req: Any) -> Any:
        self.feedback.append(req)
        raise AssertionError("not streamed in this test")


class FakeAnswer:
    def __init__(self, sent: list[tuple[str | None, str | None, str]], thread: str | None, reply: str | None):
        self.sent, self.thread_root, self.reply_to = sent, thread, reply

    async def notice(self, text: str) -> str:
        self.sent.append((self.thread_root, self.reply_to, text))
        return f"$notice{len(self.sent)}"


class Harness:
    """`Questions` wired to in-memory fakes; `allowed` decides the access check."""

    def __init__(self, options: list[str], allowed: bool = True) -> None:
        self.pending = PendingQuestion(
            session_id=SID,
            room_id=ROOM,
            user_id=ALICE,
            question="Please paste your API key for the ticket service.",
            options=options,
            interrupt_id="interrupt-1",
            question_event_id="$question",
            thread_root="$root",
        )
        self.hitl, self.graph = FakeHitl(self.pending), FakeGraph()
        self.sent: list[tuple[str | None, str | None, str]] = []
        self.conversed: list[tuple[str, Any]] = []
        self.access_checks = 0
        ac = AcContext(user_id=ALICE, active_acl_domain="localhost", active_roles=[], roles={})
        self.access = AccessResult(True, "granted", ac) if allowed else None

        async def check_access(_room: str, _user: str) -> AccessResult | None:
            self.access_checks += 1
            return self.access

        async def resolve_audience(_room: str, _user: str) -> None:
            return None

        async def audience_unchecked(_room: str) -> bool:
            return False

        async def converse(sid: SessionId, answer: Any, open_stream: Any, sent_at: float) -> None:
            self.conversed.append((sid.format(), answer))

        self.questions = Questions(
            cast(Any, self.hitl),
            cast(Any, self.graph),
            cast(Any, None),
            cast(
                Any,
                SimpleNamespace(
                    check_access=check_access,
                    resolve_audience=resolve_audience,
                    audience_unchecked=audience_unchecked,
                    new_answer=lambda _room, thread, reply: cast(Any, FakeAnswer(self.sent, thread, reply)),
                    converse=converse,
                ),
            ),
        )

    async def answer(self, text: str, addressed: bool = True, event_id: str = "$answer") -> None:
        msg = IncomingMessage(event_id=event_id, sender=ALICE, room_id=ROOM, body=text, msgtype="m.text")
        assert self.hitl.pending is not None
        await self.questions.answer_pending(msg, self.hitl.pending, text, addressed=addressed)


def refused() -> float:
    return float(metrics.HITL.labels("secret_refused")._value.get())


def json_logs(out: str) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]


@pytest.mark.parametrize("options", [[], list(YES_NO)], ids=["free_text", "yes_no"])
async def test_a_secret_answer_is_refused_with_one_warning_and_the_question_stays(
    options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("DEBUG", service="test")
    key = "dev-tickets-key-alice-" + secrets.token_hex(8)
    h = Harness(options)
    before = refused()

    await h.answer(key, event_id="$secret")

    assert h.sent == [("$root", "$secret", REFUSED_NOTICE)]  # in the question's thread
    assert key not in REFUSED_NOTICE and "Please answer" not in REFUSED_NOTICE
    assert refused() == before + 1
    assert h.hitl.pending == h.pending and h.hitl.consumed == 0  # still pending
    assert h.graph.feedback == [] and h.conversed == []
    out = capsys.readouterr().out
    assert key not in out
    events = [ln for ln in json_logs(out) if ln.get("event") == "hitl_secret_refused"]
    assert len(events) == 1 and events[0]["level"] == "warning"
    assert {"session_id": SID, "user_id": ALICE, "chars": len(key)}.items() <= events[0].items()

    harmless = "yes" if options else "I don't have one yet"
    await h.answer(harmless, event_id="$second")  # the user may answer again
    assert h.hitl.consumed == 1 and h.hitl.pending is None
    assert [sid for sid, _ in h.conversed] == [SID]
    assert len(h.sent) == 1 and refused() == before + 1
    answered = [ln for ln in json_logs(capsys.readouterr().out) if ln.get("event") == "hitl_answered"]
    assert len(answered) == 1
    if options:
        assert answered[0]["answer"] == "yes"
    else:  # free text is logged by its length only
        assert "answer" not in answered[0] and answered[0]["answer_chars"] == len(harmless)


async def test_a_denied_user_gets_no_warning() -> None:
    """Layer 1 first: someone who may not use the agent learns nothing, not even this."""
    h = Harness([], allowed=False)
    before = refused()
    await h.answer("sk-proj-" + secrets.token_urlsafe(24))
    assert h.sent == [] and h.access_checks == 1 and refused() == before
    assert h.hitl.pending == h.pending and h.conversed == []


async def test_group_chatter_with_a_secret_is_ignored_silently() -> None:
    """Not addressed to the bot (a group room, outside the question's thread): no answer
    attempt, so no warning either, and nothing is passed on."""
    h = Harness(list(YES_NO))
    before = refused()
    await h.answer("ghp_" + secrets.token_hex(18), addressed=False)
    assert h.sent == [] and h.access_checks == 0 and refused() == before
    assert h.hitl.pending == h.pending and h.conversed == []


async def test_the_invalid_answer_reask_is_unchanged() -> None:
    h = Harness(list(YES_NO))
    await h.answer("maybe later")
    assert [text for _, _, text in h.sent] == [
        "Please answer yes or no. ❓ Please paste your API key for the ticket service. (yes/no)"
    ]
    assert h.hitl.pending == h.pending
