r"""The agent workflow: state, nodes and edges in one place; tools live in tools/.

    START -> agent --(tool calls)--> tools --(more calls)--> tools
                 \                      \--(all answered)--> agent
                  \--(final answer)--> END     \--(question cancelled)--> END

`tools` handles ONE call per step, so a resume re-runs only that call's
question-building code, never an already executed tool.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from vagent_graph.citations import artifact_for, turn_sources, with_sources
from vagent_graph.history import CANCELLED_TOOL_RESULT, removals_to_bound, window_for_llm
from vagent_graph.hitl import ask_human
from vagent_graph.runner import text_of
from vagent_graph.tools.registry import Question, Services, ToolContext, ToolRegistry, ToolResult
from vagent_shared.access import AcContext
from vagent_shared.knowledge import Audience

log = structlog.get_logger(__name__)


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    #: The AcContext of the current request (camelCase JSON); replaced by every request.
    ac_context: dict[str, Any]
    #: Who else reads the answer (vagent_shared.knowledge.Audience JSON); None in a DM.
    audience: dict[str, Any] | None
    llm_calls: int
    stopped: bool


@dataclass(frozen=True)
class Deps:
    registry: ToolRegistry
    agent: AgentDescriptor
    llm: BaseChatModel
    model_label: str
    services: Services


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
            session_id=str(config.get("configurable", {}).get("thread_id", "")),
            services=self.d.services,
            audience=Audience.model_validate(state["audience"]) if state.get("audience") else None,
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
                return reply(CANCELLED_TOOL_RESULT), True
            if question.kind == "confirm" and answer.lower() != "yes":
                metrics.TOOL_CALLS.labels(name, "declined").inc()
                return reply(f"The user declined. {name} was NOT run; nothing was changed."), False

        get_stream_writer()({"type": "progress", "content": f"Running {name}…"})
        try:
            result = await tool.run(args, ctx, answer)
        except Exception:
            log.exception("tool_failed", tool=name)
            metrics.TOOL_CALLS.labels(name, "failed").inc()
            return reply(f"The tool {name} failed.", "error"), False
        metrics.TOOL_CALLS.labels(name, "confirmed" if question else "allowed").inc()
        return reply(result), False

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


def new_turn_input(message: str, ac: AcContext, audience: Audience | None = None) -> dict[str, Any]:
    """The graph input for one user message, who sends it and who else reads the answer."""
    return {
        "messages": [HumanMessage(content=message)],
        "ac_context": ac.to_wire(),
        "audience": audience.model_dump(mode="json", by_alias=True) if audience else None,
        "llm_calls": 0,
        "stopped": False,
    }
