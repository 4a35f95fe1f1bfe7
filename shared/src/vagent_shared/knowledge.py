"""Contracts of the knowledge layer: who reads an answer (the room audience), document and
entity metadata, and the bodies of the graph's admin API.

Why the audience is here: the bot knows who is in the room, the graph knows the documents.
The bot resolves every other joined member's AcContext and sends them with the message;
the graph allows only what EVERY reader may read (docs/knowledge.md).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from vagent_shared.access import AcContext

#: Documents carrying this tag are the only ones used in rooms too large to check every member.
PUBLIC_TAG = "public"
#: The separator of the tag list in the document index; a tag may not contain it.
TAG_SEPARATOR = ","
MAX_NAME_CHARS = 200


class AudienceMember(BaseModel):
    """Another joined member of the room. `ac_context` None: the provider gave no usable
    answer for them, so they count as "may read nothing"."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    user_id: str = Field(min_length=1)
    ac_context: AcContext | None = None


class Audience(BaseModel):
    """Who else reads the answer: the other joined members of a group room (not the bot,
    not the sender). Absent (None) in a DM or when AUDIENCE_FILTER is off.

    `public_only`: the room has more members than the bot checks (AUDIENCE_MAX_MEMBERS);
    then only documents tagged `public` are used and `members` is empty.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    members: list[AudienceMember] = Field(default_factory=list)
    public_only: bool = False
    #: Joined members the bot counted, itself and the sender included.
    member_count: int = Field(default=0, ge=0)


def _printable(value: str) -> str:
    if any(not c.isprintable() for c in value):
        raise ValueError("must not contain control characters or line breaks")
    return value


def _no_outer_space(value: str) -> str:
    if value != value.strip():
        raise ValueError("must not start or end with whitespace")
    return value


def _no_space(value: str) -> str:
    if any(c.isspace() for c in value):
        raise ValueError("must not contain whitespace")
    return value


def _no_separator(value: str) -> str:
    if TAG_SEPARATOR in value:
        raise ValueError(f"must not contain {TAG_SEPARATOR!r}")
    return value


#: A document id or domain: printable, no whitespace (grants are `document:{id}`), no tag
#: separator (the index stores it in a TAG field).
DocId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS),
    AfterValidator(_printable),
    AfterValidator(_no_space),
    AfterValidator(_no_separator),
]
Domain = DocId
#: A display name: printable, no surrounding whitespace (commas allowed: "Acme, Inc.").
Name = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS),
    AfterValidator(_printable),
    AfterValidator(_no_outer_space),
]
#: A category or tag: a Name without the tag separator.
Label = Annotated[Name, AfterValidator(_no_separator)]

DocumentFormat = Literal["markdown", "text", "html", "pdf", "docx"]


class DocumentInfo(BaseModel):
    """One ingested document, as `vagent docs list` and the admin API show it."""

    doc_id: DocId
    domain: Domain
    title: str
    category: Label
    tags: list[Label] = Field(default_factory=list)
    source: str = ""
    format: DocumentFormat
    chunks: int = Field(ge=0)
    sha256: str
    embedding_model: str
    ingested_at: datetime


class DocumentList(BaseModel):
    documents: list[DocumentInfo]


class DeleteResult(BaseModel):
    doc_id: str
    domain: str
    deleted_chunks: int


class EntityLoadResult(BaseModel):
    domain: str
    entities: int
    relations: int
    replaced: bool


class SearchHit(BaseModel):
    """One retrieved chunk (what search_documents shows the model, with its source)."""

    doc_id: str
    domain: str
    title: str
    section: str = ""
    category: str = ""
    tags: list[str] = Field(default_factory=list)
    position: int = Field(ge=0)
    text: str
    score: float


class SourceRef(BaseModel):
    """A cited document: what the "Sources:" list names."""

    doc_id: str
    title: str


class IndexStatus(BaseModel):
    """What the document index was built with (it refuses to mix embedding models)."""

    index: str
    embedding_model: str | None
    dimensions: int | None
    documents: int
    chunks: int
    kind: Literal["documents"] = "documents"
