"""The entity filter's Cypher predicate, and the parameter header it travels with. Pure.

The predicate's text must be fixed Cypher plus parameter names whatever the grants say: every
grant value is a parameter. The predicate's MEANING is proven against a real FalkorDB in
tests/integration/test_entity_properties.py; here: its shape, and that no value leaks into it.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.factories import ac
from vagent_graph.knowledge.cypher import cypher_string, cypher_value, params_header
from vagent_graph.knowledge.entity_filter import FALSE, TRUE, entity_predicate
from vagent_graph.knowledge.readers import ENTITY_KINDS, Grants, Readers, readers_for
from vagent_shared.knowledge import Audience, AudienceMember

#: Every token a predicate's text may contain, besides `$parameter` names.
KEYWORDS = {"IN", "OR", "AND", "WHERE", "any", "size", "true", "false", "0", "id", "entity_type", "tags"}
OPERATORS = {"(", ")", ".", ">"}


def readers(*grants: Grants, public_only: bool = False) -> Readers:
    return Readers(domain="acme", grants=grants, public_only=public_only)


def test_two_readers_example() -> None:
    text, params = entity_predicate(
        readers(
            Grants(ids=frozenset({"a", "b"}), classes=frozenset({"person"})), Grants(tags=frozenset({"x"}))
        )
    )
    assert text == (
        "(n.id IN $r0_ids OR n.entity_type IN $r0_types) AND (any(n_tag IN n.tags WHERE n_tag IN $r1_tags))"
    )
    assert params == {"r0_ids": ["a", "b"], "r0_types": ["person"], "r1_tags": ["x"]}


def test_all_three_kinds_and_all_tags() -> None:
    grants = Grants(ids=frozenset({"i"}), classes=frozenset({"c"}), tags=frozenset({"t"}), all_tags=True)
    text, _ = entity_predicate(readers(grants), "x")
    assert text == (
        "(size(x.tags) > 0 OR x.id IN $r0_ids OR x.entity_type IN $r0_types "
        "OR any(x_tag IN x.tags WHERE x_tag IN $r0_tags))"
    )


@pytest.mark.parametrize(
    "everything",
    [Grants(superuser=True), Grants(all_ids=True), Grants(all_classes=True, tags=frozenset({"t"}))],
)
def test_a_reader_who_sees_everything_adds_no_condition(everything: Grants) -> None:
    assert entity_predicate(readers(everything)) == (TRUE, {})
    text, params = entity_predicate(readers(everything, Grants(tags=frozenset({"t"}))))
    assert text == "(any(n_tag IN n.tags WHERE n_tag IN $r1_tags))" and params == {"r1_tags": ["t"]}


def test_public_only() -> None:
    assert entity_predicate(readers(Grants(superuser=True), public_only=True)) == (
        "$public IN n.tags",
        {"public": "public"},
    )
    text, _ = entity_predicate(readers(Grants(classes=frozenset({"c"})), public_only=True))
    assert text == "$public IN n.tags AND (n.entity_type IN $r0_types)"


def test_no_readers_means_no_condition() -> None:
    assert entity_predicate(readers()) == (TRUE, {})


def test_a_reader_who_sees_nothing_makes_it_false() -> None:
    assert entity_predicate(readers(Grants(superuser=True), Grants())) == (FALSE, {})
    # grant values no stored entity can have (control characters) are dropped, never sent
    only_unprintable = Grants(ids=frozenset({"a\nb", ""}), tags=frozenset({"\x00"}))
    assert entity_predicate(readers(only_unprintable)) == (FALSE, {})
    _, params = entity_predicate(readers(Grants(ids=frozenset({"a\nb", "ok"}))))
    assert params == {"r0_ids": ["ok"]}


def test_the_same_params_for_every_variable() -> None:
    r = readers(Grants(ids=frozenset({"a"}), tags=frozenset({"t"})), public_only=True)
    (na, pa), (nb, pb) = entity_predicate(r, "a"), entity_predicate(r, "mid_1")
    assert pa == pb
    assert "mid_1.id IN $r0_ids" in nb and "a.id" not in nb and "a.id IN $r0_ids" in na


@pytest.mark.parametrize("var", ["", "1n", "n)", "n OR true", "n.id", "`n`", "ñ", "a" * 40])
def test_variable_names_are_checked(var: str) -> None:
    with pytest.raises(ValueError):
        entity_predicate(readers(Grants(superuser=True)), var)


def test_readers_for_none_is_decided_before_any_filter() -> None:
    """The tool never builds a predicate for a room with an unresolved member."""
    audience = Audience(members=[AudienceMember(user_id="@x:y", ac_context=None)])
    assert readers_for(ac(instances=["entity:*"]), audience, ENTITY_KINDS) is None


adversarial = st.one_of(
    st.sampled_from(
        ['a"b', "a'b", "\\", '\\"', "}", "|", "*", "-", " ", "$x", "`", "\\n", "ö", "日本", "😀"]
    ),
    st.text(min_size=1, max_size=12),
)
sets = st.frozensets(adversarial, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    grants=st.lists(
        st.builds(Grants, ids=sets, classes=sets, tags=sets, all_tags=st.booleans(), all_ids=st.booleans()),
        max_size=4,
    ),
    public_only=st.booleans(),
)
def test_no_grant_value_ever_reaches_the_query_text(grants: list[Grants], public_only: bool) -> None:
    text, params = entity_predicate(readers(*grants, public_only=public_only), "n")
    for token in re.findall(r"\$?\w+|[^\w\s]", text):
        if token.startswith("$"):
            assert token[1:] in params, token
        else:
            assert token in KEYWORDS | OPERATORS | {"n", "n_tag"}, (token, text)
    values = {v for value in params.values() for v in (value if isinstance(value, list) else [value])}
    for value in values:
        assert isinstance(value, str) and value.isprintable()
    params_header(params)  # every value the filter emits can be sent


# ---- the parameter header -----------------------------------------------------------------------


def test_strings_are_quoted_and_escaped() -> None:
    assert cypher_string('say "hi" \\ bye') == '"say \\"hi\\" \\\\ bye"'
    assert cypher_string("it's $x } |") == '"it\'s $x } |"'
    assert cypher_string("") == '""'


def test_values_and_header() -> None:
    assert cypher_value(None) == "null" and cypher_value(True) == "true" and cypher_value(3) == "3"
    assert cypher_value(["a", 1, [False]]) == '["a",1,[false]]'
    assert cypher_value({"id": "x", "tags": []}) == '{`id`:"x",`tags`:[]}'
    assert params_header({}) == ""
    assert params_header({"q": "a b", "n": 2}) == 'CYPHER `q`="a b" `n`=2 '


@pytest.mark.parametrize("bad", ["nul\x00byte", "lone \ud800 surrogate"])
def test_unsendable_strings_are_refused_before_sending(bad: str) -> None:
    with pytest.raises(ValueError):
        params_header({"q": bad})


@pytest.mark.parametrize("name", ["", "a b", "a`b", "1a", "a-b", "x)", "é"])
def test_parameter_and_key_names_are_identifiers(name: str) -> None:
    with pytest.raises(ValueError):
        params_header({name: 1})
    with pytest.raises(ValueError):
        cypher_value({name: 1})


def test_other_types_are_refused() -> None:
    with pytest.raises(TypeError):
        cypher_value(1.5)
    with pytest.raises(TypeError):
        cypher_value(b"bytes")
