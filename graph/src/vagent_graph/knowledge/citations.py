"""The answer's "Sources:" list. Pure.

Tools that read documents return the documents they showed the model (ToolResult.sources,
kept on the ToolMessage as its artifact, never sent to the model). Numbers are per turn:
the first document found is [1], and a later search in the same turn continues the count.
The final answer gets the list of what it cites ([n]), or of everything found if it cites
nothing. Only documents a tool returned can be listed, and a tool returns only what every
reader may read, so a citation never names a document someone may not read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from pydantic import BaseModel

from vagent_shared.knowledge import SourceRef

_CITED = re.compile(r"\[(\d{1,3})\]")
SOURCES_HEADING = "Sources:"


def artifact_for(sources: Sequence[SourceRef], scope: BaseModel | None = None) -> dict[str, Any] | None:
    """What a ToolMessage keeps of a tool's sources and of what its result was derived from
    (tools/scope.py), as plain JSON: it is checkpointed."""
    out: dict[str, Any] = {}
    if sources:
        out["sources"] = [s.model_dump() for s in sources]
    if scope is not None:
        out["scope"] = scope.model_dump(mode="json")
    return out or None


def turn_sources(messages: Sequence[AnyMessage]) -> tuple[SourceRef, ...]:
    """Documents the tools of the current turn (since the last human message) returned,
    in order of first appearance, each once."""
    start = 0
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            start = i + 1
            break
    seen: dict[str, SourceRef] = {}
    for m in messages[start:]:
        if not isinstance(m, ToolMessage) or not isinstance(m.artifact, dict):
            continue
        for raw in m.artifact.get("sources") or []:
            try:
                ref = SourceRef.model_validate(raw)
            except ValueError:
                continue
            seen.setdefault(ref.doc_id, ref)
    return tuple(seen.values())


def number_of(ref: SourceRef, known: Sequence[SourceRef]) -> int:
    """The citation number of `ref` in a turn whose sources so far are `known`."""
    for i, k in enumerate(known, 1):
        if k.doc_id == ref.doc_id:
            return i
    return len(known) + 1


def _code(text: str) -> str:
    """`text` as a Markdown code span, whatever backticks it contains."""
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def with_sources(answer: str, sources: Sequence[SourceRef]) -> str:
    """`answer` followed by a short "Sources:" list (nothing when no document was used)."""
    if not sources:
        return answer
    cited = sorted({int(n) for n in _CITED.findall(answer) if 1 <= int(n) <= len(sources)})
    numbers = cited or list(range(1, len(sources) + 1))
    title = _one_line
    lines = [f"- [{n}] {title(sources[n - 1].title)} ({_code(sources[n - 1].doc_id)})" for n in numbers]
    return f"{answer.rstrip()}\n\n{SOURCES_HEADING}\n" + "\n".join(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(untitled)"


def sources_of(message: ToolMessage) -> list[SourceRef]:
    """The sources one tool message carries (for tests and the audit)."""
    return list(turn_sources([message]))


def with_files(answer: str, names: Sequence[str]) -> str:
    """`answer` naming the user's own files it was given (they are no indexed documents)."""
    if not names:
        return answer
    label = "From your attachment" if len(names) == 1 else "From your attachments"
    return f"{answer.rstrip()}\n\n📎 {label}: " + ", ".join(f"`{n}`" for n in names)
