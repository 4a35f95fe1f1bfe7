"""Cost stays flat: what is sent to the LLM and what is stored are both bounded."""

from __future__ import annotations

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from vagent_graph.attachments.messages import FILES_KEY, KEPT_KEY, turn_files
from vagent_graph.observability.tokens import IMAGE_PART_TOKENS, approx_tokens
from vagent_graph.workflow.history import (
    CANCELLED_TOOL_RESULT,
    UNSEEN_IMAGE,
    removals_to_bound,
    repair_tool_pairs,
    window_for_llm,
    without_images,
)


def turns(n: int, words: int = 50) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(n):
        out.append(HumanMessage(content=f"question {i} " + "w " * words, id=f"h{i}"))
        out.append(
            AIMessage(
                content="",
                id=f"a{i}",
                tool_calls=[{"name": "database_query", "args": {"sql": "select 1"}, "id": f"c{i}"}],
            )
        )
        out.append(ToolMessage(content="1", tool_call_id=f"c{i}", id=f"t{i}"))
        out.append(AIMessage(content=f"answer {i} " + "w " * words, id=f"f{i}"))
    return out


def test_llm_window_fits_budget_and_starts_with_a_human_turn() -> None:
    msgs = turns(100)
    window = window_for_llm(msgs, max_tokens=500)
    assert isinstance(window[0], HumanMessage)
    assert window[-1].id == "f99"
    assert len(window) < 40
    # every tool result in the window still has its call
    calls = {tc["id"] for m in window if isinstance(m, AIMessage) for tc in m.tool_calls}
    assert all(m.tool_call_id in calls for m in window if isinstance(m, ToolMessage))


def test_llm_window_takes_every_whole_turn_that_fits() -> None:
    msgs = turns(30)
    for budget in (300, 1000, 2500, 10_000):
        window = window_for_llm(msgs, max_tokens=budget)
        assert approx_tokens(window) <= budget
        start = len(msgs) - len(window)
        if start > 0:  # one more turn (4 messages) would not fit
            assert approx_tokens(msgs[start - 4 :]) > budget
    assert window_for_llm(msgs, max_tokens=10_000) == msgs


def test_newest_turn_is_kept_even_when_over_budget() -> None:
    msgs = turns(3, words=5000)
    assert window_for_llm(msgs, max_tokens=10)[0].id == "h2"


def test_dangling_tool_calls_are_answered_as_cancelled() -> None:
    msgs: list[AnyMessage] = [
        HumanMessage(content="delete", id="h"),
        AIMessage(
            content="",
            id="a",
            tool_calls=[
                {"name": "delete_records", "args": {}, "id": "c1"},
                {"name": "database_query", "args": {}, "id": "c2"},
            ],
        ),
        ToolMessage(content="done", tool_call_id="c2", id="t2"),
        HumanMessage(content="next", id="h2"),
        ToolMessage(content="orphan", tool_call_id="zzz", id="t9"),
    ]
    fixed = repair_tool_pairs(msgs)
    results = {m.tool_call_id: m.content for m in fixed if isinstance(m, ToolMessage)}
    assert results == {"c1": CANCELLED_TOOL_RESULT, "c2": "done"}
    assert fixed[-1].id == "h2"


def test_stored_history_is_cut_at_a_human_message() -> None:
    msgs = turns(30)
    removals = removals_to_bound(msgs, max_messages=40)
    kept = [m for m in msgs if m.id not in {r.id for r in removals}]
    assert len(kept) <= 40
    assert isinstance(kept[0], HumanMessage)
    assert removals_to_bound(msgs[:8], max_messages=40) == []


def test_an_image_part_costs_a_fixed_budget_not_its_base64() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + "A" * 400_000}}
    with_image = HumanMessage(content=[{"type": "text", "text": "what is this?"}, image])
    assert approx_tokens([with_image]) == 4 + len("what is this?") // 4 + IMAGE_PART_TOKENS


def test_files_sent_alone_stay_in_the_window_with_the_question_they_were_kept_for() -> None:
    big = "x " * 20_000  # ~10k tokens: more than the whole budget
    kept = HumanMessage(content=big, additional_kwargs={FILES_KEY: [{"name": "a.pdf", "kind": "document"}]})
    reply = AIMessage(content="Got a.pdf — what should I do with it?", additional_kwargs={KEPT_KEY: True})
    history: list[AnyMessage] = [*turns(3), kept, reply, HumanMessage(content="summarise it")]
    window = window_for_llm(history, max_tokens=2000)
    assert window[:3] == [kept, reply, history[-1]]
    assert turn_files(window) == [{"name": "a.pdf", "kind": "document"}]
    # a file kept for an EARLIER question is an old turn like any other
    later = [*history, AIMessage(content="Done."), HumanMessage(content="next")]
    assert window_for_llm(later, max_tokens=2000)[0].content == "summarise it"
    assert turn_files(later) == []


def test_without_vision_no_image_of_an_earlier_turn_reaches_the_model() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    shot = HumanMessage(content=[{"type": "text", "text": "what is this?"}, image], id="h1")
    history: list[AnyMessage] = [
        shot,
        AIMessage(content="A chart.", id="a1"),
        HumanMessage(content="and now?"),
    ]
    clean = without_images(history)
    assert clean[0].content == [
        {"type": "text", "text": "what is this?"},
        {"type": "text", "text": UNSEEN_IMAGE},
    ]
    assert clean[0].id == "h1" and clean[1:] == history[1:]
    assert shot.content[1] == image  # the checkpointed message is untouched
