"""Entity files: JSON and CSV load into the same validated graph; every broken file is refused
with a message that names the file and the row or entity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from vagent_graph.knowledge.entities import (
    Entity,
    EntityFileError,
    EntityGraph,
    Relation,
    load_files,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "entities"
ROOT = Path(__file__).resolve().parents[2]
ENTITIES_HEADER = "id,name,entity_type,tags,description\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def as_sets(graph: EntityGraph) -> tuple[set[str], set[Relation]]:
    return {e.model_dump_json() for e in graph.entities}, set(graph.relations)


def fails(paths: list[Path], *needles: str) -> str:
    with pytest.raises(EntityFileError) as info:
        load_files(paths)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# ---- what loads ------------------------------------------------------------------------------


def test_json_fixture_loads() -> None:
    graph = load_files([FIXTURES / "org.json"])
    assert len(graph.entities) == 6 and len(graph.relations) == 6
    team = next(e for e in graph.entities if e.id == "platform-team")
    assert team.description == 'Builds and runs "Tidewater"; on call: C:\\oncall.'
    assert next(e for e in graph.entities if e.id == "bob-jones").description is None


def test_csv_files_load_the_same_graph_as_json() -> None:
    csv_graph = load_files([FIXTURES / "org_entities.csv", FIXTURES / "org_relations.csv"])
    assert as_sets(csv_graph) == as_sets(load_files([FIXTURES / "org.json"]))
    tidewater = next(e for e in csv_graph.entities if e.id == "tidewater")
    assert tidewater.tags == ["public", "flagship"]  # a comma-separated list inside the field


def test_relations_file_may_come_first_and_point_into_another_file() -> None:
    graph = load_files([FIXTURES / "org_relations.csv", FIXTURES / "org_entities.csv"])
    assert len(graph.relations) == 6


def test_demo_entity_files_load() -> None:
    for name in ("localhost.json", "acme.json"):
        graph = load_files([ROOT / "deploy" / "dev" / "knowledge" / "entities" / name])
        assert graph.entities and graph.relations


def test_csv_details(tmp_path: Path) -> None:
    """BOM, columns in any order, no description column, blank lines, blank tags."""
    text = '\ufefftags,entity_type,name,id\n\n" a , b ,",team,Team A,t-a\n,person,Ann,ann\n\n'
    path = write(tmp_path, "e.csv", text)
    graph = load_files([path])
    assert [(e.id, e.tags, e.description) for e in graph.entities] == [
        ("t-a", ["a", "b"], None),
        ("ann", [], None),
    ]


def test_duplicate_relations_and_tags_count_once(tmp_path: Path) -> None:
    rel = write(tmp_path, "r.csv", "source,target,type\nann,bo,KNOWS\nann,bo,KNOWS\n")
    ent = write(tmp_path, "e.csv", ENTITIES_HEADER + 'ann,Ann,person,"x,x,y",\nbo,Bo,person,,\n')
    graph = load_files([ent, rel])
    assert graph.relations == [Relation(source="ann", target="bo", type="KNOWS")]
    assert graph.entities[0].tags == ["x", "y"]


def test_odd_but_valid_values(tmp_path: Path) -> None:
    """Ids, types and tags may contain query syntax; a name may contain a comma."""
    data = {
        "entities": [
            {"id": 'a|b}"\\$*-', "name": "Acme, Inc.", "entity_type": "with space", "tags": ["x}y", "日本"]},
            {"id": "b", "name": "B", "entity_type": "t", "description": "line 1\nline 2\ttab"},
        ],
        "relations": [{"source": 'a|b}"\\$*-', "target": "b", "type": "Works_on_2"}],
    }
    graph = load_files([write(tmp_path, "odd.json", json.dumps(data))])
    assert graph.entities[0].id == 'a|b}"\\$*-'
    assert graph.entities[1].description == "line 1\nline 2\ttab"


# ---- model rules -----------------------------------------------------------------------------


@pytest.mark.parametrize("rel_type", ["WORKS-ON", "1ST", "_X", "A" * 65, "", "WORKS ON", "X\n", "ÄB"])
def test_relation_types_are_identifiers(rel_type: str) -> None:
    with pytest.raises(ValidationError):
        Relation(source="a", target="b", type=rel_type)


@pytest.mark.parametrize(
    "field, value",
    [
        ("id", "has space"),
        ("id", "a,b"),
        ("id", ""),
        ("id", "tab\there"),
        ("entity_type", "a,b"),
        ("entity_type", " padded"),
        ("name", "line\nbreak"),
        ("name", " padded "),
        ("name", ""),
        ("description", "bell\x07"),
        ("description", "nul\x00"),
    ],
)
def test_entity_fields_are_validated(field: str, value: str) -> None:
    raw = {"id": "a", "name": "A", "entity_type": "t", "tags": [], field: value}
    with pytest.raises(ValidationError):
        Entity.model_validate(raw)


def test_tags_are_labels() -> None:
    for tag in ["a,b", " x", "", "x\n"]:
        with pytest.raises(ValidationError):
            Entity(id="a", name="A", entity_type="t", tags=[tag])


def test_graph_refuses_duplicates_and_dangling_relations() -> None:
    a = {"id": "a", "name": "A", "entity_type": "t"}
    with pytest.raises(ValidationError, match="duplicate entity id 'a'"):
        EntityGraph.model_validate({"entities": [a, a]})
    with pytest.raises(ValidationError, match="unknown entity 'zz'"):
        EntityGraph.model_validate(
            {"entities": [a], "relations": [{"source": "a", "target": "zz", "type": "X"}]}
        )
    with pytest.raises(ValidationError):
        EntityGraph.model_validate({"entities": [{**a, "colour": "red"}]})  # unknown fields are typos


# ---- what is refused, and how it is said -------------------------------------------------------


def test_unreadable_files(tmp_path: Path) -> None:
    fails([tmp_path / "missing.json"], "missing.json", "cannot read")
    fails([tmp_path], str(tmp_path), "cannot read")
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(ENTITIES_HEADER.encode() + "é,x,y,,\n".encode("latin-1"))
    fails([bad], "latin1.csv", "not UTF-8")
    fails([write(tmp_path, "e.txt", "")], "e.txt", "unsupported file type")
    fails([], "no entity files")


def test_bad_json(tmp_path: Path) -> None:
    fails(
        [write(tmp_path, "a.json", '{"entities": [\n  {"id": "x",}\n]}')], "a.json", "invalid JSON", "line 2"
    )
    fails([write(tmp_path, "b.json", "[]")], "b.json", "expected an object")
    fails(
        [write(tmp_path, "c.json", '{"entities": [], "nodes": []}')],
        "c.json",
        "unknown top-level keys",
        "nodes",
    )
    fails([write(tmp_path, "d.json", '{"entities": {}}')], "d.json", "'entities' must be a list")


def test_invalid_entity_in_json_names_it(tmp_path: Path) -> None:
    data = {"entities": [{"id": "ok", "name": "Ok", "entity_type": "t"}, {"id": "bad id", "name": "B"}]}
    message = fails([write(tmp_path, "e.json", json.dumps(data))], "e.json", "entity #2", "'bad id'")
    assert "id" in message


def test_csv_header_problems(tmp_path: Path) -> None:
    fails([write(tmp_path, "a.csv", "id,name,tags\nx,X,\n")], "a.csv", "row 1", "entity_type")
    fails([write(tmp_path, "b.csv", "id,name,entity_type,tags,colour\n")], "b.csv", "unknown ['colour']")
    fails([write(tmp_path, "c.csv", "source,target\n")], "c.csv", "missing ['type']")
    fails([write(tmp_path, "d.csv", "id,id,name,entity_type,tags\n")], "d.csv", "named twice")
    fails([write(tmp_path, "e.csv", "")], "e.csv", "empty CSV")


def test_csv_row_problems(tmp_path: Path) -> None:
    fails([write(tmp_path, "a.csv", ENTITIES_HEADER + "x,X,t,,\ny,Y,t\n")], "a.csv", "row 3", "3 fields")
    fails(
        [write(tmp_path, "b.csv", ENTITIES_HEADER + "x,X,t,,\nbad id,Y,t,,\n")], "b.csv", "row 3", "'bad id'"
    )
    fails([write(tmp_path, "c.csv", "source,target,type\nx,y,NOT-OK\n")], "c.csv", "row 2", "type")


def test_duplicate_ids_name_both_places(tmp_path: Path) -> None:
    one = write(tmp_path, "one.csv", ENTITIES_HEADER + "x,X,t,,\n")
    two = write(tmp_path, "two.csv", ENTITIES_HEADER + "y,Y,t,,\nx,X2,t,,\n")
    fails([one, two], "two.csv: row 3", "duplicate entity id 'x'", "one.csv: row 2")
    fails([write(tmp_path, "three.csv", ENTITIES_HEADER + "z,Z,t,,\nz,Z,t,,\n")], "three.csv: row 3", "'z'")


def test_dangling_relation_names_file_and_row(tmp_path: Path) -> None:
    ent = write(tmp_path, "e.csv", ENTITIES_HEADER + "x,X,t,,\n")
    rel = write(tmp_path, "r.csv", "source,target,type\nx,x,SELF\nx,ghost,KNOWS\n")
    fails([ent, rel], "r.csv: row 3", "x -KNOWS-> ghost", "unknown entity 'ghost'")
    data = {"entities": [], "relations": [{"source": "a", "target": "b", "type": "X"}]}
    fails([write(tmp_path, "r.json", json.dumps(data))], "r.json: relation #1", "unknown entity 'a'")
