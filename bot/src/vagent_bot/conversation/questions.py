"""A human answers the agent's pending question, by message or by reaction to the question.

Only the asking user's answer counts, after the same access check as any message; the
question is taken from Redis exactly once (another process or a double click loses), and
the answer resumes the graph run, streamed like any other answer. The room's audience is
resolved afresh for the answer: people may have joined or left while the question waited.
The asking side (saving the question when the graph sends one) is part of relaying the
graph's answer (`conversation`).

An answer that looks like a secret (a password, key or token, or a random-looking word given
to a question that asked for one: `secret_answer`) is refused
before anything else: the graph's `ask_user` lets the model ask for anything, and an answer
would be checkpointed and sent to the model. The question stays pending (the user may answer
again), the user is warned once, and the text is never logged, stored or passed on.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import structlog

from vagent_bot.answers.question_message import question_message
from vagent_bot.answers.streaming import Answer
from vagent_bot.clients.graph_client import GraphClient
from vagent_bot.conversation.conversations import OpenStream
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_bot.conversation.routing import IncomingMessage
from vagent_bot.conversation.sessions import SessionWorkers
from vagent_bot.observability import metrics
from vagent_bot.observability.spans import answer_span, carried
from vagent_shared.access_provider import AccessResult
from vagent_shared.audit import Decision
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.hitl import PendingQuestion, normalize_answer, reaction_answer
from vagent_shared.knowledge import Audience
from vagent_shared.secrets import looks_like_secret, secret_answer
from vagent_shared.session import SessionId
from vagent_shared.wire import FeedbackRequest

log = structlog.get_logger(__name__)

#: What a log line shows instead of a text that looks like a secret.
WITHHELD: Final = "[withheld: looks like a secret]"
#: The one reply to an answer that looks like a secret (it never quotes the answer).
REFUSED_NOTICE: Final = (
    "🔒 That looks like a password, key or token, so I did not pass it on. Never share secrets "
    "here: answer without it, or say no. If it was a real one, change it now."
)


def loggable(text: str) -> str:
    """`text` as a log line may show it: withheld when it looks like a secret."""
    return WITHHELD if looks_like_secret(text) else text


@dataclass(frozen=True)
class AnswerCheck:
    """What a message means for a pending question. `kind`: `secret` (refused, the question
    stays pending), `invalid` (no option matches) or `answer` (`answer` is set: the option as
    spelled in the question, or the free text)."""

    kind: Literal["secret", "invalid", "answer"]
    answer: str | None = None


def check_answer(text: str, options: list[str] | tuple[str, ...], question: str = "") -> AnswerCheck:
    """The raw `text` is checked for a secret before it is normalised: a key sent to a yes/no
    question is refused as a secret, not re-asked as "please answer yes or no". `question`:
    what was asked (a question asking for a key makes any key-like word a secret)."""
    if secret_answer(text, question):
        return AnswerCheck("secret")
    answer = normalize_answer(text, options)
    return AnswerCheck("invalid") if answer is None else AnswerCheck("answer", answer)


class Turns(Protocol):
    """What an answer to a question shares with a new message: one turn of the conversation
    (`conversation.Conversations`), so both take the same way to the graph and back."""

    async def check_access(self, room_id: str, user_id: str) -> AccessResult | None: ...

    async def resolve_audience(self, room_id: str, sender: str) -> Audience | None: ...

    async def audience_unchecked(self, room_id: str) -> bool: ...

    def new_answer(self, room_id: str, thread_root: str | None, reply_to: str | None) -> Answer: ...

    async def converse(
        self, sid: SessionId, answer: Answer, open_stream: OpenStream, sent_at: float
    ) -> None: ...


class Questions:
    """Answers to the agent's pending questions; `turns` takes each one to the graph."""

    def __init__(
        self,
        hitl: HitlStore,
        graph: GraphClient,
        workers: SessionWorkers,
        turns: Turns,
        *,
        audit: AuditTrail | None = None,
    ) -> None:
        self.hitl, self.graph, self.workers, self.turns = hitl, graph, workers, turns
        self.audit = audit

    async def answer_pending(
        self,
        msg: IncomingMessage,
        pending: PendingQuestion,
        text: str,
        addressed: bool,
        early_access: asyncio.Future[AccessResult | None] | None = None,
        early_audience: asyncio.Future[Audience | None] | None = None,
    ) -> None:
        """`early_access`, `early_audience`: the access check and the audience already under
        way for this message, if any."""
        checked = check_answer(text, pending.options, pending.question)
        if checked.answer is None:
            if early_audience is not None:
                early_audience.cancel()  # no graph call follows
            if not addressed:
                if early_access is not None:
                    early_access.cancel()
                return  # group chatter by the same user is not an answer attempt
            access = await (early_access or self.turns.check_access(msg.room_id, msg.sender))
            if access is None:
                return  # a denied user learns nothing, not even that this looked like a secret
            target = self.turns.new_answer(msg.room_id, pending.thread_root, msg.event_id)
            if checked.kind == "secret":
                metrics.HITL.labels("secret_refused").inc()
                log.warning(
                    "hitl_secret_refused",
                    session_id=pending.session_id,
                    user_id=msg.sender,
                    event_id=msg.event_id,
                    chars=len(text),
                )
                await target.notice(REFUSED_NOTICE)
                return
            metrics.HITL.labels("invalid_answer").inc()
            options = " or ".join(pending.options) if pending.options else "an answer"
            shown = question_message(pending.question, pending.options)  # a long one: its short form
            await target.notice(f"Please answer {options}. {shown.text}")
            return
        await self._submit(
            msg.room_id,
            msg.sender,
            pending,
            checked.answer,
            reply_to=msg.event_id,
            sent_at=msg.server_ts / 1000,
            early_access=early_access,
            early_audience=early_audience,
        )

    async def on_reaction(self, room_id: str, src: dict[str, Any]) -> None:
        rel = (src.get("content") or {}).get("m.relates_to") or {}
        if rel.get("rel_type") != "m.annotation" or not rel.get("event_id"):
            return
        sid = await self.hitl.session_for_question(str(rel["event_id"]))
        if sid is None:
            return
        sender = str(src.get("sender"))
        if SessionId.parse(sid).user_id != sender:
            log.info("hitl_reaction_ignored", session_id=sid, reason="not the asking user")
            if self.audit is not None:
                self.audit.record(
                    "access_denied",
                    user_id=sender,
                    session_id=sid,
                    resource=f"question:{rel['event_id']}",
                    decision="denied",
                    reason="answered another user's question",
                )
            return
        pending = await self.hitl.peek(sid)
        answer = reaction_answer(str(rel.get("key", "")), pending.options) if pending else None
        if pending is None or answer is None:
            return
        self.workers.submit(  # run in the session's queue, still in this reaction's trace
            sid,
            carried(
                lambda: self._submit(room_id, sender, pending, answer, reply_to=None, sent_at=time.time())
            ),
        )

    async def _submit(
        self,
        room_id: str,
        user_id: str,
        pending: PendingQuestion,
        answer: str,
        *,
        reply_to: str | None,
        sent_at: float,
        early_access: asyncio.Future[AccessResult | None] | None = None,
        early_audience: asyncio.Future[Audience | None] | None = None,
    ) -> None:
        structlog.contextvars.bind_contextvars(session_id=pending.session_id)
        with answer_span(pending.session_id):
            access, audience = await self._access_and_audience(room_id, user_id, early_access, early_audience)
            if access is None:
                return
            if await self.hitl.consume(pending.session_id) is None:
                return  # expired or already answered (another process, a double click)
            metrics.HITL.labels("answered").inc()
            if pending.options:  # one of the question's options
                log.info("hitl_answered", session_id=pending.session_id, answer=loggable(answer))
            else:  # free text: what people wrote is not logged, only how long it was
                log.info("hitl_answered", session_id=pending.session_id, answer_chars=len(answer))
            self._audit_answer(user_id, pending, answer, access)
            req = FeedbackRequest(
                session_id=pending.session_id,
                response=answer,
                interrupt_id=pending.interrupt_id,
                ac_context=access.ac,
                audience=audience,
                audience_unchecked=await self.turns.audience_unchecked(room_id),
            )
            target = self.turns.new_answer(room_id, pending.thread_root, reply_to or pending.reply_to)
            await self.turns.converse(
                SessionId.parse(pending.session_id), target, lambda: self.graph.submit_feedback(req), sent_at
            )

    def _audit_answer(
        self, user_id: str, pending: PendingQuestion, answer: str, access: AccessResult
    ) -> None:
        """Who answered which question, and how (a free-text answer only by its length,
        unless AUDIT_INCLUDE_CONTENT)."""
        if self.audit is None:
            return
        choice = answer.lower() if pending.options else ""
        decision: Decision = "approved" if choice == "yes" else "declined" if choice == "no" else "answered"
        self.audit.record(
            "hitl_decision",
            user_id=user_id,
            session_id=pending.session_id,
            domain=access.ac.active_acl_domain if access.ac else None,
            resource=f"question:{pending.interrupt_id or pending.question_event_id or ''}",
            decision=decision,
            metadata={"option": answer} if pending.options else {},
            arguments=None if pending.options else {"answer": answer},
        )

    async def _access_and_audience(
        self,
        room_id: str,
        user_id: str,
        early_access: asyncio.Future[AccessResult | None] | None,
        early_audience: asyncio.Future[Audience | None] | None,
    ) -> tuple[AccessResult | None, Audience | None]:
        """Both at once; the audience is awaited only for a user who may answer at all."""
        audience = early_audience or asyncio.ensure_future(self.turns.resolve_audience(room_id, user_id))
        try:
            access = await (early_access or self.turns.check_access(room_id, user_id))
            return access, (await audience if access is not None else None)
        finally:
            if not audience.done():
                audience.cancel()
