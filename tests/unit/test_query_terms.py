"""The full-text terms of a search query: for ANY text, plain RediSearch terms that redisvl
sends unchanged and the query lexer reads as terms, split like the index splits its text.

The oracle for "parses" is RediSearch's query lexer (src/query_parser/v2/lexer.rl): a term
is a run of characters that are not ASCII punctuation, space or control, where `_` also
counts; ASCII punctuation is query syntax, and a lone `_` is skipped as punctuation (so
`@text:(_)` became `@text:()`, a syntax error). The real server is in
tests/integration/test_search_any_text.py.
"""

from __future__ import annotations

import re
import string

from hypothesis import example, given, settings
from hypothesis import strategies as st
from redisvl.query import TextQuery
from redisvl.utils.stopwords import get_stopwords

from vagent_graph.knowledge.retrieval import MAX_QUERY_TERMS, TERM, query_terms

STOPWORDS = set(get_stopwords("english"))
ADVERSARIAL = [
    "_",
    "what does _ mean",
    "__",
    "_ _ _",
    "@title:(x)",
    "a|b",
    "-x",
    "~y",
    "*",
    "%abc%",
    "{a}",
    "[1 2]",
    "\\",
    "\\_",
    '"',
    "'",
    "$p",
    "   ",
    "🙂",
    "INC-0042",
    "w'x'",
    "=> { $weight: 2 }",
    "isempty as inf -inf 1e999",
    "“quoted”",
    "x—y",
    "\x00\x07\x7f",
    "\u200f\u202eשלום\u202c",
    "e\u0301",
    "a\ud800b",
]


def lexer_reads_one_term(term: str) -> bool:
    """RediSearch's query lexer reads `term` as one plain term: no ASCII punctuation (but
    `_`), space or control character, and not a lone `_`."""
    plain = all(not c.isascii() or c.isalnum() or c == "_" for c in term)
    return plain and term != "_" and "".join(term.split()) == term


def redisvl_sends(terms: list[str]) -> str:
    """What redisvl's TextQuery puts in the query for these terms (one field, weight 1)."""
    query = TextQuery(" ".join(terms), text_field_name="text", stopwords=None)
    return str(query.query_string())


def test_known_queries_keep_their_words() -> None:
    assert query_terms("What happened in INC-0042?") == ["happened", "inc", "0042"]
    assert query_terms("TRV-2026?") == ["trv", "2026"]
    assert query_terms("the of and") == []
    assert query_terms("Where is foo_bar set?") == ["foo_bar", "set"]  # one token in the index too
    assert query_terms("__init__ of Module") == ["__init__", "module"]
    assert query_terms("Hindi हिन्दी") == ["hindi", "हिन्दी"]  # vowel signs stay in the word
    assert query_terms("x—y") == ["x—y", "x"]  # the index's token, and the word ("y": stop word)
    assert query_terms("C:\\Temp\\report") == ["c", "temp", "report"]


def test_an_underscore_alone_is_not_a_term() -> None:
    assert query_terms("_") == []
    assert query_terms("what does _ mean") == ["mean"]
    assert query_terms("_ __ ___ 🙂 “” -- ~~") == []


def test_no_more_than_the_maximum_of_terms() -> None:
    words = [f"w{i}" for i in range(MAX_QUERY_TERMS + 10)]
    assert query_terms(" ".join(words)) == words[:MAX_QUERY_TERMS]


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(
        st.text(st.characters(codec=None), max_size=120),  # surrogates included
        st.text(st.sampled_from(string.printable + "_—“”🙂é\u0301\u200b\u00a0ßİ日本"), max_size=60),
        st.lists(st.sampled_from(ADVERSARIAL)).map(" ".join),
    )
)
@example(text="_")
@example(text="what does _ mean")
def test_every_term_of_any_text_is_a_plain_term_redisvl_sends_unchanged(text: str) -> None:
    terms = query_terms(text)
    assert len(terms) <= MAX_QUERY_TERMS
    assert len(set(terms)) == len(terms)
    for term in terms:
        assert TERM.fullmatch(term), term
        assert lexer_reads_one_term(term), term
        assert any(c.isalnum() for c in term), term  # something to find
        assert term not in STOPWORDS and term == term.lower()
        term.encode()  # valid UTF-8: no surrogate
    if terms:
        assert redisvl_sends(terms) == f"@text:({' | '.join(terms)})"


@given(
    st.text(st.sampled_from(string.ascii_letters + string.digits + string.punctuation + " \t\n"), max_size=80)
)
def test_ascii_text_gives_the_words_the_index_has(text: str) -> None:
    """On ASCII text, the terms are exactly the index's tokens (split on punctuation but
    `_`), lower case, those with a letter or digit, without stop words."""
    words = [w.lower() for w in re.findall(r"[A-Za-z0-9_]+", text)]
    expected = [w for w in dict.fromkeys(words) if w not in STOPWORDS and w.strip("_")]
    assert query_terms(text) == expected[:MAX_QUERY_TERMS]
