"""The answer's "Sources:" list and the passages the search tool shows the model. Pure."""

from __future__ import annotations

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from vagent_graph.knowledge.citations import artifact_for, turn_sources, with_sources
from vagent_graph.knowledge.retrieval import Candidate, fuse, query_terms
from vagent_graph.tools.documents import format_hits
from vagent_shared.knowledge import SearchHit, SourceRef

TRAVEL = SourceRef(doc_id="travel-policy", title="Travel policy")
Q3 = SourceRef(doc_id="q3-press", title="Q3 press summary")


def hit(doc_id: str, title: str, text: str = "…", position: int = 0) -> SearchHit:
    return SearchHit(doc_id=doc_id, domain="acme", title=title, position=position, text=text, score=0.1)


def tool_msg(*refs: SourceRef) -> ToolMessage:
    return ToolMessage(
        content="passages", tool_call_id="c", name="search_documents", artifact=artifact_for(refs)
    )


def test_the_answer_lists_what_it_cites() -> None:
    out = with_sources("The per diem is 60 EUR [1].", [TRAVEL, Q3])
    assert out == "The per diem is 60 EUR [1].\n\nSources:\n- [1] Travel policy (`travel-policy`)"


def test_without_citations_every_document_found_is_listed() -> None:
    out = with_sources("Here is what I found.", [TRAVEL, Q3])
    assert out.endswith("- [1] Travel policy (`travel-policy`)\n- [2] Q3 press summary (`q3-press`)")


def test_no_documents_no_list_and_made_up_numbers_are_ignored() -> None:
    assert with_sources("Hello [3].", []) == "Hello [3]."
    assert with_sources("See [7] and [2].", [TRAVEL, Q3]).endswith("- [2] Q3 press summary (`q3-press`)")


def test_odd_ids_and_titles_stay_readable_markdown() -> None:
    odd = SourceRef(doc_id="we`ird", title="Multi\nline  title")
    assert with_sources("x [1]", [odd]).endswith("- [1] Multi line title (``we`ird``)")


def test_sources_of_the_current_turn_only_in_order_once() -> None:
    messages: list[AnyMessage] = [
        HumanMessage(content="old question"),
        tool_msg(Q3),
        AIMessage(content="old answer"),
        HumanMessage(content="new question"),
        tool_msg(TRAVEL, Q3),
        tool_msg(Q3, TRAVEL),
        ToolMessage(content="no artifact", tool_call_id="d"),
    ]
    assert turn_sources(messages) == (TRAVEL, Q3)


def test_numbers_continue_across_searches_of_one_turn() -> None:
    first = format_hits([hit("travel-policy", "Travel policy")], (), in_room=False)
    assert first.text.splitlines()[2].startswith("[1] Travel policy")
    second = format_hits(
        [hit("q3-press", "Q3 press summary"), hit("travel-policy", "Travel policy", position=3)],
        first.sources,
        in_room=False,
    )
    lines = [ln for ln in second.text.splitlines() if ln.startswith("[")]
    assert lines[0].startswith("[2] Q3 press summary") and lines[1].startswith("[1] Travel policy")
    assert turn_sources([HumanMessage(content="q"), tool_msg(*first.sources), tool_msg(*second.sources)]) == (
        TRAVEL,
        Q3,
    )


def test_nothing_found_reads_the_same_whatever_the_reason() -> None:
    alone = format_hits([], (), in_room=False)
    assert alone.text == "No passages in the documents you may read match this search." and not alone.sources
    assert "everyone in this room" in format_hits([], (), in_room=True).text


def test_query_terms_split_codes_like_the_index_does() -> None:
    assert query_terms("What happened in INC-0042?") == ["happened", "inc", "0042"]
    assert query_terms("the of and") == []


def cand(key: str, similarity: float | None = None) -> Candidate:
    return Candidate(key, {}, similarity)


def test_rank_fusion_rewards_agreement_and_keeps_exact_text_matches() -> None:
    vector = [cand("a", 0.9), cand("b", 0.8), cand("c", 0.1)]
    text = [cand("b"), cand("d")]
    fused = [c.key for c, _ in fuse(vector, text, 10)]
    assert fused[0] == "b"  # found by both
    assert "d" in fused  # only full text found it (an exact code, say)
    assert "c" not in fused  # only the vector found it, and it is not similar at all


def test_one_long_document_does_not_crowd_out_the_others() -> None:
    long_doc = [Candidate(f"p{i}", {"doc_id": "press"}, 0.9 - i / 100) for i in range(6)]
    other = [Candidate("f0", {"doc_id": "financials"}, 0.5), Candidate("f1", {"doc_id": "financials"}, 0.49)]
    fused = [c.key for c, _ in fuse([*long_doc, *other], [], 5)]
    assert fused == ["p0", "p1", "f0", "f1"]
