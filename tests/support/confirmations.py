"""Reading a confirmation question back the way a person reads it, to prove it shows every
character the call will send (vagent_graph.tools.confirmation's format).

`read_back(question)` parses the argument lines of a question into {path: what is shown};
`expected(arguments)` says what each leaf argument must show. Written from the format's
rules, not from the module's code: a label is code spans joined by `.` and `[i]`, a name in a
span is itself or a JSON string (when it starts with `"`), a value is a code span or a fenced
block, with the notes in parentheses saying how to read it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from vagent_shared.secrets import mask_secrets, secret_name

MASK = "‹hidden: looks like a secret›"
ESCAPED = "invisible characters shown as \\u codes, backslashes doubled"
Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Hidden:
    """A value hidden whole (its name says it is a secret), with its length."""

    chars: int


Shown = str | Hidden


class Unreadable(AssertionError):
    pass


def _span(line: str, pos: int) -> tuple[str, int]:
    """The code span starting at `pos`: its content and the position after it."""
    k = len(line[pos:]) - len(line[pos:].lstrip("`"))
    if k == 0:
        raise Unreadable(f"no code span at {pos}: {line[pos : pos + 40]!r}")
    start = pos + k
    for m in re.finditer(r"`+", line[start:]):
        if len(m.group()) == k:
            content = line[start : start + m.start()]
            if len(content) >= 2 and content.startswith(" ") and content.endswith(" "):
                content = content[1:-1]
            return content, start + m.end()
    raise Unreadable(f"unclosed code span: {line[pos : pos + 40]!r}")


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        return "\\" if m.group() == "\\\\" else chr(int(m.group()[2:], 16))

    return re.sub(r"\\\\|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}", one, text)


def _label(line: str) -> tuple[Path, int]:
    path: list[str | int] = []
    pos = 0
    while True:
        if line.startswith("`", pos):
            name, pos = _span(line, pos)
            path.append(json.loads(name) if name.startswith('"') else name)
        elif m := re.match(r"\[(\d+)\]", line[pos:]):
            path.append(int(m.group(1)))
            pos += m.end()
        else:
            raise Unreadable(f"bad label: {line[:60]!r}")
        if line.startswith(".`", pos):
            pos += 1
        elif not line.startswith("[", pos):
            return tuple(path), pos


def read_back(question: str) -> dict[Path, Shown]:
    """Every argument line of `question` (lines before the first one are the headline and
    notes), by its path."""
    lines = question.split("\n")
    i = next((n for n, line in enumerate(lines) if line.startswith("`")), len(lines))
    out: dict[Path, Shown] = {}
    while i < len(lines):
        line = lines[i]
        path, pos = _label(line)
        rest = line[pos:]
        notes: list[str] = []
        if m := re.match(r" \(([^)]*)\):", rest):
            notes = m.group(1).split("; ")
            rest = rest[m.end() - 1 :]
        if path in out:
            raise Unreadable(f"{path} shown twice")
        if rest == ": *(empty)*":
            out[path] = ""
            i += 1
            continue
        if m := re.fullmatch(r": \*hidden, it looks like a secret \((\d[\d ]*) characters?\)\*", rest):
            out[path] = Hidden(int(m.group(1).replace(" ", "")))
            i += 1
            continue
        if rest.startswith(": `"):
            value, end = _span(rest, 2)
            if end != len(rest):
                raise Unreadable(f"text after the value: {rest[end:]!r}")
            i += 1
        elif rest == ":":
            fence = lines[i + 1]
            if not re.fullmatch(r"`{3,}", fence):
                raise Unreadable(f"no block after {path}")
            close = lines.index(fence, i + 2)
            value = "\n".join(lines[i + 2 : close])
            i = close + 1
        else:
            raise Unreadable(f"bad line: {line[:80]!r}")
        out[path] = _unescape(value) if ESCAPED in notes else value
    return out


def as_text(value: Any) -> str:
    """How a leaf value reads: strings as they are, JSON's words for the rest."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def expected(arguments: dict[str, Any], depth: int = 3) -> dict[Path, Shown]:
    """What each leaf of `arguments` must show: lists and objects element by element down to
    `depth` levels below the argument, secrets masked (whole under a secret's name)."""
    out: dict[Path, Shown] = {}

    def walk(path: Path, value: Any) -> None:
        if len(path) <= depth and isinstance(value, dict) and value:
            for k, v in value.items():
                walk((*path, k), v)
        elif len(path) <= depth and isinstance(value, list) and value:
            for n, v in enumerate(value):
                walk((*path, n), v)
        else:
            text = as_text(value)
            masked_path = tuple(mask_secrets(p, MASK) if isinstance(p, str) else p for p in path)
            secret = any(isinstance(p, str) and secret_name(p) for p in path)
            if secret and text not in ("", "null", "[]", "{}"):
                out[masked_path] = Hidden(len(text))
            else:
                out[masked_path] = mask_secrets(text, MASK)

    for name, value in arguments.items():
        walk((name,), value)
    return out
