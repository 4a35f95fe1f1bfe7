"""What the human approves, and whether that approval still holds. Pure.

A confirmation is saved in the run's state (`AgentState.action`) BEFORE it is asked: the exact
question shown, which call it is for (id, tool, a digest of the exact arguments), the action
"yes" runs as the question shows it (its arguments masked alike) and the plan, plus who read
the room then. On resume the answer applies to that record, never to
a question rebuilt from a world that may have changed (LangGraph re-runs the interrupted node
from its top).

Personal results (a tool acting with the asker's credential or returning the asker's data) in a
room where others read the answer need the asker's yes too (PERSONAL_RESULTS_IN_GROUPS=ask): the
question says to how many others it will be shown, and if more people read the room when the
answer comes, it is asked again.
"""

from __future__ import annotations

from typing import Any

from vagent_graph.tools import Prepared, Tool
from vagent_graph.tools.confirmation import (
    Unconfirmable,
    arguments_digest,
    as_question,
    refusal,
    render_question,
    shown_action,
)
from vagent_shared.knowledge import Audience

Approval = dict[str, Any]


def in_group(audience: Audience | None) -> bool:
    """Do other people read the answer?"""
    return audience is not None and (audience.public_only or bool(audience.members))


def others_count(audience: Audience | None) -> int:
    if audience is None:
        return 0
    if audience.public_only:
        return max(audience.member_count - 2, 0)  # neither the bot nor the asker
    return len(audience.members)


def readers_changed(approval: Approval, audience: Audience | None) -> bool:
    """Does somebody read the answer now who was not counted when the question was asked?"""
    if audience is None:
        return False
    if approval.get("public_only"):
        return audience.member_count > int(approval.get("member_count") or 0)
    if audience.public_only:
        return True
    return not {m.user_id for m in audience.members} <= set(approval.get("readers") or ())


def matches(
    approval: Approval | None,
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
    origin: str | None = None,
) -> bool:
    """Is `approval` the one for this very call, with these very arguments, on the very
    server (`origin`: an MCP tool's server) the question was asked for?"""
    return (
        approval is not None
        and approval.get("call_id") == call_id
        and approval.get("tool") == tool
        and approval.get("origin") == origin
        and approval.get("digest") == arguments_digest(tool, arguments)
    )


def approval_for(
    call_id: str,
    tool: Tool,
    arguments: dict[str, Any],
    prepared: Prepared,
    audience: Audience | None,
    *,
    confirm: bool,
    personal: bool,
    notes: tuple[str, ...] = (),
    max_chars: int = 20_000,
) -> Approval | Unconfirmable:
    """The record of one question: its text (tools/confirmation.py writes it: every argument shown)
    and what "yes" to it runs. `confirm`: the tool needs a yes anyway; `personal`: its result
    will be shown to the room's other members. Unconfirmable when the question cannot show
    everything: longer than `max_chars` (CONFIRM_MAX_CHARS), or hiding too much as secrets."""
    lines = list(notes)
    headline = as_question(prepared.action)
    if personal:
        n = others_count(audience)
        label = f"what {tool.name} returns for you"
        if tool.personal_label is not None:
            label = tool.personal_label(tool.args_model.model_validate(arguments))
        whom = f"the {n} other member{'' if n == 1 else 's'} of this room"
        if confirm:
            lines.append(f"This will also show {label} to {whom}.")
        else:
            headline = f"This will show {label} to {whom}. Go ahead?"
    question = render_question(headline, arguments, shows=tool.shows, notes=lines)
    refused = refusal(tool.name, question, max_chars)
    if refused is not None:
        return refused
    return {
        "call_id": call_id,
        "tool": tool.name,
        "origin": tool.origin,
        "digest": arguments_digest(tool.name, arguments),
        "question": question.text,
        # What "yes" runs, as data, masked like the question (a LangGraph client's
        # `action_requests`); kept with the question it belongs to.
        "actions": [shown_action(tool.name, arguments)],
        "plan": prepared.plan,
        "readers": sorted(m.user_id for m in audience.members) if audience else [],
        "public_only": bool(audience and audience.public_only),
        "member_count": audience.member_count if audience else 0,
    }
