"""Markdown as a chat shows it: the HTML of an answer's `formatted_body`, and the status line.

The text comes from an LLM (or quotes a message), so nothing in it may inject markup: raw
HTML is shown as text, links with a scheme clients do not allow become plain text, and
images other than `mxc://` become links. Control characters are dropped everywhere.
Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
import xml.etree.ElementTree as ET
from urllib.parse import urlsplit

import markdown
from markdown.extensions import Extension
from markdown.preprocessors import Preprocessor
from markdown.treeprocessors import Treeprocessor

#: Link schemes kept in formatted_body (what Matrix clients allow); others become text.
SAFE_SCHEMES = frozenset({"http", "https", "mailto", "matrix", "mxc", "magnet", "ftp", "sftp", "xmpp"})

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    """Drop control characters (not tab/newline): invisible, and 6 bytes each in JSON.

    NUL in particular is refused by homeservers backed by PostgreSQL, and STX/ETX are
    Python-Markdown's own placeholder markers.
    """
    return _CONTROL.sub("", text)


def _safe_url(url: str) -> bool:
    return _scheme(url) in SAFE_SCHEMES


class _SafeLinks(Treeprocessor):  # type: ignore[misc]  # markdown ships no type hints
    """Links with a scheme clients do not allow (javascript:, data:, relative) become plain text.

    Images become links: Matrix clients only show `mxc://` images, and fetching an
    arbitrary URL would leak the reader's IP address.
    """

    def run(self, root: ET.Element) -> None:
        for el in root.iter():
            if el.tag == "img":
                src, alt = el.get("src", ""), el.get("alt", "")
                if _scheme(src) == "mxc":
                    continue
                el.attrib.clear()
                el.tag, el.text = "a", alt or src
                if _safe_url(src):
                    el.set("href", src)
                else:
                    el.tag = "span"
            elif el.tag == "a" and not _safe_url(el.get("href", "")):
                el.attrib.clear()
                el.tag = "span"


def _scheme(url: str) -> str:
    squeezed = "".join(ch for ch in url if ord(ch) > 0x20)  # browsers ignore these inside schemes
    try:
        return urlsplit(squeezed).scheme.lower()
    except ValueError:
        return ""


_LIST_START = re.compile(r" {0,3}(?:[-*+]|1\.)[ \t]+\S")  # may interrupt a paragraph (CommonMark)
_LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)[ \t]+\S")


class _ListAfterText(Preprocessor):  # type: ignore[misc]
    """`Steps:` then `- one` on the next line starts a list in CommonMark (and in what LLMs
    write); Python-Markdown needs a blank line first, so one is added. Code blocks are
    already stashed away when this runs."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        in_list = False
        for line in lines:
            if not line.strip():
                in_list = False
            elif _LIST_ITEM.match(line):
                if not in_list and out and out[-1].strip() and _LIST_START.match(line):
                    out.append("")
                in_list = True
            out.append(line)
        return out


class _ChatMarkdown(Extension):  # type: ignore[misc]
    """Markdown as a chat needs it. Raw HTML in the input is shown as text, never passed
    through (the LLM or a quoted message must not inject markup); automatic e-mail links
    are off (their entity "obfuscation" only bloats the event); lists may follow a line
    of text directly."""

    def extendMarkdown(self, md: markdown.Markdown) -> None:
        md.preprocessors.deregister("html_block")
        md.preprocessors.register(_ListAfterText(md), "vagent_list_after_text", 15)  # after fenced code (25)
        md.inlinePatterns.deregister("html")
        md.inlinePatterns.deregister("automail")
        md.treeprocessors.register(_SafeLinks(md), "vagent_safe_links", 5)  # after inline (20)


@functools.cache
def _markdown() -> markdown.Markdown:
    """One converter per process (reset before each use): building one loads five extensions."""
    return markdown.Markdown(extensions=["fenced_code", "tables", "sane_lists", "nl2br", _ChatMarkdown()])


def render_markdown(text: str) -> str:
    """Markdown -> the HTML of formatted_body (fenced code, tables, lists, line breaks kept).

    A single paragraph is returned without its `<p>` wrapper, as Element does for its own
    messages.
    """
    md = _markdown()
    md.reset()
    html: str = md.convert(clean_text(text)).strip()
    if html.startswith("<p>") and html.endswith("</p>") and html.count("<p>") == 1:
        html = html[3:-4]
    return html


_PROGRESS_ESCAPE = re.compile(r"[\\`*\[\]]|(?<!\w)_|_(?!\w)")
MAX_PROGRESS_CHARS = 200


def progress_line(text: str) -> str:
    """A compact italic status shown while tools run, e.g. `_Running database_query…_`.

    One line, at most MAX_PROGRESS_CHARS, Markdown in it escaped so it cannot break the
    italics (an underscore inside a word, as in a tool name, needs no escape).
    """
    words = " ".join(clean_text(text).split()).rstrip(".…").rstrip() or "Working"
    if len(words) > MAX_PROGRESS_CHARS:
        words = words[: MAX_PROGRESS_CHARS - 1].rstrip()
    return f"_{_PROGRESS_ESCAPE.sub(lambda m: chr(92) + m.group(), words)}…_"
