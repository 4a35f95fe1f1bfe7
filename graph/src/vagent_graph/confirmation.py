"""What a confirmation question says. Pure, and the only place such a question is written.

Why one place: "yes" must mean yes to everything the call will do. A tool contributes only
the headline of its question (`Prepared.action`: "Delete 129 records older than 2016-01-01");
every argument the call will run with is listed here, whatever the tool (built-in, plugin or
MCP), so none can be left out, e.g. a ticket description the model filled with a confidential
passage because a document told it to.

How values are shown (readably, in the Markdown the bot renders):
- each in a code span or a fenced block, so nothing in it is read as formatting, links or
  mentions; control and invisible characters (bidi overrides, zero-width) as escapes;
- long values cut in the middle with "…", showing the start, the end and the full length;
- secrets masked: a room must not see a password because a tool takes one. A value kept under
  a secret's name (`password`, `api_key`) is hidden whole; in any other value only the parts
  shaped like a secret (vagent_shared.secrets) are, so a key-shaped word cannot hide the text
  around it (a copied passage stays readable).
An argument the headline states itself (`Tool.shows`) is not repeated, but only when the
headline contains its value word for word.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any

from vagent_shared.secrets import mask_secrets, secret_name

#: Values up to this long (on one line) are shown whole, inline.
MAX_INLINE_CHARS = 160
#: Longer values: shown whole up to this many characters, in a block.
MAX_SHOWN_CHARS = 1200
#: What a cut value keeps of its start and of its end.
HEAD_CHARS, TAIL_CHARS = 800, 200
#: A headline states a value itself only if the value is this short.
MAX_HEADLINE_VALUE_CHARS = 80

_INVISIBLE = {"Cc", "Cf", "Co", "Cs", "Zl", "Zp"}


def as_text(value: Any) -> str:
    """An argument value as the person will read it."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def visible(text: str) -> str:
    """Control and invisible characters (but line breaks and tabs) as escapes: a right-to-left
    override or a zero-width space must not change what the person reads."""
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch) not in _INVISIBLE:
            out.append(ch)
        else:
            cp = ord(ch)
            out.append(f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}")
    return "".join(out)


def cut(text: str) -> str:
    """`text`, or its start and end around "…" when it is longer than MAX_SHOWN_CHARS."""
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:HEAD_CHARS]} … {text[-TAIL_CHARS:]}"


def code_span(text: str) -> str:
    """`text` as a Markdown code span, whatever backticks it contains."""
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str) -> str:
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


def characters(n: int) -> str:
    return "1 character" if n == 1 else f"{n:,} characters".replace(",", " ")


MASK = "‹hidden: looks like a secret›"


def render_argument(name: str, value: Any) -> str:
    """One argument as one line (`name: value`) or a line and a block."""
    text = as_text(value)
    if secret_name(name) and text not in ("", "null", "[]", "{}"):
        return f"{name}: *hidden, it looks like a secret ({characters(len(text))})*"
    if text == "":
        return f"{name}: *(empty)*"
    masked = mask_secrets(text, MASK)
    shown = visible(cut(masked))
    note = " (parts that look like secrets are hidden)" if masked != text else ""
    if len(masked) <= MAX_INLINE_CHARS and "\n" not in masked:
        return f"{name}{note}: {code_span(shown)}"
    size = f" ({characters(len(text))}, shortened)" if len(masked) > MAX_SHOWN_CHARS else ""
    return f"{name}{size}{note}:\n{code_block(shown)}"


def flatten(name: str, value: Any, depth: int = 0) -> list[tuple[str, Any]]:
    """A list or an object argument as one line per element (`options[0]`, `filter.owner`),
    so each is cut, escaped or masked on its own."""
    if depth < 3 and isinstance(value, Mapping) and value:
        return [pair for k, v in value.items() for pair in flatten(f"{name}.{k}", v, depth + 1)]
    if depth < 3 and isinstance(value, list | tuple) and value:
        return [pair for i, v in enumerate(value) for pair in flatten(f"{name}[{i}]", v, depth + 1)]
    return [(name, value)]


def stated(headline: str, value: Any) -> bool:
    """Does the headline contain this value word for word (not inside another word)?"""
    text = as_text(value)
    if not text or len(text) > MAX_HEADLINE_VALUE_CHARS or visible(text) != text:
        return False
    before, after = r"(?:^|(?<=[\s“\"'(\[]))", r"(?=$|[\s”\"')\],.?!:;])"
    return re.search(before + re.escape(text) + after, headline) is not None


def question_text(
    headline: str,
    arguments: Mapping[str, Any],
    *,
    shows: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> str:
    """The question: the headline, then each note on its own line, then every argument the
    headline does not state itself."""
    shows = set(shows)
    lines = [visible(headline.strip()), *(visible(n.strip()) for n in notes if n.strip())]
    for name, value in arguments.items():
        if name in shows and stated(headline, value) and mask_secrets(as_text(value)) == as_text(value):
            continue
        lines += [render_argument(n, v) for n, v in flatten(name, value)]
    return "\n".join(lines)


def as_question(action: str) -> str:
    """A headline ("Delete 3 records") as a question ("Delete 3 records?")."""
    action = action.strip().rstrip(".")
    return action if action.endswith("?") else f"{action}?"


def arguments_digest(name: str, arguments: Mapping[str, Any]) -> str:
    """Identifies a call by its tool and exact arguments: a stored confirmation applies only
    to the very same call."""
    raw = json.dumps([name, dict(arguments)], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()
