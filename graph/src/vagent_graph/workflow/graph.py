r"""The agent workflow: its state, the model node, the tools node, the routes between them,
and the graph built from them. What one tool call goes through is in tool_calls.py; the
tools themselves live in tools/.

    START -> agent --(tool calls)--> tools --(more calls)--> tools
                 \                      \--(all answered)--> agent
                  \--(final answer)--> END     \--(question cancelled)--> END

`tools` handles ONE call per step, so a resume re-runs only that call's
question-building code, never an already executed tool.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import structlog
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.config import get_stream_writer
from langgraph.constants import TAG_NOSTREAM
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph

from vagent_graph.agents.descriptor import AgentDescriptor
from vagent_graph.attachments.messages import turn_files
from vagent_graph.knowledge.citations import turn_sources, with_files, with_sources
from vagent_graph.memory.commands import MEMORY_OFF
from vagent_graph.memory.memories import Memories, Prefetch
from vagent_graph.memory.recall import CONFIG_KEY as MEMORY_KEY
from vagent_graph.memory.recall import (
    MemoryRun,
    memory_run_of,
    question_of,
    remembered_lines,
    with_memories,
    with_remembered,
)
from vagent_graph.memory.rules import union_scope
from vagent_graph.models.listener import listening
from vagent_graph.models.llm import stall_limit
from vagent_graph.models.reasoning import without_reasoning
from vagent_graph.models.stall_guard import StallGuard
from vagent_graph.models.text import text_of
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import CONFIG_KEY as TURN_KEY
from vagent_graph.observability.recorder import TurnRecorder, turn_of
from vagent_graph.observability.spans import llm_span, tool_span, tool_step
from vagent_graph.observability.usage import (
    OUTPUT_ALLOWANCE,
    BudgetSpent,
    Hold,
    Refusal,
    Scope,
    Usage,
    prompt_tokens,
    refusal_message,
)
from vagent_graph.services import Services
from vagent_graph.services.audit import audit
from vagent_graph.tools import Question, Tool, ToolContext, ToolRegistry
from vagent_graph.tools.scope import WITHHELD, Readership, ResultScope, scope_of, visible_history
from vagent_graph.workflow.access import visible_tools
from vagent_graph.workflow.answer_stream import AnswerStream
from vagent_graph.workflow.history import (
    CANCELLED_TOOL_RESULT,
    removals_to_bound,
    window_for_llm,
    without_images,
)
from vagent_graph.workflow.hitl import ask_human
from vagent_graph.workflow.tool_calls import Confirm, PersonalResults, ToolCalls, pending_calls
from vagent_shared.access import AcContext
from vagent_shared.hitl import YES, YES_NO
from vagent_shared.knowledge import Audience
from vagent_shared.memory import Forget, Memory, parse_memory_command
from vagent_shared.settings import GraphSettings
from vagent_shared.traces import SourceTrace

log = structlog.get_logger(__name__)


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    #: The AcContext of the current request (camelCase JSON); replaced by every request.
    #: (Who else reads the answer is in the run's config, `audience`: never checkpointed.)
    ac_context: dict[str, Any]
    llm_calls: int
    stopped: bool
    #: The confirmation being asked for the next tool call (tool_calls.py, `Confirm`): the
    #: exact question shown and the plan "yes" runs, saved BEFORE the question is asked, so a
    #: resume never rebuilds (and never changes) what the human is answering.
    action: dict[str, Any] | None
    #: The turn this run belongs to (its TurnTrace, observability/trace_store.py): a resume continues it.
    turn_id: str


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
    #: TOOL_IMAGE_MAX_BYTES: a larger image a tool returns is not posted into the room.
    tool_image_max_bytes: int = 5 * 1024 * 1024
    #: CONFIRM_MAX_CHARS: a longer confirmation question is not asked (the model shortens).
    confirm_max_chars: int = 20_000
    #: OTEL_CAPTURE_CONTENT: free-text tool arguments are kept in turn traces too.
    capture_content: bool = False
    #: LLM_VISION: the model sees images (else none is ever sent to it, history included).
    vision: bool = False
    #: Token usage and budgets (usage.py; None: nothing counted, no limits).
    usage: Usage | None = None
    #: Memory that follows the person (memory/; None: the agent does not enable it).
    memories: Memories | None = None


class Workflow:
    """The nodes and routes, over what the graph is built with (`deps`)."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.calls = ToolCalls(
            deps.registry,
            deps.agent,
            deps.services,
            deps.credential_help,
            deps.personal_results,
            deps.tool_image_max_bytes,
            deps.confirm_max_chars,
            deps.capture_content,
        )

    # ---- the model node ----------------------------------------------------------------
    async def agent(self, state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        """The model's next step: the final answer (naming its sources), or tool calls."""
        agent = self.deps.agent
        calls = state.get("llm_calls", 0)
        if calls >= agent.max_turns:
            stop = (
                f"I stopped after {agent.max_turns} steps without a final answer. "
                "Please ask again, more specifically."
            )
            return {"messages": [AIMessage(content=stop)]}
        ac = AcContext.model_validate(state.get("ac_context") or {})
        # What the readers of THIS answer may read: results of earlier turns (or of this one,
        # before a pause) retrieved for other readers are withheld (tools/scope.py).
        readership = Readership(ac, audience_of(config))
        messages = visible_history(state.get("messages", []), readership.may_read)
        # What the asker's memory holds that everyone reading now heard (memory/rules.py).
        recalled = await self._recall(readership, messages, config)
        # The system prompt and the history's window: what the call is held for and then sent.
        window = window_for_llm(messages, agent.history.max_context_tokens)
        system = with_memories(agent.system_prompt, recalled)
        prompt: list[AnyMessage] = [SystemMessage(content=system), *window]
        # The tools it is offered: their schemas are sent with it, so held for and charged too.
        tools = visible_tools(self.deps.registry, agent, ac)
        sent = prompt_tokens(prompt, [t.openai_schema() for t in tools]) if self.deps.usage else 0
        hold = await self._reserve(ac, sent, calls, config)
        if isinstance(hold, dict):  # a budget is spent: no LLM call, the turn ends here
            return hold
        self._offered(ac, session_of(config), tools)
        try:
            ai = await self._counted_call(tools, prompt, config, hold, sent)
        except BudgetSpent as spent:  # a retry the budget could not hold was not sent
            return self._spent(ac, config, spent.refusal, calls, "no retry was made")
        if ai.tool_calls:
            return {"messages": [ai], "llm_calls": calls + 1}
        sources = turn_sources(messages)
        if sources:  # the final answer names the documents it used
            ai = ai.model_copy(update={"content": with_sources(text_of(ai), sources)})
        files = turn_files(messages)
        documents = [str(f["name"]) for f in files if f.get("kind") == "document"]
        turn = turn_of(config)
        if turn is not None:  # the files it was given, kept from an earlier message too
            for f in files:
                turn.source(SourceTrace(kind="file", id=str(f["name"]), title=str(f["name"])))
        if documents:  # ... and the user's own files it was given
            ai = ai.model_copy(update={"content": with_files(text_of(ai), documents)})
        remembered = remembered_lines(messages)
        if remembered:  # nothing is remembered silently: the exact text, in the answer
            ai = ai.model_copy(update={"content": with_remembered(text_of(ai), remembered)})
        notice = await self.deps.usage.notice(hold) if self.deps.usage and hold else None
        if notice:  # 80% of the user's day, told once that day
            ai = ai.model_copy(update={"content": f"{text_of(ai)}\n\n{notice}"})
        removals = removals_to_bound([*state.get("messages", []), ai], agent.history.max_messages)
        return {"messages": [ai, *removals], "llm_calls": calls + 1}

    # ---- memory (memory/, docs/memory.md) -----------------------------------------------
    async def _recall(
        self, readership: Readership, messages: list[AnyMessage], config: RunnableConfig
    ) -> list[Memory]:
        """The memories this conversation may recall, once per run; none when memory is off
        or the store fails (the turn goes on without them)."""
        memories = self.deps.memories
        run = memory_run_of(config)
        if memories is None or not memories.policy.recall_k:
            return []
        if run.recalled is not None:
            return run.recalled
        try:
            found = await memories.recall(
                readership,
                session_of(config),
                question_of(messages),
                unchecked=run.unchecked,
                prefetched=run.prefetched,
            )
        except Exception as exc:  # the type only: a message could quote a memory
            log.warning("memory_recall_failed", error_type=type(exc).__name__)
            run.recalled = []
            return []
        run.recalled = found.memories
        turn = turn_of(config)
        if turn is not None:
            turn.recalled(found.memories)
        return found.memories

    # ---- budgets (usage.py, docs/budgets.md) ---------------------------------------------
    async def _reserve(
        self, ac: AcContext, sent: int, calls: int, config: RunnableConfig
    ) -> Hold | dict[str, Any] | None:
        """Before an LLM call: its hold on the user's and the tenant's budgets (the prompt
        sent, `sent` tokens with the tools' schemas, and its answer), or the turn's end when
        one is spent (or llm_calls_per_turn is reached). A step already chosen (a tool call)
        has run by now: a turn crossing the limit stops here, cleanly."""
        usage = self.deps.usage
        if usage is None:
            return None
        per_turn = usage.budgets.policy().llm_calls_per_turn
        if per_turn is not None and calls >= per_turn:
            stop = (
                f"I stopped after {per_turn} model calls without a final answer (the limit per "
                "question). Please ask again, more specifically."
            )
            return self._over_budget(ac, config, "llm_calls_per_turn", stop, {"limit": per_turn})
        found = await usage.reserve(ac.user_id, ac.active_acl_domain, sent + OUTPUT_ALLOWANCE)
        if isinstance(found, Refusal):
            return self._spent(ac, config, found, calls, "no LLM call was made")
        return found

    def _spent(
        self, ac: AcContext, config: RunnableConfig, found: Refusal, calls: int, what: str
    ) -> dict[str, Any]:
        """The turn ends on a spent budget (`what` did not happen), telling the user whose."""
        text = refusal_message(found.scope, found.limit, mid_turn=calls > 0)
        spent = {"limit": found.limit, "used": found.used}
        return self._over_budget(ac, config, found.scope, text, spent, what)

    def _over_budget(
        self,
        ac: AcContext,
        config: RunnableConfig,
        scope: Scope | str,
        text: str,
        metadata: dict[str, Any],
        what: str = "no LLM call was made",
    ) -> dict[str, Any]:
        """The turn ends with `text`, audited `budget_exceeded`, recorded as over budget."""
        metrics.BUDGET_REFUSALS.labels(scope).inc()
        audit(
            self.deps.services,
            "budget_exceeded",
            ac,
            session_of(config),
            resource=f"budget:{scope}",
            decision="denied",
            reason=f"{scope} budget spent: {what}",
            metadata=metadata,
        )
        turn = turn_of(config)
        if turn is not None:
            turn.force("over_budget", "budget_exceeded")
        return {"messages": [AIMessage(content=text)]}

    async def _counted_call(
        self,
        tools: list[Tool],
        prompt: list[AnyMessage],
        config: RunnableConfig,
        hold: Hold | None,
        sent: int,
    ) -> AIMessage:
        """The model call, charged however it ends (answered, failed, stopped: usage.py's
        `metered`), its holds freed."""
        usage = self.deps.usage
        if usage is None or hold is None:
            return await self._call_model(tools, prompt, config)
        return await usage.metered(
            hold, self.deps.model_label, sent, lambda: self._call_model(tools, prompt, config)
        )

    def _offered(self, ac: AcContext, session_id: str, tools: list[Tool]) -> list[Tool]:
        """The record that these tools (the ones this user may see) were offered."""
        deps = self.deps
        audit(
            deps.services,
            "tool_offered",
            ac,
            session_id,
            resource=f"agent:{deps.agent.id}",
            decision="allowed",
            metadata=offered_metadata(tools),
        )
        return tools

    async def _call_model(
        self, tools: list[Tool], prompt: list[AnyMessage], config: RunnableConfig
    ) -> AIMessage:
        """The model's reply to `prompt` (the system prompt and the history's window), offered
        `tools`; counted (calls, tokens)."""
        deps = self.deps
        model: Any = deps.llm.bind_tools([t.openai_schema() for t in tools]) if tools else deps.llm
        if not deps.vision:  # images of turns before LLM_VISION was switched off
            prompt = without_images(prompt)
        started = time.perf_counter()
        stream = answer_stream(config)
        if stream is not None:  # its text reaches the run's stream coalesced, never per chunk
            config = merge_configs(config, {"callbacks": [stream], "tags": [TAG_NOSTREAM]})
        limit = stall_limit(deps.llm)
        # A streamed call silent for LLM_TIMEOUT_SECONDS ends (ModelStalled, a TimeoutError):
        # one timer per call, fed by AnswerStream's chunk times (stall_guard.py).
        guard: AbstractAsyncContextManager[object] = (
            StallGuard(limit, stream) if stream is not None and limit else nullcontext()
        )
        try:
            with llm_span(deps.model_label, deps.llm, prompt, len(tools)) as span:
                try:  # `stream`: the chunks are streamed (and seen by AnswerStream) by any model
                    async with guard:
                        # its chunks reach `stream` as deltas (lean_stream.py); once its text
                        # is out, the model's socket is read once per window (read_pacing.py)
                        with listening(stream):
                            ai: AIMessage = await model.ainvoke(prompt, config, stream=stream is not None)
                finally:
                    if stream is not None:
                        stream.close()  # what is held goes out, however the call ended
                span.answered(ai)
        except Exception:
            metrics.LLM_CALLS.labels(deps.model_label, "error").inc()
            raise
        metrics.LLM_CALLS.labels(deps.model_label, "ok").inc()
        turn = turn_of(config)
        if turn is not None:
            first = stream.first_chunk if stream is not None else None
            turn.llm_call(deps.model_label, ai, started, time.perf_counter(), first_chunk=first)
        if ai.usage_metadata:
            metrics.LLM_TOKENS.labels(deps.model_label, "input").inc(ai.usage_metadata["input_tokens"])
            metrics.LLM_TOKENS.labels(deps.model_label, "output").inc(ai.usage_metadata["output_tokens"])
        return without_reasoning(ai)  # the history (and the room) never carry the thinking

    # ---- the tools node ----------------------------------------------------------------
    async def tools(self, state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        """The next pending tool call (tool_calls.py): its result, or the question to save."""
        messages = state.get("messages", [])
        pending = pending_calls(messages)
        if not pending:
            return {}
        ac = AcContext.model_validate(state.get("ac_context") or {})
        audience = audience_of(config)
        visible = visible_history(messages, Readership(ac, audience).may_read)
        ctx = ToolContext(
            ac=ac,
            session_id=session_of(config),
            services=self.deps.services,
            audience=audience,
            sources=turn_sources(visible),
            seen=seen_scope(visible, ac.active_acl_domain),
            audience_unchecked=memory_run_of(config).unchecked,
        )
        with tool_span(pending[0], self.deps.registry) as span:
            step = await self.calls.execute(pending[0], ctx, state.get("action"))
            tool_step(span, step)
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

    # ---- `!forget all` (memory/commands.py: the other memory commands need no yes) --------
    async def forget_all(self, state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        """All of the asker's memories deleted, after a yes (asked with the count found now;
        re-run from the top on resume, so nothing before the question changes anything)."""
        ac = AcContext.model_validate(state.get("ac_context") or {})
        memories = self.deps.memories
        if memories is None:
            return {"messages": [AIMessage(content=MEMORY_OFF)]}
        count = len(await memories.store.all_of(ac.user_id, ac.active_acl_domain))
        if not count:
            return {"messages": [AIMessage(content="You have no memories to forget.")]}
        one = "your 1 memory" if count == 1 else f"all {count} of your memories"
        question = Question(text=f"Forget {one}, in every room? This cannot be undone.", options=list(YES_NO))
        answer = ask_human(question, self.deps.agent.hitl.timeout_seconds)
        if answer is None:
            return {"messages": [AIMessage(content="No answer in time: nothing was forgotten.")]}
        if answer != YES:
            return {"messages": [AIMessage(content="You said no; nothing was forgotten.")]}
        done = await memories.forget_all(ac, session_of(config))
        return {"messages": [AIMessage(content=f"Forgot {done} memor{'y' if done == 1 else 'ies'}.")]}

    # ---- the routes (async: LangGraph runs a plain function in a worker thread) ----------
    @staticmethod
    async def at_start(state: AgentState) -> str:
        """`!forget all` goes to its question; everything else to the model."""
        last = state["messages"][-1] if state.get("messages") else None
        if isinstance(last, HumanMessage) and isinstance(last.content, str):
            if parse_memory_command(last.content) == Forget(None):
                return "forget_all"
        return "agent"

    @staticmethod
    async def after_agent(state: AgentState) -> str:
        last = state["messages"][-1] if state.get("messages") else None
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    @staticmethod
    async def after_tools(state: AgentState) -> str:
        if state.get("stopped"):
            return END
        return "tools" if pending_calls(state.get("messages", [])) else "agent"


def offered_metadata(tools: list[Tool]) -> dict[str, Any]:
    """The `tool_offered` record: the tools, and the MCP servers they come from (if any)."""
    servers = sorted({t.server for t in tools if t.server})
    return {"tools": [t.name for t in tools], **({"mcp_servers": servers} if servers else {})}


def build_graph(deps: Deps, checkpointer: BaseCheckpointSaver[Any] | None) -> CompiledStateGraph[Any]:
    wf = Workflow(deps)
    g = StateGraph(AgentState)
    g.add_node("agent", wf.agent)
    g.add_node("tools", wf.tools)
    g.add_node("forget_all", wf.forget_all)
    g.add_conditional_edges(START, wf.at_start, ["agent", "forget_all"])
    g.add_edge("forget_all", END)
    g.add_conditional_edges("agent", wf.after_agent, ["tools", END])
    g.add_conditional_edges("tools", wf.after_tools, ["tools", "agent", END])
    return g.compile(checkpointer=checkpointer)


# ---- starting a run ------------------------------------------------------------------------
def new_turn_input(message: str, ac: AcContext, turn_id: str = "") -> dict[str, Any]:
    """The graph input for one user message and who sends it (and the turn it starts)."""
    return {
        "messages": [HumanMessage(content=message)],
        "ac_context": ac.to_wire(),
        "llm_calls": 0,
        "stopped": False,
        "action": None,
        "turn_id": turn_id,
    }


def seen_scope(visible: list[AnyMessage], domain: str) -> ResultScope:
    """What the model has seen in this conversation: the union of the scopes of the tool
    results it may still see (a withheld one it does not see)."""
    return union_scope(
        (scope_of(m) for m in visible if isinstance(m, ToolMessage) and m.content != WITHHELD), domain
    )


def run_config(
    session_id: str,
    audience: Audience | None = None,
    turn: TurnRecorder | None = None,
    *,
    audience_unchecked: bool = False,
    coalesce_ms: int | None = None,
    prefetched: Prefetch | None = None,
) -> RunnableConfig:
    """A session's run: its LangGraph thread, who else reads the answer, the recorder of the
    turn (observability/recorder.py), and a bound on the steps of one run. The audience and
    the recorder travel in the config, not the state, so no checkpoint keeps other people's
    ids or roles (the audience is sent again with every request, answers too) and no
    checkpoint holds a trace (LangGraph copies only plain str/number config values into a
    checkpoint's metadata).
    `coalesce_ms`: STREAM_COALESCE_MS (None: its default); `prefetched`: the memory prefetch
    started for the message (memory/memories.py)."""
    configurable: dict[str, Any] = {
        "thread_id": session_id,
        "audience": audience,
        MEMORY_KEY: MemoryRun(unchecked=audience_unchecked, prefetched=prefetched),
    }
    if coalesce_ms is not None:
        configurable[_WINDOW_KEY] = StreamWindow(coalesce_ms / 1000)
    if turn is not None:
        configurable[TURN_KEY] = turn
    return {"configurable": configurable, "recursion_limit": 100}


#: STREAM_COALESCE_MS (seconds) for a run whose config does not say (`run_config`).
DEFAULT_COALESCE = GraphSettings.model_fields["STREAM_COALESCE_MS"].default / 1000
_WINDOW_KEY = "stream_window"


@dataclass(frozen=True)
class StreamWindow:
    """How long the answer's text is coalesced (an object, not a number: LangGraph copies
    plain config values into a checkpoint's metadata)."""

    seconds: float


def answer_stream(config: RunnableConfig) -> AnswerStream | None:
    """The model call's text writer onto the run's custom stream (None outside a graph run:
    a node called directly). Its window: the run's `StreamWindow`, else the default."""
    try:
        write = get_stream_writer()
    except RuntimeError:
        return None
    found = config.get("configurable", {}).get(_WINDOW_KEY)
    window = found.seconds if isinstance(found, StreamWindow) else DEFAULT_COALESCE
    return AnswerStream(write, window)


def session_of(config: RunnableConfig) -> str:
    return str(config.get("configurable", {}).get("thread_id", ""))


def audience_of(config: RunnableConfig) -> Audience | None:
    """Who else reads the answer (None: a DM), as the request sent it."""
    audience = config.get("configurable", {}).get("audience")
    return audience if isinstance(audience, Audience) else None
