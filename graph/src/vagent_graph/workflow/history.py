"""Keep cost flat as a conversation grows.

Two bounds: what is SENT to the LLM (a token budget, cut at a human turn so no tool
result loses its call) and what is STORED in the checkpoint (a message count; older
turns are removed with RemoveMessage). Dangling tool calls - a call without a result,
left by a cancelled run - are answered as cancelled in what the LLM sees.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)

from vagent_graph.attachments.messages import kept_before
from vagent_graph.observability.tokens import approx_tokens, image_parts

CANCELLED_TOOL_RESULT = "Cancelled: this tool call was not completed (no answer in time)."


#: What a model without vision reads instead of an image an earlier turn sent (LLM_VISION
#: switched off since: a text-only model would refuse the request with the image in it).
UNSEEN_IMAGE = "[An image the user sent earlier is not shown: you cannot see images.]"


def without_images(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """The history with every image part replaced by UNSEEN_IMAGE (same message ids)."""
    out: list[AnyMessage] = []
    for m in messages:
        if isinstance(m.content, str) or not image_parts(m.content):
            out.append(m)
            continue
        parts = [
            {"type": "text", "text": UNSEEN_IMAGE}
            if isinstance(p, dict) and p.get("type") in ("image_url", "image")
            else p
            for p in m.content
        ]
        out.append(m.model_copy(update={"content": parts}))
    return out


def repair_tool_pairs(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """Every tool call answered right after its AIMessage; orphan results dropped."""
    out: list[AnyMessage] = []
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    open_calls: set[str] = set()
    for m in messages:
        if isinstance(m, ToolMessage):
            if m.tool_call_id in open_calls:
                out.append(m)
                open_calls.discard(m.tool_call_id)
            continue
        if isinstance(m, AIMessage) and m.tool_calls:
            out.append(m)
            ids = [str(tc["id"]) for tc in m.tool_calls if tc.get("id")]
            open_calls = set(ids)
            # calls never answered anywhere get a synthetic result right away
            for tc_id in ids:
                if tc_id not in answered:
                    out.append(ToolMessage(content=CANCELLED_TOOL_RESULT, tool_call_id=tc_id))
                    open_calls.discard(tc_id)
            continue
        out.append(m)
    return out


def window_for_llm(messages: Sequence[AnyMessage], max_tokens: int) -> list[AnyMessage]:
    """The most recent turns that fit `max_tokens`, starting at a human message.

    The newest turn is always kept whole even if it alone exceeds the budget, with the
    files sent alone for it (attachments/messages.py).
    """
    msgs = repair_tool_pairs(messages)
    starts = [i for i, m in enumerate(msgs) if isinstance(m, HumanMessage)]
    if not starts:
        return msgs
    sizes = [approx_tokens((m,)) for m in msgs]  # additive: one pass, not one per turn
    chosen = starts[-1]
    while kept_before(msgs, chosen):
        chosen -= 2  # files sent alone for this question belong to its turn
    starts = [i for i in starts if i < chosen] + [chosen]
    used = sum(sizes[chosen:])
    for i in reversed(starts[:-1]):
        used += sum(sizes[i:chosen])  # now the tokens of msgs[i:]
        if used > max_tokens:
            break
        chosen = i
    return msgs[chosen:]


def removals_to_bound(messages: Sequence[AnyMessage], max_messages: int) -> list[RemoveMessage]:
    """RemoveMessage for the oldest turns so at most `max_messages` remain stored.

    Cuts only at a human message, so stored history never starts mid-turn.
    """
    if len(messages) <= max_messages:
        return []
    cut = None
    for i, m in enumerate(messages):
        if isinstance(m, HumanMessage) and len(messages) - i <= max_messages:
            cut = i
            break
    if cut is None:  # one enormous turn: keep from its human message
        cut = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=0)
    return [RemoveMessage(id=m.id) for m in messages[:cut] if m.id]
