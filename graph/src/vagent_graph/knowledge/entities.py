"""Knowledge-graph entities and relations: the validated model, and loading it from files.

Ids, types and tags use the same validators as documents (`DocId`, `Label`), because grants
name them (`entity:<id>`, `entity_type:<type>`, `entity_tag:<tag>`): an id with whitespace
could never be granted, a tag with a comma could not be listed in a CSV cell. Relation types
are plain identifiers, so they never need quoting anywhere.

Files: JSON (`{"entities": [...], "relations": [...]}`, the admin API's body too) and CSV
(an entities file `id,name,entity_type,tags[,description]` or a relations file
`source,target,type`, told apart by the header). Every error names the file and the row or
entity, so a data owner can fix the file without reading code.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from vagent_shared.knowledge import TAG_SEPARATOR, DocId, Label, Name

MAX_DESCRIPTION_CHARS = 4000
MAX_TAGS = 64
#: Line breaks and tabs are fine in a description; other control characters are not.
_DESCRIPTION_CONTROLS_OK = frozenset("\n\t")


def _description(value: str) -> str:
    if any(not c.isprintable() and c not in _DESCRIPTION_CONTROLS_OK for c in value):
        raise ValueError("must not contain control characters other than line breaks and tabs")
    return value


#: A display name: printable (commas allowed: "Acme, Inc."), no surrounding whitespace.
EntityName = Name
Description = Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS), AfterValidator(_description)]
#: WORKS_ON, LEADS, CUSTOMER_OF ...: an identifier, never quoted or escaped anywhere.
RelationType = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")]


class Entity(BaseModel):
    """One node of a domain's knowledge graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: DocId
    name: EntityName
    entity_type: Label
    tags: list[Label] = Field(default_factory=list, max_length=MAX_TAGS)
    description: Description | None = None

    @field_validator("tags")
    @classmethod
    def _unique_tags(cls, tags: list[str]) -> list[str]:
        """A tag listed twice means nothing more; keep the first order for display."""
        return list(dict.fromkeys(tags))

    @field_validator("description")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value if value and value.strip() else None


class Relation(BaseModel):
    """A directed, typed edge: `source —type→ target`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: DocId
    target: DocId
    type: RelationType


class EntityGraph(BaseModel):
    """A whole (or partial, for a merge) domain graph: unique ids, relations only between
    listed entities (a dangling edge would point at something nobody can check access to)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entities: list[Entity] = Field(default_factory=list)
    relations: list[Relation] = Field(default_factory=list)

    @field_validator("relations")
    @classmethod
    def _unique_relations(cls, relations: list[Relation]) -> list[Relation]:
        """The same edge twice is one edge (two files may both state it)."""
        return list(dict.fromkeys(relations))

    @model_validator(mode="after")
    def _consistent(self) -> EntityGraph:
        ids: set[str] = set()
        for e in self.entities:
            if e.id in ids:
                raise ValueError(f"duplicate entity id {e.id!r}")
            ids.add(e.id)
        for r in self.relations:
            for end in (r.source, r.target):
                if end not in ids:
                    raise ValueError(f"relation {r.source} -{r.type}-> {r.target}: unknown entity {end!r}")
        return self


class EntityLookup(BaseModel):
    """What a lookup found among the entities the readers may see: the `matches` of the
    query, the `neighbours` the `relations` reach, and whether a size bound cut anything."""

    matches: list[Entity] = Field(default_factory=list)
    neighbours: list[Entity] = Field(default_factory=list)
    relations: list[Relation] = Field(default_factory=list)
    truncated: bool = False


class EntityFileError(ValueError):
    """A file that cannot be loaded; the message names the file and the row or entity."""


# ---- loading files ---------------------------------------------------------------------------

ENTITY_COLUMNS = ("id", "name", "entity_type", "tags")
ENTITY_OPTIONAL = ("description",)
RELATION_COLUMNS = ("source", "target", "type")


@dataclass(frozen=True)
class _Located:
    """An entity or relation with where it came from, for error messages across files."""

    item: Entity | Relation
    where: str


def load_files(paths: Iterable[Path]) -> EntityGraph:
    """Entities and relations of several files as one graph (ids unique across all files,
    relations may point at entities of another file)."""
    entities: dict[str, _Located] = {}
    relations: list[_Located] = []
    paths = list(paths)
    if not paths:
        raise EntityFileError("no entity files given")
    for path in paths:
        for found in _parse_file(path):
            if isinstance(found.item, Relation):
                relations.append(found)
            elif (first := entities.get(found.item.id)) is not None:
                raise EntityFileError(
                    f"{found.where}: duplicate entity id {found.item.id!r} (also {first.where})"
                )
            else:
                entities[found.item.id] = found
    return _combine(entities, relations)


def _combine(entities: dict[str, _Located], relations: list[_Located]) -> EntityGraph:
    for found in relations:
        rel = found.item
        assert isinstance(rel, Relation)
        for end in (rel.source, rel.target):
            if end not in entities:
                raise EntityFileError(
                    f"{found.where}: relation {rel.source} -{rel.type}-> {rel.target}: unknown entity {end!r}"
                )
    return EntityGraph.model_validate(
        {"entities": [f.item for f in entities.values()], "relations": [f.item for f in relations]}
    )


def _parse_file(path: Path) -> list[_Located]:
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return list(_parse_json(path, text))
    if suffix == ".csv":
        return list(_parse_csv(path, text))
    raise EntityFileError(f"{path}: unsupported file type {path.suffix!r} (use .json or .csv)")


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise EntityFileError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise EntityFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _problem(exc: ValidationError) -> str:
    """The first validation problem in one line: `field: message`."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def _parse_json(path: Path, text: str) -> Iterator[_Located]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EntityFileError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise EntityFileError(f'{path}: expected an object {{"entities": [...], "relations": [...]}}')
    unknown = sorted(set(data) - {"entities", "relations"})
    if unknown:
        raise EntityFileError(f"{path}: unknown top-level keys {unknown} (expected entities, relations)")
    for key in ("entities", "relations"):
        if not isinstance(data.get(key, []), list):
            raise EntityFileError(f"{path}: {key!r} must be a list")
    for i, raw in enumerate(data.get("entities", [])):
        where = f"{path}: entity #{i + 1}{_id_note(raw)}"
        yield _Located(_validate(Entity, raw, where), where)
    for i, raw in enumerate(data.get("relations", [])):
        where = f"{path}: relation #{i + 1}"
        yield _Located(_validate(Relation, raw, where), where)


def _id_note(raw: Any) -> str:
    return f" ({raw['id']!r})" if isinstance(raw, dict) and isinstance(raw.get("id"), str) else ""


def _validate(model: type[Entity] | type[Relation], raw: Any, where: str) -> Entity | Relation:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise EntityFileError(f"{where}: {_problem(exc)}") from None


def _parse_csv(path: Path, text: str) -> Iterator[_Located]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise EntityFileError(f"{path}: empty CSV file (expected a header row)") from None
    except csv.Error as exc:
        raise EntityFileError(f"{path}: row 1: {exc}") from None
    kind = _csv_kind(path, header)
    try:
        for row in reader:
            if not any(field.strip() for field in row):
                continue  # blank lines (a trailing one is common)
            yield _csv_row(path, reader.line_num, header, row, kind)
    except csv.Error as exc:
        raise EntityFileError(f"{path}: row {reader.line_num}: {exc}") from None


def _csv_kind(path: Path, header: list[str]) -> type[Entity] | type[Relation]:
    """Which file this is, from its header: exactly the known columns, in any order."""
    columns = set(header)
    if len(columns) != len(header):
        raise EntityFileError(f"{path}: row 1: a column is named twice: {header}")
    kind: type[Entity] | type[Relation]
    expected: tuple[str, ...]
    optional: tuple[str, ...]
    if columns & set(RELATION_COLUMNS) and not columns & {"id", "name"}:
        kind, expected, optional, want = Relation, RELATION_COLUMNS, (), ",".join(RELATION_COLUMNS)
    else:
        kind, expected, optional = Entity, ENTITY_COLUMNS, ENTITY_OPTIONAL
        want = ",".join(ENTITY_COLUMNS) + "[,description]"
    missing = sorted(set(expected) - columns)
    unknown = sorted(columns - set(expected) - set(optional))
    if missing or unknown:
        raise EntityFileError(
            f"{path}: row 1: expected the columns {want}; missing {missing}, unknown {unknown}"
        )
    return kind


def _csv_row(
    path: Path, line: int, header: list[str], row: list[str], kind: type[Entity] | type[Relation]
) -> _Located:
    where = f"{path}: row {line}"
    if len(row) != len(header):
        raise EntityFileError(f"{where}: {len(row)} fields, but the header has {len(header)}")
    raw: dict[str, Any] = dict(zip(header, row, strict=True))
    if kind is Entity:
        raw["tags"] = [t.strip() for t in raw["tags"].split(TAG_SEPARATOR) if t.strip()]
        raw["description"] = raw.get("description") or None
        where = f"{where}{_id_note(raw)}"
    return _Located(_validate(kind, raw, where), where)
