"""One tool call, from the model's request to the message the model reads back.

A call goes through named steps, and any of them may end it (a refusal, a question to save
and ask, a "no", a missing credential) with the message the model reads:

    checked          may this user call this tool, with these arguments?
    cleared          a personal result in a group room, the plan, the human's yes to
                     exactly this call (asked from what the state saved, never rebuilt)
    answered         the human's answer to a question the tool asks (ask_user)
    with_credential  the asker's own credential, fetched right before the run
    run              the tool, with the cleared plan; asked again if that no longer holds

Every refusal and every run is counted (TOOL_CALLS) and on record (the audit trail).
Everything before an interrupt() here runs again on resume, so it must be safe to repeat.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import structlog
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.config import get_stream_writer
from langgraph.errors import GraphInterrupt
from pydantic import ValidationError

from vagent_graph.agents.descriptor import AgentDescriptor
from vagent_graph.knowledge.citations import artifact_for
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import TurnRecorder, current_turn
from vagent_graph.observability.spans import confirmation_waited, tool_decision, wait_outcome
from vagent_graph.observability.trace_arguments import trace_arguments
from vagent_graph.services import Services
from vagent_graph.services.audit import audit
from vagent_graph.services.credentials import CredentialError, CredentialMissing, CredentialRegistry
from vagent_graph.tools import (
    Changed,
    NothingToDo,
    Prepared,
    Question,
    Tool,
    ToolContext,
    ToolImage,
    ToolRegistry,
    ToolResult,
)
from vagent_graph.tools.base import plain_action, readable_name
from vagent_graph.tools.confirmation import Unconfirmable, shown_action
from vagent_graph.tools.scope import Readership, ResultScope, traced_scope
from vagent_graph.workflow.access import check_invocation
from vagent_graph.workflow.approval import Approval, approval_for, in_group, matches, readers_changed
from vagent_graph.workflow.history import CANCELLED_TOOL_RESULT
from vagent_graph.workflow.hitl import ask_human
from vagent_graph.workflow.tool_images import shown_images
from vagent_shared.audit import AuditEventType, Decision
from vagent_shared.hitl import YES, YES_NO
from vagent_shared.traces import ToolCallTrace
from vagent_shared.validation import problems

log = structlog.get_logger(__name__)

#: PERSONAL_RESULTS_IN_GROUPS: a personal tool's result in a group room.
PersonalResults = Literal["ask", "allow", "deny"]


#: What the model (and through it the user) reads for a call of a tool the user was never
#: offered, unknown or not allowed: never its name, which would tell them it exists (the
#: security log, the metric and the audit record keep it, for operators).
NOT_OFFERED = "I can't do that here."


def declined_text(tool: str) -> str:
    """What the model reads when the user said no: it answers the person who declined."""
    return f"The user said no: {tool} was NOT run; nothing was changed. Tell them so."


def progress_text(tool: Tool) -> str:
    """The status line the room sees while a tool runs: what a person calls the tool, never
    its internal `server__tool` name (that is for the trace and the logs)."""
    return f"Running “{tool.title or readable_name(tool.name)}”…"


def pending_calls(messages: list[AnyMessage]) -> list[dict[str, Any]]:
    """Tool calls of the last AIMessage that have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, AIMessage):
            done = {t.tool_call_id for t in messages[i + 1 :] if isinstance(t, ToolMessage)}
            return [dict(tc) for tc in m.tool_calls if tc.get("id") not in done]
    return []


def credential_failure_text(tool: str, exc: CredentialError, help_text: str) -> str:
    """What the model (and through it the user) is told when a tool gets no credential."""
    if exc.kind == "missing":
        return f"{tool} was not run: no credential is configured for you for it. {help_text}"
    if exc.kind == "denied":
        return f"Access denied: {tool} was NOT run; you may not use the system it acts on."
    return (
        f"{tool} is unavailable right now (the credential service failed); it was NOT run. Try again later."
    )


def room_may_see(tool: Tool, scope: ResultScope | None, ctx: ToolContext) -> bool:
    """May the room's readers be told about this result (the trace's account in the room)?
    Not a personal result in a group room (even one the asker let the room see: the account
    names it to nobody but the asker), nor a result derived from what some reader may not
    read."""
    if tool.is_personal and in_group(ctx.audience):
        return False
    return scope is None or scope.empty or Readership(ctx.ac, ctx.audience).may_read(scope)


def answered_after(entry: ToolCallTrace, stored: Approval | None) -> float | None:
    """Seconds from the question to its answer: from the trace's entry, or (its trace expired)
    from when the saved confirmation was asked."""
    asked = entry.asked_at.timestamp() if entry.asked_at else (stored or {}).get("asked_at")
    return round(max(time.time() - asked, 0.0), 3) if isinstance(asked, int | float) else None


def saved_actions(stored: Approval, tool: str, args: Any) -> list[dict[str, Any]]:
    """What "yes" to a saved confirmation runs: as saved with its question, or (a confirmation
    saved before actions were) made now from the arguments, which its digest matched."""
    actions = stored.get("actions")
    if isinstance(actions, list) and all(isinstance(a, dict) for a in actions):
        return [dict(a) for a in actions]
    return [shown_action(tool, args.model_dump(mode="json"))]


@dataclass(frozen=True)
class Call:
    """One tool call as the model made it: what every outcome needs."""

    id: str
    name: str
    raw_args: dict[str, Any]
    #: Its TurnTrace entry, filled in by the steps (None: the run is not recorded).
    trace: ToolCallTrace | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Call:
        args = raw.get("args")
        return cls(str(raw.get("id", "")), str(raw.get("name", "")), args if isinstance(args, dict) else {})

    def note(self, **fields: Any) -> None:
        """Add to the call's trace entry (if the run is recorded)."""
        if self.trace is not None:
            for name, value in fields.items():
                setattr(self.trace, name, value)

    def reply(
        self, text: str, status: str = "success", artifact: dict[str, Any] | None = None
    ) -> ToolMessage:
        return ToolMessage(
            content=text, tool_call_id=self.id, name=self.name, status=status, artifact=artifact
        )


@dataclass(frozen=True)
class Confirm:
    """A call that needs the human's yes first: store `action`, then ask its question."""

    action: Approval


@dataclass(frozen=True)
class Cleared:
    """Nothing stands between the call and its run any more: the plan to run it with, whether
    a human confirmed it, and the human's answer to the tool's own question (if it asked one)."""

    plan: dict[str, Any] | None = None
    confirmed: bool = False
    answer: str | None = None


#: A finished call: the tool message, and whether the run stops (a question nobody answered).
Outcome = tuple[ToolMessage, bool]


@dataclass(frozen=True)
class ToolCalls:
    """Runs one tool call at a time, with what the workflow was built with."""

    registry: ToolRegistry
    agent: AgentDescriptor
    services: Services
    #: CREDENTIAL_MISSING_HELP: what a user without a credential is told to do.
    credential_help: str
    personal_results: PersonalResults
    #: TOOL_IMAGE_MAX_BYTES: a larger image a tool returns is not posted (tool_images.py).
    tool_image_max_bytes: int = 5 * 1024 * 1024
    #: CONFIRM_MAX_CHARS: a longer confirmation question is not asked (tools/confirmation.py).
    confirm_max_chars: int = 20_000
    #: OTEL_CAPTURE_CONTENT: free-text arguments are kept in the turn's trace (trace_arguments.py).
    capture_content: bool = False

    async def execute(
        self, raw: dict[str, Any], ctx: ToolContext, stored: Approval | None
    ) -> Outcome | Confirm:
        """One call, step by step (see the module's docstring); `stored` is the confirmation
        saved for the next call, if one was asked. Recorded in the turn's trace, if any."""
        call = Call.of(raw)
        turn = current_turn()
        if turn is None:
            return await self.steps(call, ctx, stored)
        call = replace(call, trace=self._entry(call, turn, ctx))
        started = time.perf_counter()
        try:
            step = await self.steps(call, ctx, stored)
        except GraphInterrupt:  # a question is being asked (or asked again)
            call.note(outcome="asked", confirmation_asked=True)
            if call.trace is not None and call.trace.asked_at is None:
                call.trace.asked_at = datetime.now(UTC)
            self._record(turn, call, started)
            raise
        if isinstance(step, Confirm):  # saved now, asked in the next step
            call.note(
                outcome="asked",
                confirmation_asked=True,
                asked_at=datetime.fromtimestamp(step.action["asked_at"], UTC),
                confirmation_answer=None,
                confirmation_seconds=None,
            )
        else:
            call.note(result_chars=len(str(step[0].content)))
            if call.trace is not None and call.trace.confirmation_answer is not None:
                call.note(confirmation_seconds=answered_after(call.trace, stored))
        self._record(turn, call, started)
        return step

    def _entry(self, call: Call, turn: TurnRecorder, ctx: ToolContext) -> ToolCallTrace:
        """The call's trace entry: the one its question left (a resume), or a new one."""
        known = turn.tool_entry(call.id)
        if known is not None:
            return known.model_copy(update={"outcome": "ok", "decision": "allowed"})
        tool = self.registry.get(call.name)
        schema = tool.openai_schema()["function"]["parameters"] if tool is not None else None
        return ToolCallTrace(
            name=call.name[:100],
            call_id=call.id,
            source=("unknown" if tool is None else f"mcp:{tool.server}" if tool.server else "builtin"),
            arguments=trace_arguments(call.raw_args, schema, self.capture_content),
            scope=ResultScope(),  # nothing derived from anyone's data until it runs (run())
        )

    @staticmethod
    def _record(turn: TurnRecorder, call: Call, started: float) -> None:
        if call.trace is not None:
            call.trace.duration_ms = round((time.perf_counter() - started) * 1000, 1)
            turn.tool_call(call.trace)

    async def steps(self, call: Call, ctx: ToolContext, stored: Approval | None) -> Outcome | Confirm:
        """The steps of one call, in order; the first that ends it gives its outcome."""
        checked = self.checked(call, ctx)
        if isinstance(checked, ToolMessage):
            return checked, False
        tool, args = checked
        cleared = await self.cleared(call, tool, args, ctx, stored)
        if not isinstance(cleared, Cleared):
            return cleared
        answered = await self.answered(call, tool, args, ctx, cleared)
        if not isinstance(answered, Cleared):
            return answered
        with_credential = await self.with_credential(call, tool, ctx)
        if not isinstance(with_credential, ToolContext):
            return with_credential
        return await self.run(call, tool, args, with_credential, answered)

    # ---- the steps ---------------------------------------------------------------------
    def checked(self, call: Call, ctx: ToolContext) -> ToolMessage | tuple[Tool, Any]:
        """The tool and its validated arguments, or the refusal the model reads."""
        decision = check_invocation(call.name, self.registry, self.agent, ctx.ac)
        if not decision.allowed or decision.tool is None:
            log.warning(
                "security.tool_call_denied",
                tool=call.name[:100],
                reason=decision.reason,
                user_id=ctx.ac.user_id,
            )
            self._audit_tool(ctx, "access_denied", call.name, "denied", decision.reason)
            metrics.SECURITY_EVENTS.labels("tool_call_denied").inc()
            known = call.name if call.name in self.registry else "unknown"
            metrics.TOOL_CALLS.labels(known, "denied").inc()
            # No arguments on record: the audit keeps none for a call it refused.
            call.note(decision="denied", outcome="denied", arguments={})
            return call.reply(NOT_OFFERED, "error")
        try:
            return decision.tool, decision.tool.args_model.model_validate(call.raw_args)
        except ValidationError as exc:
            metrics.TOOL_CALLS.labels(call.name, "invalid_args").inc()
            call.note(outcome="error")
            return call.reply(f"Invalid arguments for {call.name}: {problems(exc)}", "error")

    async def cleared(
        self, call: Call, tool: Tool, args: Any, ctx: ToolContext, stored: Approval | None
    ) -> Cleared | Confirm | Outcome:
        """Whatever must happen before the call runs: a personal result refused in a group
        room, the plan, and the human's yes to exactly this call (asked from `stored`)."""
        if tool.is_personal and in_group(ctx.audience) and self.personal_results == "deny":
            return self._personal_refused(call, ctx)
        confirm = self.agent.needs_confirmation(call.name, tool.requires_confirmation)
        ask_personal = self._asks_personal(tool, ctx)
        arguments = args.model_dump(mode="json")
        if stored is not None and matches(stored, call.id, call.name, arguments, tool.origin):
            # Asked already (this is the resume): the answer applies to what was shown.
            return await self._confirmed(call, tool, args, ctx, stored, confirm, ask_personal)
        if confirm or ask_personal:
            return await self._approval(call, tool, args, ctx, confirm, ask_personal)
        return await self._planned(call, tool, args, ctx)

    async def answered(
        self, call: Call, tool: Tool, args: Any, ctx: ToolContext, cleared: Cleared
    ) -> Cleared | Outcome:
        """The human's answer to a question whose answer the tool needs (ask_user), if it asks one."""
        if tool.ask is None:
            return cleared
        question = await tool.ask(args, ctx)
        if question is None:
            return cleared
        answer = self._ask(call, ctx, question)
        if not isinstance(answer, str):
            return answer
        return replace(cleared, answer=answer, confirmed=cleared.confirmed or question.kind == "confirm")

    async def with_credential(self, call: Call, tool: Tool, ctx: ToolContext) -> ToolContext | Outcome:
        """The context with the asker's own credential, for a tool that `requires_credentials`
        (fetched now, after any confirmation, so it is valid when the tool acts)."""
        if not tool.requires_credentials:
            return ctx
        resource = tool.credential_resource or tool.name
        registry = self.services.find(CredentialRegistry)
        try:
            if registry is None:
                raise CredentialMissing("no credential registry is configured")
            fetched = await registry.get(ctx.ac.user_id, resource, ctx.ac.active_acl_domain)
        except CredentialError as exc:
            decision: Decision = "denied" if exc.kind in ("missing", "denied") else "error"
            self._audit_credential(ctx, resource, exc.kind, decision, f"{exc.kind}: {exc}")
            text = credential_failure_text(tool.name, exc, self.credential_help)
            metrics.TOOL_CALLS.labels(call.name, "no_credential").inc()
            call.note(outcome="refused" if decision == "denied" else "error")
            return call.reply(text, "error"), False
        kind = {"credential_type": fetched.credential.credential_type}
        self._audit_credential(ctx, resource, fetched.source, "allowed", fetched.source, kind)
        call.note(credential_used=True)
        return replace(ctx, credential=fetched.credential)

    async def run(
        self, call: Call, tool: Tool, args: Any, ctx: ToolContext, cleared: Cleared
    ) -> Outcome | Confirm:
        """The tool with the cleared plan; asks again if the tool finds that what was
        confirmed no longer holds."""
        name = call.name
        self._audit_tool(ctx, "tool_access", name, "allowed", "confirmed" if cleared.confirmed else "", call)
        get_stream_writer()({"type": "progress", "content": progress_text(tool)})
        try:
            result = await tool.run(args, replace(ctx, plan=cleared.plan), cleared.answer)
        except Exception as exc:  # the type only: an exception message may quote a secret
            log.error("tool_failed", tool=name, error=type(exc).__name__)
            metrics.TOOL_CALLS.labels(name, "failed").inc()
            call.note(outcome="error")
            return call.reply(f"The tool {name} failed.", "error"), False
        if isinstance(result, Changed):  # what was confirmed no longer holds: ask again
            metrics.TOOL_CALLS.labels(name, "changed").inc()
            self._audit_tool(ctx, "tool_access", name, "expired", "changed since confirmed", call)
            ask_personal = self._asks_personal(tool, ctx)
            return await self._approval(
                call, tool, args, ctx, True, ask_personal, result.reason, prepared=result.prepared
            )
        metrics.TOOL_CALLS.labels(name, "confirmed" if cleared.confirmed else "allowed").inc()
        text, sources, scope = (
            (result.text, result.sources, result.scope)
            if isinstance(result, ToolResult)
            else (result, (), None)
        )
        if isinstance(result, ToolResult) and result.images:
            text = self._show_images(name, result.images, text)
        scope = self._scope(tool, scope, ctx)
        call.note(room_may_see=room_may_see(tool, scope, ctx), scope=traced_scope(scope))
        return call.reply(text, artifact=artifact_for(sources, scope)), False

    def _show_images(self, tool: str, images: tuple[ToolImage, ...], text: str) -> str:
        """Images for the room go out as stream events (the bot posts them after the answer);
        the model reads what became of each."""
        shown = shown_images(images, tool, self.tool_image_max_bytes)
        write = get_stream_writer()
        for image in shown.images:
            write({"type": "image", "image": image.model_dump()})
        metrics.TOOL_IMAGES.labels("shown").inc(len(shown.images))
        metrics.TOOL_IMAGES.labels("refused").inc(len(images) - len(shown.images))
        return f"{text}\n{shown.note}" if text else shown.note

    # ---- questions ---------------------------------------------------------------------
    def _ask(
        self, call: Call, ctx: ToolContext, question: Question, actions: list[dict[str, Any]] | None = None
    ) -> str | Outcome:
        """The human's answer (interrupt), or the outcome when it is "no" or never comes.
        `actions`: what "yes" runs (a confirmation's); none for the tool's own question."""
        answer = ask_human(question, self.agent.hitl.timeout_seconds, actions or ())
        if answer is None:
            call.note(outcome="cancelled", confirmation_asked=True, confirmation_answer="cancelled")
            metrics.TOOL_CALLS.labels(call.name, "cancelled").inc()
            self._audit_tool(ctx, "tool_access", call.name, "expired", "the question was not answered")
            return call.reply(CANCELLED_TOOL_RESULT), True
        # The words of a yes/no answer; never what was typed into an input question.
        confirm = question.kind == "confirm" and bool(question.options)
        call.note(confirmation_asked=True, confirmation_answer=answer if confirm else "answered")
        if question.kind == "confirm" and question.options and answer.lower() != YES:
            call.note(outcome="declined")
            metrics.TOOL_CALLS.labels(call.name, "declined").inc()
            self._audit_tool(ctx, "tool_access", call.name, "declined", "the user declined", call)
            return call.reply(declined_text(call.name)), False
        return answer

    async def _confirmed(
        self,
        call: Call,
        tool: Tool,
        args: Any,
        ctx: ToolContext,
        stored: Approval,
        confirm: bool,
        ask_personal: bool,
    ) -> Cleared | Confirm | Outcome:
        """The answer to the saved question: its plan runs on "yes", unless more people read
        the room now than the question counted (then it is asked again)."""
        question = Question(text=str(stored["question"]), options=list(YES_NO))
        answer = self._ask(call, ctx, question, saved_actions(stored, call.name, args))
        confirmation_waited(stored, call.name, wait_outcome(answer))
        if not isinstance(answer, str):  # "no", or no answer in time
            return answer
        if ask_personal and readers_changed(stored, ctx.audience):
            note = "The people in this room changed since I asked."
            return await self._approval(call, tool, args, ctx, confirm, ask_personal, note)
        return Cleared(dict(stored.get("plan") or {}), confirmed=True)

    async def _approval(
        self,
        call: Call,
        tool: Tool,
        args: Any,
        ctx: ToolContext,
        confirm: bool,
        personal: bool,
        *notes: str,
        prepared: Prepared | None = None,
    ) -> Confirm | Outcome:
        """The question for this call, to be saved before it is asked (or, when the tool has
        nothing to do, the answer that says so)."""
        if prepared is None:
            found = await tool.prepare(args, ctx) if tool.prepare else Prepared(action=plain_action(tool))
            if isinstance(found, NothingToDo):
                return self._nothing_to_do(call, ctx, found)
            prepared = found
        arguments = args.model_dump(mode="json")
        approval = approval_for(
            call.id,
            tool,
            arguments,
            prepared,
            ctx.audience,
            confirm=confirm,
            personal=personal,
            notes=notes,
            max_chars=self.confirm_max_chars,
        )
        if isinstance(approval, Unconfirmable):
            return self._unconfirmable(call, ctx, approval)
        # When it was asked: the answer's wait (the trace's confirmation_seconds, the span).
        return Confirm({**approval, "asked_at": time.time()})

    async def _planned(self, call: Call, tool: Tool, args: Any, ctx: ToolContext) -> Cleared | Outcome:
        """A call nobody needs to confirm: the plan its tool fixes, if it makes one."""
        if tool.prepare is None:
            return Cleared()
        prepared = await tool.prepare(args, ctx)
        if isinstance(prepared, NothingToDo):
            return self._nothing_to_do(call, ctx, prepared)
        return Cleared(prepared.plan)

    def _asks_personal(self, tool: Tool, ctx: ToolContext) -> bool:
        """Must the asker agree before others in the room see this tool's result?"""
        return tool.is_personal and in_group(ctx.audience) and self.personal_results == "ask"

    # ---- outcomes ----------------------------------------------------------------------
    def _personal_refused(self, call: Call, ctx: ToolContext) -> Outcome:
        metrics.TOOL_CALLS.labels(call.name, "personal_denied").inc()
        call.note(outcome="refused", room_may_see=False, scope=ResultScope(personal_to=ctx.ac.user_id))
        self._audit_tool(ctx, "tool_access", call.name, "denied", "personal result in a group room", call)
        text = (
            f"{call.name} was NOT run: it shows the user's own data, which is not shared in group rooms "
            "here. Suggest asking in a direct message with the bot."
        )
        return call.reply(text, "error"), False

    def _unconfirmable(self, call: Call, ctx: ToolContext, refused: Unconfirmable) -> Outcome:
        """A question that cannot show everything the call would send is not asked: the
        model is told why (to shorten the arguments), and the call is refused on record."""
        metrics.TOOL_CALLS.labels(call.name, "unconfirmable").inc()
        call.note(outcome="refused")
        self._audit_tool(ctx, "tool_access", call.name, "denied", f"unconfirmable: {refused.reason}", call)
        return call.reply(refused.text, "error"), False

    def _nothing_to_do(self, call: Call, ctx: ToolContext, nothing: NothingToDo) -> Outcome:
        metrics.TOOL_CALLS.labels(call.name, "nothing_to_do").inc()
        self._audit_tool(ctx, "tool_access", call.name, "allowed", "nothing to do", call)
        return call.reply(nothing.text), False

    def _scope(self, tool: Tool, scope: ResultScope | None, ctx: ToolContext) -> ResultScope | None:
        """A personal tool's result is the asker's own: who may read it again is recorded
        with it (the asker, and the room members who read it now)."""
        if not tool.is_personal:
            return scope
        others = Readership(ctx.ac, ctx.audience).others() or frozenset()
        personal = {"personal_to": ctx.ac.user_id, "shown_to": tuple(sorted(others))}
        return (scope or ResultScope()).model_copy(update=personal)

    # ---- the record --------------------------------------------------------------------
    def _audit_credential(
        self,
        ctx: ToolContext,
        resource: str,
        outcome: str,
        decision: Decision,
        reason: str,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """One credential fetch, counted and on record (never the value)."""
        metrics.CREDENTIAL_FETCHES.labels(outcome).inc()
        audit(
            self.services,
            "credential_access",
            ctx.ac,
            ctx.session_id,
            resource=f"credential:{resource}",
            decision=decision,
            reason=reason,
            metadata=metadata,
        )

    def _audit_tool(
        self,
        ctx: ToolContext,
        event_type: AuditEventType,
        name: str,
        decision: Decision,
        reason: str = "",
        call: Call | None = None,
    ) -> None:
        tool_decision(decision, reason)  # on the call's span
        audit(
            self.services,
            event_type,
            ctx.ac,
            ctx.session_id,
            resource=f"tool:{name[:100]}",
            decision=decision,
            reason=reason,
            metadata=self._origin(name),
            arguments=call.raw_args if call else None,
        )

    def _origin(self, name: str) -> dict[str, Any] | None:
        """Which MCP server a tool comes from, for the audit record (None: built in)."""
        tool = self.registry.get(name)
        return {"mcp_server": tool.server} if tool is not None and tool.server else None
