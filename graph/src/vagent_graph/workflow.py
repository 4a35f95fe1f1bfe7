r"""The agent workflow: state, nodes and edges in one place; tools live in tools/.

    START -> agent --(tool calls)--> tools --(more calls)--> tools
                 \                      \--(all answered)--> agent
                  \--(final answer)--> END     \--(question cancelled)--> END

`tools` handles ONE call per step, so a resume re-runs only that call's
question-building code, never an already executed tool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, TypedDict

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
from vagent_graph.audit import audit
from vagent_graph.citations import artifact_for, turn_sources, with_sources
from vagent_graph.credentials import CredentialError, CredentialMissing, CredentialRegistry
from vagent_graph.history import CANCELLED_TOOL_RESULT, removals_to_bound, window_for_llm
from vagent_graph.hitl import ask_human
from vagent_graph.runner import text_of
from vagent_graph.tools.registry import Question, Services, Tool, ToolContext, ToolRegistry, ToolResult
from vagent_shared.access import AcContext
from vagent_shared.audit import AuditEventType, Decision
from vagent_shared.knowledge import Audience

log = structlog.get_logger(__name__)


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    #: The AcContext of the current request (camelCase JSON); replaced by every request.
    #: (Who else reads the answer is in the run's config, `audience`: never checkpointed.)
    ac_context: dict[str, Any]
    llm_calls: int
    stopped: bool


@dataclass(frozen=True)
class Deps:
    registry: ToolRegistry
    agent: AgentDescriptor
    llm: BaseChatModel
    model_label: str
    services: Services
    #: CREDENTIAL_MISSING_HELP: what a user without a credential is told to do.
    credential_help: str = "Ask your administrator to add one for you."


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
        history = window_for_llm(state.get("messages", []), d.agent.history.max_context_tokens)
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
            sources = turn_sources(state.get("messages", []))
            if sources:  # the final answer names the documents it used
                ai = ai.model_copy(update={"content": with_sources(text_of(ai), sources)})
        out: list[Any] = [ai]
        if not ai.tool_calls:
            out += removals_to_bound([*state.get("messages", []), ai], d.agent.history.max_messages)
        return {"messages": out, "llm_calls": calls + 1}

    async def tools(self, state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        pending = pending_calls(state.get("messages", []))
        if not pending:
            return {}
        call = pending[0]
        ctx = ToolContext(
            ac=AcContext.model_validate(state.get("ac_context") or {}),
            session_id=session_of(config),
            services=self.d.services,
            audience=audience_of(config),
            sources=turn_sources(state.get("messages", [])),
        )
        result, cancelled = await self._execute(call, ctx)
        if cancelled:
            rest = [
                ToolMessage(content=CANCELLED_TOOL_RESULT, tool_call_id=c["id"], name=c["name"])
                for c in pending[1:]
            ]
            return {"messages": [result, *rest], "stopped": True}
        return {"messages": [result]}

    async def _execute(self, call: dict[str, Any], ctx: ToolContext) -> tuple[ToolMessage, bool]:
        d, name, call_id, ac = self.d, str(call.get("name", "")), str(call.get("id", "")), ctx.ac

        def reply(text: str | ToolResult, status: str = "success") -> ToolMessage:
            if isinstance(text, ToolResult):
                return ToolMessage(
                    content=text.text,
                    tool_call_id=call_id,
                    name=name,
                    status=status,
                    artifact=artifact_for(text.sources),
                )
            return ToolMessage(content=text, tool_call_id=call_id, name=name, status=status)

        decision = check_invocation(name, d.registry, d.agent, ac)
        if not decision.allowed or decision.tool is None:
            log.warning(
                "security.tool_call_denied", tool=name[:100], reason=decision.reason, user_id=ac.user_id
            )
            self._audit_tool(ctx, "access_denied", name, "denied", decision.reason)
            metrics.SECURITY_EVENTS.labels("tool_call_denied").inc()
            metrics.TOOL_CALLS.labels(name if name in d.registry else "unknown", "denied").inc()
            return reply(
                f"Access denied: the tool '{name[:100]}' is not available to this user.", "error"
            ), False
        tool = decision.tool
        try:
            args = tool.args_model.model_validate(call.get("args") or {})
        except ValidationError as exc:
            metrics.TOOL_CALLS.labels(name, "invalid_args").inc()
            errs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            return reply(f"Invalid arguments for {name}: {errs}", "error"), False

        # A tool with its own `ask` decides (None: nothing to confirm, e.g. 0 rows to delete);
        # other tools that need confirmation get a generic yes/no question.
        question = await tool.ask(args, ctx) if tool.ask else None
        if tool.ask is None and d.agent.needs_confirmation(name, tool.requires_confirmation):
            question = Question(text=f"Run {name} with {args.model_dump_json()}?", options=["yes", "no"])
        answer: str | None = None
        if question is not None:
            answer = ask_human(question, d.agent.hitl.timeout_seconds)
            if answer is None:
                metrics.TOOL_CALLS.labels(name, "cancelled").inc()
                self._audit_tool(ctx, "tool_access", name, "expired", "the question was not answered")
                return reply(CANCELLED_TOOL_RESULT), True
            if question.kind == "confirm" and answer.lower() != "yes":
                metrics.TOOL_CALLS.labels(name, "declined").inc()
                self._audit_tool(ctx, "tool_access", name, "declined", "the user declined", call)
                return reply(f"The user declined. {name} was NOT run; nothing was changed."), False

        if tool.requires_credentials:
            with_credential = await self._with_credential(tool, ctx)
            if isinstance(with_credential, str):
                metrics.TOOL_CALLS.labels(name, "no_credential").inc()
                return reply(with_credential, "error"), False
            ctx = with_credential
        self._audit_tool(ctx, "tool_access", name, "allowed", "confirmed" if question else "", call)
        get_stream_writer()({"type": "progress", "content": f"Running {name}…"})
        try:
            result = await tool.run(args, ctx, answer)
        except Exception as exc:  # the type only: an exception message may quote a secret
            log.error("tool_failed", tool=name, error=type(exc).__name__)
            metrics.TOOL_CALLS.labels(name, "failed").inc()
            return reply(f"The tool {name} failed.", "error"), False
        metrics.TOOL_CALLS.labels(name, "confirmed" if question else "allowed").inc()
        return reply(result), False

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
        call: dict[str, Any] | None = None,
    ) -> None:
        args = call.get("args") if call else None
        audit(
            self.d.services,
            event_type,
            ctx.ac,
            ctx.session_id,
            resource=f"tool:{name[:100]}",
            decision=decision,
            reason=reason,
            arguments=args if isinstance(args, dict) else None,
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
    }
