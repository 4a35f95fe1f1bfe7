r"""The agent workflow: state, nodes and edges in one place; tools live in tools/.

    START -> agent --(tool calls)--> tools --(more calls)--> tools
                 \                      \--(all answered)--> agent
                  \--(final answer)--> END     \--(question cancelled)--> END

`tools` handles ONE call per step, so a resume re-runs only that call's
question-building code, never an already executed tool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, TypedDict

import structlog
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from pydantic import ValidationError

from vagent_graph import metrics
from vagent_graph.access import check_invocation, visible_tools
from vagent_graph.agent import AgentDescriptor
from vagent_graph.approval import Approval, approval_for, in_group, matches, readers_changed
from vagent_graph.audit import audit
from vagent_graph.citations import artifact_for, turn_sources, with_sources
from vagent_graph.credentials import CredentialError, CredentialMissing, CredentialRegistry
from vagent_graph.history import CANCELLED_TOOL_RESULT, removals_to_bound, window_for_llm
from vagent_graph.hitl import ask_human
from vagent_graph.runner import text_of
from vagent_graph.scope import Readership, ResultScope, visible_history
from vagent_graph.tools.registry import (
    Changed,
    NothingToDo,
    Prepared,
    Question,
    Services,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from vagent_shared.access import AcContext
from vagent_shared.audit import AuditEventType, Decision
from vagent_shared.hitl import YES, YES_NO
from vagent_shared.knowledge import Audience

log = structlog.get_logger(__name__)


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    #: The AcContext of the current request (camelCase JSON); replaced by every request.
    #: (Who else reads the answer is in the run's config, `audience`: never checkpointed.)
    ac_context: dict[str, Any]
    llm_calls: int
    stopped: bool
    #: The confirmation being asked for the next tool call (`Workflow._confirmation`): the
    #: exact question shown and the plan "yes" runs, saved BEFORE the question is asked, so a
    #: resume never rebuilds (and never changes) what the human is answering.
    action: dict[str, Any] | None


PersonalResults = Literal["ask", "allow", "deny"]


@dataclass(frozen=True)
class Deps:
    registry: ToolRegistry
    agent: AgentDescriptor
    llm: BaseChatModel
    model_label: str
    services: Services
    #: CREDENTIAL_MISSING_HELP: what a user without a credential is told to do.
    credential_help: str = "Ask your administrator to add one for you."
    #: PERSONAL_RESULTS_IN_GROUPS: a personal tool's result in a group room.
    personal_results: PersonalResults = "ask"


def session_of(config: RunnableConfig) -> str:
    return str(config.get("configurable", {}).get("thread_id", ""))


def audience_of(config: RunnableConfig) -> Audience | None:
    """Who else reads the answer (None: a DM), as the request sent it."""
    audience = config.get("configurable", {}).get("audience")
    return audience if isinstance(audience, Audience) else None


def credential_failure_text(tool: str, exc: CredentialError, help_text: str) -> str:
    """What the model (and through it the user) is told when a tool gets no credential."""
    if exc.kind == "missing":
        return f"{tool} was not run: no credential is configured for you for it. {help_text}"
    if exc.kind == "denied":
        return f"Access denied: {tool} was NOT run; you may not use the system it acts on."
    return (
        f"{tool} is unavailable right now (the credential service failed); it was NOT run. Try again later."
    )


def pending_calls(messages: list[AnyMessage]) -> list[dict[str, Any]]:
    """Tool calls of the last AIMessage that have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, AIMessage):
            done = {t.tool_call_id for t in messages[i + 1 :] if isinstance(t, ToolMessage)}
            return [dict(tc) for tc in m.tool_calls if tc.get("id") not in done]
    return []


@dataclass(frozen=True)
class Confirm:
    """A call that needs the human's yes first: store `action`, then ask its question."""

    action: Approval


@dataclass(frozen=True)
class Call:
    """One tool call as the model made it: what every outcome needs."""

    id: str
    name: str
    raw_args: dict[str, Any]

    def reply(
        self, text: str, status: str = "success", artifact: dict[str, Any] | None = None
    ) -> ToolMessage:
        return ToolMessage(
            content=text, tool_call_id=self.id, name=self.name, status=status, artifact=artifact
        )


@dataclass(frozen=True)
class Cleared:
    """Nothing stands between the call and its run any more: the plan to run it with, and
    whether a human confirmed it."""

    plan: dict[str, Any] | None = None
    confirmed: bool = False


#: A finished call: the tool message, and whether the run stops (a question nobody answered).
Outcome = tuple[ToolMessage, bool]


class Workflow:
    def __init__(self, deps: Deps) -> None:
        self.d = deps

    # ---- nodes -------------------------------------------------------------------------
    async def agent(self, state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        d = self.d
        calls = state.get("llm_calls", 0)
        if calls >= d.agent.max_turns:
            return {
                "messages": [
                    AIMessage(
                        content=(
                            f"I stopped after {d.agent.max_turns} steps without a final answer. "
                            "Please ask again, more specifically."
                        )
                    )
                ]
            }
        ac = AcContext.model_validate(state.get("ac_context") or {})
        tools = visible_tools(d.registry, d.agent, ac)
        audit(
            d.services,
            "tool_offered",
            ac,
            session_of(config),
            resource=f"agent:{d.agent.id}",
            decision="allowed",
            metadata={"tools": [t.name for t in tools]},
        )
        model: Any = d.llm.bind_tools([t.openai_schema() for t in tools]) if tools else d.llm
        # What the readers of THIS answer may read: results of earlier turns (or of this one,
        # before a pause) retrieved for other readers are withheld (scope.py).
        messages = visible_history(state.get("messages", []), Readership(ac, audience_of(config)).may_read)
        history = window_for_llm(messages, d.agent.history.max_context_tokens)
        try:
            ai: AIMessage = await model.ainvoke(
                [SystemMessage(content=d.agent.system_prompt), *history], config
            )
        except Exception:
            metrics.LLM_CALLS.labels(d.model_label, "error").inc()
            raise
        metrics.LLM_CALLS.labels(d.model_label, "ok").inc()
        if ai.usage_metadata:
            metrics.LLM_TOKENS.labels(d.model_label, "input").inc(ai.usage_metadata["input_tokens"])
            metrics.LLM_TOKENS.labels(d.model_label, "output").inc(ai.usage_metadata["output_tokens"])
        if not ai.tool_calls:
            sources = turn_sources(messages)
            if sources:  # the final answer names the documents it used
                ai = ai.model_copy(update={"content": with_sources(text_of(ai), sources)})
        out: list[Any] = [ai]
        if not ai.tool_calls:
            out += removals_to_bound([*state.get("messages", []), ai], d.agent.history.max_messages)
        return {"messages": out, "llm_calls": calls + 1}

    async def tools(self, state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        messages = state.get("messages", [])
        pending = pending_calls(messages)
        if not pending:
            return {}
        call = pending[0]
        ac = AcContext.model_validate(state.get("ac_context") or {})
        audience = audience_of(config)
        ctx = ToolContext(
            ac=ac,
            session_id=session_of(config),
            services=self.d.services,
            audience=audience,
            sources=turn_sources(visible_history(messages, Readership(ac, audience).may_read)),
        )
        step = await self._execute(call, ctx, state.get("action"))
        if isinstance(step, Confirm):
            return {"action": step.action}
        result, cancelled = step
        if cancelled:
            rest = [
                ToolMessage(content=CANCELLED_TOOL_RESULT, tool_call_id=c["id"], name=c["name"])
                for c in pending[1:]
            ]
            return {"messages": [result, *rest], "stopped": True, "action": None}
        return {"messages": [result], "action": None}

    async def _execute(
        self, raw: dict[str, Any], ctx: ToolContext, stored: Approval | None
    ) -> Outcome | Confirm:
        """One call: access and arguments, the confirmation (asked from what `stored` holds,
        never rebuilt), an input question, the credential, the run. Everything before an
        interrupt() here runs again on resume, so it must be safe to repeat."""
        args = raw.get("args")
        call = Call(str(raw.get("id", "")), str(raw.get("name", "")), args if isinstance(args, dict) else {})
        checked = self._checked(call, ctx)
        if isinstance(checked, ToolMessage):
            return checked, False
        tool, parsed = checked
        gate = await self._gate(call, tool, parsed, ctx, stored)
        if not isinstance(gate, Cleared):
            return gate
        answer: str | None = None
        if tool.ask is not None:  # a question whose answer the tool needs (ask_user)
            question = await tool.ask(parsed, ctx)
            if question is not None:
                answered = self._ask(call, ctx, question)
                if not isinstance(answered, str):
                    return answered
                answer, gate = answered, replace(gate, confirmed=gate.confirmed or question.kind == "confirm")
        return await self._run(call, tool, parsed, ctx, gate, answer)

    def _checked(self, call: Call, ctx: ToolContext) -> ToolMessage | tuple[Tool, Any]:
        """The tool and its validated arguments, or the refusal the model reads."""
        d = self.d
        decision = check_invocation(call.name, d.registry, d.agent, ctx.ac)
        if not decision.allowed or decision.tool is None:
            log.warning(
                "security.tool_call_denied",
                tool=call.name[:100],
                reason=decision.reason,
                user_id=ctx.ac.user_id,
            )
            self._audit_tool(ctx, "access_denied", call.name, "denied", decision.reason)
            metrics.SECURITY_EVENTS.labels("tool_call_denied").inc()
            metrics.TOOL_CALLS.labels(call.name if call.name in d.registry else "unknown", "denied").inc()
            return call.reply(
                f"Access denied: the tool '{call.name[:100]}' is not available to this user.", "error"
            )
        try:
            return decision.tool, decision.tool.args_model.model_validate(call.raw_args)
        except ValidationError as exc:
            metrics.TOOL_CALLS.labels(call.name, "invalid_args").inc()
            errs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            return call.reply(f"Invalid arguments for {call.name}: {errs}", "error")

    async def _gate(
        self, call: Call, tool: Tool, args: Any, ctx: ToolContext, stored: Approval | None
    ) -> Cleared | Confirm | Outcome:
        """Whatever must happen before the call runs: a personal result refused in a group
        room, the plan, and the human's yes to exactly this call (asked from `stored`)."""
        d, name = self.d, call.name
        if tool.is_personal and in_group(ctx.audience) and d.personal_results == "deny":
            metrics.TOOL_CALLS.labels(name, "personal_denied").inc()
            self._audit_tool(ctx, "tool_access", name, "denied", "personal result in a group room", call)
            text = (
                f"{name} was NOT run: it shows the user's own data, which is not shared in group rooms "
                "here. Suggest asking in a direct message with the bot."
            )
            return call.reply(text, "error"), False
        confirm = d.agent.needs_confirmation(name, tool.requires_confirmation)
        ask_personal = self._asks_personal(tool, ctx)
        arguments = args.model_dump(mode="json")
        if stored is not None and matches(stored, call.id, name, arguments):
            # Asked already (this is the resume): the answer applies to what was shown.
            answer = self._ask(call, ctx, Question(text=str(stored["question"]), options=list(YES_NO)))
            if not isinstance(answer, str):  # "no", or no answer in time
                return answer
            if ask_personal and readers_changed(stored, ctx.audience):
                note = "The people in this room changed since I asked."
                return await self._approval(call, tool, args, ctx, confirm, ask_personal, note)
            return Cleared(dict(stored.get("plan") or {}), confirmed=True)
        if confirm or ask_personal:
            return await self._approval(call, tool, args, ctx, confirm, ask_personal)
        if tool.prepare is None:
            return Cleared()
        prepared = await tool.prepare(args, ctx)
        if isinstance(prepared, NothingToDo):
            return self._nothing_to_do(call, ctx, prepared)
        return Cleared(prepared.plan)

    def _asks_personal(self, tool: Tool, ctx: ToolContext) -> bool:
        """Must the asker agree before others in the room see this tool's result?"""
        return tool.is_personal and in_group(ctx.audience) and self.d.personal_results == "ask"

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
            found = await tool.prepare(args, ctx) if tool.prepare else Prepared(action=f"Run {tool.name}")
            if isinstance(found, NothingToDo):
                return self._nothing_to_do(call, ctx, found)
            prepared = found
        arguments = args.model_dump(mode="json")
        approval = approval_for(
            call.id, tool, arguments, prepared, ctx.audience, confirm=confirm, personal=personal, notes=notes
        )
        return Confirm(approval)

    def _nothing_to_do(self, call: Call, ctx: ToolContext, nothing: NothingToDo) -> Outcome:
        metrics.TOOL_CALLS.labels(call.name, "nothing_to_do").inc()
        self._audit_tool(ctx, "tool_access", call.name, "allowed", "nothing to do", call)
        return call.reply(nothing.text), False

    def _ask(self, call: Call, ctx: ToolContext, question: Question) -> str | Outcome:
        """The human's answer (interrupt), or the outcome when it is "no" or never comes."""
        answer = ask_human(question, self.d.agent.hitl.timeout_seconds)
        if answer is None:
            metrics.TOOL_CALLS.labels(call.name, "cancelled").inc()
            self._audit_tool(ctx, "tool_access", call.name, "expired", "the question was not answered")
            return call.reply(CANCELLED_TOOL_RESULT), True
        if question.kind == "confirm" and question.options and answer.lower() != YES:
            metrics.TOOL_CALLS.labels(call.name, "declined").inc()
            self._audit_tool(ctx, "tool_access", call.name, "declined", "the user declined", call)
            return call.reply(f"The user declined. {call.name} was NOT run; nothing was changed."), False
        return answer

    async def _run(
        self, call: Call, tool: Tool, args: Any, ctx: ToolContext, gate: Cleared, answer: str | None
    ) -> Outcome | Confirm:
        """The credential, then the tool with the cleared plan; asks again if the tool finds
        that what was confirmed no longer holds."""
        name = call.name
        if tool.requires_credentials:
            with_credential = await self._with_credential(tool, ctx)
            if isinstance(with_credential, str):
                metrics.TOOL_CALLS.labels(name, "no_credential").inc()
                return call.reply(with_credential, "error"), False
            ctx = with_credential
        self._audit_tool(ctx, "tool_access", name, "allowed", "confirmed" if gate.confirmed else "", call)
        get_stream_writer()({"type": "progress", "content": f"Running {name}…"})
        try:
            result = await tool.run(args, replace(ctx, plan=gate.plan), answer)
        except Exception as exc:  # the type only: an exception message may quote a secret
            log.error("tool_failed", tool=name, error=type(exc).__name__)
            metrics.TOOL_CALLS.labels(name, "failed").inc()
            return call.reply(f"The tool {name} failed.", "error"), False
        if isinstance(result, Changed):  # what was confirmed no longer holds: ask again
            metrics.TOOL_CALLS.labels(name, "changed").inc()
            self._audit_tool(ctx, "tool_access", name, "expired", "changed since confirmed", call)
            return await self._approval(
                call,
                tool,
                args,
                ctx,
                True,
                self._asks_personal(tool, ctx),
                result.reason,
                prepared=result.prepared,
            )
        metrics.TOOL_CALLS.labels(name, "confirmed" if gate.confirmed else "allowed").inc()
        text, sources, scope = (
            (result.text, result.sources, result.scope)
            if isinstance(result, ToolResult)
            else (result, (), None)
        )
        return call.reply(text, artifact=artifact_for(sources, self._scope(tool, scope, ctx))), False

    def _scope(self, tool: Tool, scope: ResultScope | None, ctx: ToolContext) -> ResultScope | None:
        """A personal tool's result is the asker's own: who may read it again is recorded
        with it (the asker, and the room members who read it now)."""
        if not tool.is_personal:
            return scope
        others = Readership(ctx.ac, ctx.audience).others() or frozenset()
        personal = {"personal_to": ctx.ac.user_id, "shown_to": tuple(sorted(others))}
        return (scope or ResultScope()).model_copy(update=personal)

    async def _with_credential(self, tool: Tool, ctx: ToolContext) -> ToolContext | str:
        """The context with the user's credential for `tool`, or what to tell the model."""
        resource = tool.credential_resource or tool.name
        registry = self.d.services.find(CredentialRegistry)
        try:
            if registry is None:
                raise CredentialMissing("no credential registry is configured")
            fetched = await registry.get(ctx.ac.user_id, resource, ctx.ac.active_acl_domain)
        except CredentialError as exc:
            decision: Decision = "denied" if exc.kind in ("missing", "denied") else "error"
            self._audit_credential(ctx, resource, exc.kind, decision, f"{exc.kind}: {exc}")
            return credential_failure_text(tool.name, exc, self.d.credential_help)
        kind = {"credential_type": fetched.credential.credential_type}
        self._audit_credential(ctx, resource, fetched.source, "allowed", fetched.source, kind)
        return replace(ctx, credential=fetched.credential)

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
            self.d.services,
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
        audit(
            self.d.services,
            event_type,
            ctx.ac,
            ctx.session_id,
            resource=f"tool:{name[:100]}",
            decision=decision,
            reason=reason,
            arguments=call.raw_args if call else None,
        )

    # ---- edges (async: LangGraph runs a plain function in a worker thread) ---------------
    @staticmethod
    async def after_agent(state: AgentState) -> str:
        last = state["messages"][-1] if state.get("messages") else None
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    @staticmethod
    async def after_tools(state: AgentState) -> str:
        if state.get("stopped"):
            return END
        return "tools" if pending_calls(state.get("messages", [])) else "agent"


def build_graph(deps: Deps, checkpointer: BaseCheckpointSaver[Any] | None) -> CompiledStateGraph[Any]:
    wf = Workflow(deps)
    g = StateGraph(AgentState)
    g.add_node("agent", wf.agent)
    g.add_node("tools", wf.tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", wf.after_agent, ["tools", END])
    g.add_conditional_edges("tools", wf.after_tools, ["tools", "agent", END])
    return g.compile(checkpointer=checkpointer)


def new_turn_input(message: str, ac: AcContext) -> dict[str, Any]:
    """The graph input for one user message and who sends it."""
    return {
        "messages": [HumanMessage(content=message)],
        "ac_context": ac.to_wire(),
        "llm_calls": 0,
        "stopped": False,
        "action": None,
    }
