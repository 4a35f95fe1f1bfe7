"""What a confirmation question says. Pure, and the only place such a question is written.

Why one place: "yes" must mean yes to everything the call will do. A tool contributes only
the headline of its question (`Prepared.action`: "Delete 129 records older than 2016-01-01");
every argument the call will run with is listed here, whatever the tool (built-in, plugin or
MCP), so none can be left out, e.g. a ticket description the model filled with a confidential
passage because a document told it to.

Every character that will be sent is shown, or the call is not asked at all:
- names and values alike sit in code spans or fenced blocks, so nothing in them is read as
  formatting, links or mentions (an MCP schema accepts extra keys: a name is as hostile as a
  value). A name that is not plain (white space at its edges or inside, line breaks, quotes,
  invisible characters) is shown as a JSON string, so it reads back exactly;
- values are never cut: a long one is shown whole in a block, with its length. A question
  longer than CONFIRM_MAX_CHARS is not asked; the model is told to shorten the arguments
  (`refusal`). The bot sends a question longer than one Matrix message as a text file;
- invisible characters (bidi overrides, zero-width, variation selectors used to smuggle
  data, blank fillers) are shown as `\\u…` escapes, and the value says so (then its
  backslashes are doubled, so an escape and the same text typed out differ);
- secrets masked: a room must not see a password because a tool takes one. A value kept under
  a secret's name (`password`, `api_key`) is hidden whole; in any other value only the parts
  shaped like a secret (vagent_shared.secrets) are, so a key-shaped word cannot hide the text
  around it. What is hidden is counted: a call hiding more than MAX_HIDDEN_CHARS is not asked
  (a secret-looking name, or a long random-looking run, must not carry a passage unseen).
An argument the headline states itself (`Tool.shows`) is not repeated, but only when the
headline contains its value word for word.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from vagent_shared.secrets import secret_name, secret_spans

#: Values up to this long (on one line, no white space at their edges or doubled) are shown inline.
MAX_INLINE_CHARS = 160
#: A headline states a value itself only if the value is this short.
MAX_HEADLINE_VALUE_CHARS = 80
#: The most characters a question may hide as secrets (by name or by shape), in all: more
#: than any password, key or token; less than a passage worth smuggling.
MAX_HIDDEN_CHARS = 2000
#: Lists and objects are shown element by element down to this depth, deeper ones as JSON.
MAX_DEPTH = 3

_INVISIBLE_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Zl", "Zp", "Cn"}
#: Invisible or blank, though not of those categories: the combining grapheme joiner, Hangul
#: and halfwidth fillers, Khmer inherent vowels, Mongolian selectors, the braille blank.
_BLANK = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0, *range(0x180B, 0x1810)])
_EMOJI_SELECTORS = frozenset([0xFE0E, 0xFE0F])
#: What an emoji's selector follows: symbols (❤ ✔ ©), digits (keycaps), `‼` and the like.
_EMOJI_BASES = frozenset({"So", "Sm", "Sk", "Nd", "Po"})
MASK = "‹hidden: looks like a secret›"


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


def _selector(cp: int) -> bool:
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF


def hidden_at(text: str, i: int) -> bool:
    """Does the character at `i` change or hide what is read, without being seen? (Line breaks
    and tabs are seen.) A text-or-emoji selector right after a symbol, a digit or `#*` (`❤️`,
    `1️⃣`) is fine; any other variation selector is not: a run of them, or one after some
    letters and not others, can carry a message."""
    ch = text[i]
    if ord(ch) in _EMOJI_SELECTORS:
        before = text[i - 1] if i else " "
        return not (before in "#*" or unicodedata.category(before) in _EMOJI_BASES)
    return _unseen(ch)


def _unseen(ch: str) -> bool:
    cp = ord(ch)
    if ch in "\n\t":
        return False
    return _selector(cp) or cp in _BLANK or unicodedata.category(ch) in _INVISIBLE_CATEGORIES


def has_hidden(text: str) -> bool:
    return any(hidden_at(text, i) for i in range(len(text)))


def _escape(ch: str, json_style: bool) -> str:
    cp = ord(ch)
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    if json_style:  # JSON has no \U: a surrogate pair
        cp -= 0x10000
        return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"
    return f"\\U{cp:08x}"


def visible(text: str) -> str:
    """`text` with every invisible character as an escape (line breaks and tabs kept) and,
    when there was one, every backslash doubled: a right-to-left override or a zero-width
    space must not change what the person reads, and the escape must not be confused with
    the same six characters typed out. Unchanged when nothing in it is invisible."""
    if not has_hidden(text):
        return text
    return "".join(
        _escape(ch, False) if hidden_at(text, i) else ch.replace("\\", "\\\\") for i, ch in enumerate(text)
    )


def json_string(text: str) -> str:
    """`text` as a JSON string literal on one line, invisible characters as JSON escapes."""
    raw = json.dumps(text, ensure_ascii=False)
    if not has_hidden(raw):
        return raw
    return "".join(_escape(ch, True) if hidden_at(raw, i) else ch for i, ch in enumerate(raw))


def plain_name(name: str) -> bool:
    """A name shown as it is: one line, no white space at its edges or doubled, nothing
    invisible, no quote to start it or backslash in it (those would read as JSON)."""
    return (
        bool(name)
        and name == name.strip()
        and not re.search(r"\s\s|[\n\r\t\\]", name)
        and not name.startswith('"')
        and not has_hidden(name)
    )


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


@dataclass
class _Masked:
    """A text with its secret-looking parts replaced by MASK, and how many characters that hid."""

    text: str
    hidden: int


def _mask(text: str) -> _Masked:
    out, last, hidden = [], 0, 0
    for start, end in secret_spans(text):
        out += [text[last:start], MASK]
        hidden += end - start
        last = end
    return _Masked("".join([*out, text[last:]]), hidden)


Key = str | int


def label(path: tuple[Key, ...]) -> tuple[str, int]:
    """Where an argument is (`title`, `filter`.`owner`, `options`[0]), each name in a code
    span (a JSON string when not plain), and how many secret-looking characters it hid."""
    parts, hidden = [], 0
    for i, key in enumerate(path):
        if isinstance(key, int):
            parts.append(f"[{key}]")
            continue
        masked = _mask(key)
        hidden += masked.hidden
        shown = masked.text if plain_name(masked.text) else json_string(masked.text)
        parts.append(("." if i else "") + code_span(shown))
    return "".join(parts), hidden


def flatten(path: tuple[Key, ...], value: Any) -> list[tuple[tuple[Key, ...], Any]]:
    """A list or an object argument as one line per element, so each is escaped or masked
    on its own; deeper than MAX_DEPTH as JSON."""
    if len(path) <= MAX_DEPTH and isinstance(value, Mapping) and value:
        return [pair for k, v in value.items() for pair in flatten((*path, str(k)), v)]
    if len(path) <= MAX_DEPTH and isinstance(value, list | tuple) and value:
        return [pair for i, v in enumerate(value) for pair in flatten((*path, i), v)]
    return [(path, value)]


def _secret_path(path: tuple[Key, ...]) -> bool:
    return any(isinstance(k, str) and secret_name(k) for k in path)


@dataclass(frozen=True)
class Line:
    text: str
    hidden: int = 0


def _hide_secret_keys(value: Any) -> tuple[Any, int]:
    """A value deeper than MAX_DEPTH (written as JSON) with every value kept under a
    secret-looking name replaced by MASK, and how many characters that hid."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        hidden = 0
        for k, v in value.items():
            if secret_name(str(k)) and as_text(v) not in ("", "null", "[]", "{}"):
                out[str(k)], hidden = MASK, hidden + len(as_text(v))
            else:
                out[str(k)], inner = _hide_secret_keys(v)
                hidden += inner
        return out, hidden
    if isinstance(value, list | tuple):
        pairs = [_hide_secret_keys(v) for v in value]
        return [v for v, _ in pairs], sum(h for _, h in pairs)
    return value, 0


def render_argument(path: tuple[Key, ...], value: Any) -> Line:
    """One argument as one line (`name: value`) or a line and a block."""
    where, hidden = label(path)
    value, deep_hidden = _hide_secret_keys(value)
    hidden += deep_hidden
    text = as_text(value)
    if _secret_path(path) and text not in ("", "null", "[]", "{}"):
        hidden += len(text)
        return Line(f"{where}: *hidden, it looks like a secret ({characters(len(text))})*", hidden)
    if text == "":
        return Line(f"{where}: *(empty)*", hidden)
    masked = _mask(text)
    shown = visible(masked.text)
    notes = []
    if masked.hidden or deep_hidden:
        notes.append("parts that look like secrets are hidden")
    if shown != masked.text:
        notes.append("invisible characters shown as \\u codes, backslashes doubled")
    inline = (
        len(shown) <= MAX_INLINE_CHARS and shown == shown.strip() and not re.search(r"\s\s|[\n\r\t]", shown)
    )
    if not inline:
        notes.insert(0, characters(len(text)))
    note = f" ({'; '.join(notes)})" if notes else ""
    hidden += masked.hidden
    if inline:
        return Line(f"{where}{note}: {code_span(shown)}", hidden)
    return Line(f"{where}{note}:\n{code_block(shown)}", hidden)


def stated(headline: str, value: Any) -> bool:
    """Does the headline contain this value word for word (not inside another word)?"""
    text = as_text(value)
    if not text or len(text) > MAX_HEADLINE_VALUE_CHARS or has_hidden(text) or secret_spans(text):
        return False
    before, after = r"(?:^|(?<=[\s“\"'(\[]))", r"(?=$|[\s”\"')\],.?!:;])"
    return re.search(before + re.escape(text) + after, headline) is not None


def _shown_name(name: str) -> str:
    return visible(_mask(name).text)


def _shown_value(value: Any, secret: bool) -> Any:
    """One argument's value as data, as the question shows it: under a secret's name (here or
    in an enclosing object) hidden whole; else each string with its secret-looking parts
    masked and its invisible characters as escapes. Numbers, flags and null stay themselves."""
    if secret and as_text(value) not in ("", "null", "[]", "{}"):
        return MASK
    if isinstance(value, Mapping):
        return {_shown_name(str(k)): _shown_value(v, secret or secret_name(str(k))) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shown_value(v, secret) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return visible(_mask(as_text(value)).text)


def shown_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Every argument of a call as data, masked as its question masks them: what a client
    shows as the action "yes" runs (HitlAction.args). Every argument, those the headline
    states too. Masked at every depth (the question writes deep values as JSON text), so it
    may be kept where the question is kept: the checkpoint, the SSE event."""
    return {_shown_name(str(k)): _shown_value(v, secret_name(str(k))) for k, v in arguments.items()}


def shown_action(tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What a confirmation's "yes" runs, as the interrupt value carries it (`actions`)."""
    return {"name": tool, "args": shown_arguments(arguments)}


@dataclass(frozen=True)
class Question:
    """A confirmation question, and how many characters of the arguments it hides as secrets."""

    text: str
    hidden: int = 0


def render_question(
    headline: str,
    arguments: Mapping[str, Any],
    *,
    shows: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> Question:
    """The question: the headline, then each note on its own line, then every argument the
    headline does not state itself."""
    shows = set(shows)
    lines = [Line(visible(headline.strip())), *(Line(visible(n.strip())) for n in notes if n.strip())]
    for name, value in arguments.items():
        if name in shows and stated(headline, value):
            continue
        lines += [render_argument(p, v) for p, v in flatten((name,), value)]
    return Question("\n".join(line.text for line in lines), sum(line.hidden for line in lines))


def question_text(
    headline: str,
    arguments: Mapping[str, Any],
    *,
    shows: Iterable[str] = (),
    notes: Iterable[str] = (),
) -> str:
    """The text of `render_question`."""
    return render_question(headline, arguments, shows=shows, notes=notes).text


@dataclass(frozen=True)
class Unconfirmable:
    """A call whose question cannot be asked: `reason` for the record (`too_long`,
    `hides_too_much`), `text` for the model."""

    reason: str
    text: str


def refusal(tool: str, question: Question, max_chars: int) -> Unconfirmable | None:
    """Why the question cannot be asked, if it cannot: longer than `max_chars`
    (CONFIRM_MAX_CHARS), or hiding more than MAX_HIDDEN_CHARS. None: ask it."""
    if len(question.text) > max_chars:
        return Unconfirmable(
            "too_long",
            f"{tool} was NOT run: its arguments are too long to be confirmed (the question showing "
            f"them would be {len(question.text)} characters, the limit is {max_chars}). Shorten them, "
            f"e.g. summarise long text, and call {tool} again.",
        )
    if question.hidden > MAX_HIDDEN_CHARS:
        return Unconfirmable(
            "hides_too_much",
            f"{tool} was NOT run: {question.hidden} characters of its arguments look like passwords, "
            f"keys or tokens, and a confirmation may hide at most {MAX_HIDDEN_CHARS}. Do not put "
            "secrets or encoded data into arguments.",
        )
    return None


def as_question(action: str) -> str:
    """A headline ("Delete 3 records") as a question ("Delete 3 records?")."""
    action = action.strip().rstrip(".")
    return action if action.endswith("?") else f"{action}?"


def arguments_digest(name: str, arguments: Mapping[str, Any]) -> str:
    """Identifies a call by its tool and exact arguments: a stored confirmation applies only
    to the very same call."""
    raw = json.dumps([name, dict(arguments)], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()
