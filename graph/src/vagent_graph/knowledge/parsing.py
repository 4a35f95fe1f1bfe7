"""Document parsing for ingestion: the bytes of a Markdown, text, HTML, PDF or Word (.docx) file
become a title and sections (heading path + text). Pure: no I/O besides the bytes passed in.

Why sections: chunks never span two sections (chunking.py), so every retrieved chunk carries the
heading path it came from. Why DocumentError everywhere: the operator reads the message in the
CLI or the HTTP answer, so it must name the file and say what is wrong, never show a traceback.

Why the parser libraries are imported where they are used: a file a user attaches is read in a
short-lived process of its own (vagent_graph.attachments.worker), which should load only the
parser of that file's format (pypdf alone takes 0.1 s to import).
"""

from __future__ import annotations

import codecs
import io
import logging
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from bs4 import BeautifulSoup
    from bs4.element import PageElement, Tag
    from docx.table import Table
    from docx.text.paragraph import Paragraph
    from markdown_it.token import Token
    from pypdf import PdfReader

    from vagent_shared.knowledge import DocumentFormat


def quiet_parsers() -> None:
    """pypdf logs a warning for every oddity of a damaged file; the file's one clear
    DocumentError is what the operator needs. Called once by the processes that parse."""
    logging.getLogger("pypdf").setLevel(logging.ERROR)


class DocumentError(ValueError):
    """A file that cannot be ingested; the message is short, names the file and is safe to show."""


@dataclass(frozen=True)
class Section:
    """Text under one heading path (outermost first; empty for text before any heading)."""

    headings: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class ParsedDocument:
    title: str
    format: DocumentFormat
    sections: list[Section]
    #: A PDF read only up to `max_chars`: how many pages it has (its sections are the first).
    total_pages: int | None = None


_EXTENSIONS: Final[dict[str, DocumentFormat]] = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".text": "text",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
    ".docx": "docx",
}
_CONTENT_TYPES: Final[dict[str, DocumentFormat]] = {
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/plain": "text",
    "text/html": "html",
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
}
_SUPPORTED: Final = (
    "Markdown (.md, .markdown), text (.txt, .text), HTML (.html, .htm), PDF (.pdf), Word (.docx)"
)
_MAX_LABEL_CHARS: Final = 200


def detect_format(filename: str, content_type: str | None = None) -> DocumentFormat:
    """The format by content type when it is a known one (an upload's type is more reliable than
    its name), else by extension."""
    if content_type:
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type in _CONTENT_TYPES:
            return _CONTENT_TYPES[media_type]
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    what = f"content type {_label(content_type)}" if content_type else "file type"
    raise DocumentError(f"{_label(filename)}: unsupported {what}; supported: {_SUPPORTED}")


def parse_document(
    data: bytes, fmt: DocumentFormat, name: str, *, max_chars: int | None = None
) -> ParsedDocument:
    """Parse one file. Every failure, including a parser library's, is a DocumentError.

    `max_chars`: a PDF's pages are extracted only until that much text is there (the rest
    would be cut anyway: a chat attachment's budget); its `total_pages` then says how many
    there are. Extracting is what costs with PDFs (13 s and ~7x the file in memory for a
    20 MB one, bench-attachments)."""
    label = _label(name)
    if not data:
        raise DocumentError(f"{label}: the file is empty")
    if fmt == "pdf":
        doc = _parse_pdf(data, label, _stem(label), max_chars)
    elif fmt == "docx":
        doc = _parse_docx(data, label, _stem(label))
    elif fmt in ("markdown", "text", "html"):
        text = _decode(data, label, html=fmt == "html")
        doc = _parse_text_format(text, fmt, label, _stem(label))
    else:
        raise DocumentError(f"{label}: unknown format {str(fmt)[:20]!r}; supported: {_SUPPORTED}")
    if not any(section.text.strip() for section in doc.sections):
        raise DocumentError(f"{label}: the document contains no text")
    return doc


def _parse_text_format(text: str, fmt: DocumentFormat, label: str, stem: str) -> ParsedDocument:
    if fmt == "text":
        return ParsedDocument(stem, fmt, [Section((), _tidy(text))])
    try:
        return _parse_markdown(text, stem) if fmt == "markdown" else _parse_html(text, stem)
    except Exception as exc:  # the parsers' own failures (e.g. absurd nesting) are not ours to show
        kind = "Markdown" if fmt == "markdown" else "HTML"
        raise DocumentError(f"{label}: the {kind} could not be parsed") from exc


def _label(name: str) -> str:
    """The file name as messages show it: printable and bounded (it may come from an upload)."""
    printable = "".join(c for c in name if c.isprintable()).strip()
    return printable[:_MAX_LABEL_CHARS] or "document"


def _stem(label: str) -> str:
    """The fallback title: the file name without folders and extension."""
    return PurePosixPath(label.replace("\\", "/")).stem.strip() or label


# --- text: decoding and normalisation ---------------------------------------------------------

_LINE_BREAKS = re.compile("\r\n?|[\x0b\x0c\x85\u2028\u2029]")
#: C0/C1 controls except \t and \n (line breaks are handled above), and lone surrogates (which
#: could not be encoded again as UTF-8 downstream).
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff]")
_BLANK_LINES = re.compile(r"\n{3,}")


def _normalise(text: str) -> str:
    """One line-break convention, no control characters, no trailing spaces, at most one blank
    line in a row, so the same content always chunks the same."""
    text = _CONTROLS.sub("", _LINE_BREAKS.sub("\n", text))
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text)


def _tidy(text: str) -> str:
    return _normalise(text).strip("\n")


def _decode(data: bytes, label: str, *, html: bool) -> str:
    """UTF-8 (BOM removed) or UTF-16 with a BOM; an HTML file may declare another charset."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        text = _try_decode(data, "utf-16")
        if text is None:
            raise DocumentError(f"{label}: starts with a UTF-16 byte order mark but is not UTF-16 text")
    else:
        text = _try_decode(data, "utf-8-sig")
        if text is None and html:
            text = _decode_declared(data)
        if text is None:
            raise DocumentError(f"{label}: the file is not UTF-8 text (save it as UTF-8 and try again)")
    if "\x00" in text:
        raise DocumentError(f"{label}: this is a binary file (it contains NUL bytes), not text")
    return text


def _try_decode(data: bytes, encoding: str) -> str | None:
    try:
        return data.decode(encoding)
    except (UnicodeError, LookupError):
        return None


#: Codecs Python knows that are not web page charsets.
_NOT_CHARSETS: Final = frozenset({"unicode-escape", "raw-unicode-escape", "idna", "punycode", "utf-7"})
#: Browsers read these labels as windows-1252 (WHATWG Encoding), which is what authors mean.
_WINDOWS_1252_ALIASES: Final = frozenset({"iso8859-1", "ascii"})


def _decode_declared(data: bytes) -> str | None:
    """The charset of `<meta charset>` (or http-equiv), when it is an ASCII-compatible one."""
    from bs4.dammit import EncodingDetector

    declared = EncodingDetector.find_declared_encoding(data, is_html=True)
    if not declared:
        return None
    try:
        codec = codecs.lookup(declared).name
        if codec in _NOT_CHARSETS or "<p>".encode(codec) != b"<p>":
            return None
    except (LookupError, UnicodeError):
        return None
    if codec in _WINDOWS_1252_ALIASES:
        return _try_decode(data, "cp1252") or _try_decode(data, codec)
    return _try_decode(data, codec)


# --- Markdown ---------------------------------------------------------------------------------


def _parse_markdown(text: str, stem: str) -> ParsedDocument:
    """Headings found by a CommonMark parser, so `#` in a code fence is not one; the bodies are
    the source lines between headings, so lists, tables and code blocks stay as written."""
    from markdown_it import MarkdownIt

    source = _strip_front_matter(_normalise(text))
    lines = source.split("\n")
    tokens = MarkdownIt("commonmark").enable("table").parse(source)
    builder = _SectionBuilder()
    cursor = 0
    for index, token in enumerate(tokens):
        if token.level != 0 or token.map is None:
            continue  # a heading quoted or inside a list item stays body text
        start, end = token.map
        if token.type == "heading_open":
            builder.add("\n".join(lines[cursor:start]))
            cursor = end
            builder.heading(int(token.tag[1]), _inline_text(tokens[index + 1]))
        elif token.type == "html_block" and _is_invisible_html(token.content):
            builder.add("\n".join(lines[cursor:start]))
            cursor = end
    builder.add("\n".join(lines[cursor:]))
    sections = builder.finish(_tidy)
    return ParsedDocument(builder.title or stem, "markdown", sections)


#: The first line of YAML front matter: a `key:` or a `#` comment.
_FRONT_MATTER_START = re.compile(r"[\w\"'-][^:\n]*:|#")


def _strip_front_matter(text: str) -> str:
    """YAML front matter: `---` on the first line, a `key:` (or comment) line next, up to `---`
    or `...`. The second check keeps a document that merely opens with a thematic break intact."""
    if not text.startswith("---\n") or not _FRONT_MATTER_START.match(text, 4):
        return text
    pos = 4
    while (end := text.find("\n", pos)) >= 0:
        if text[pos:end] in ("---", "..."):
            return text[end + 1 :]
        pos = end + 1
    return "" if text[pos:] in ("---", "...") else text


def _inline_text(inline: Token) -> str:
    """A heading's plain text: markup dropped, code and image alt text kept."""
    parts: list[str] = []
    for child in inline.children or []:
        if child.type in ("text", "text_special", "code_inline", "image"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())


def _is_invisible_html(block: str) -> bool:
    """Raw HTML a reader of the rendered page never sees (authoring comments, scripts)."""
    return block.lstrip().lower().startswith(("<!--", "<script", "<style"))


class _SectionBuilder:
    """Collects body text and splits it into sections at headings, keeping the heading path."""

    def __init__(self) -> None:
        self.sections: list[tuple[tuple[str, ...], str]] = []
        self.path: list[tuple[int, str]] = []
        self.parts: list[str] = []
        self.first_h1 = ""
        self.first_heading = ""

    def add(self, text: str) -> None:
        self.parts.append(text)

    def heading(self, level: int, text: str) -> None:
        if not text:
            return  # an empty heading (`#` alone) structures nothing
        self._flush()
        while self.path and self.path[-1][0] >= level:
            self.path.pop()
        self.path.append((level, text))
        self.first_heading = self.first_heading or text
        if level == 1:
            self.first_h1 = self.first_h1 or text

    @property
    def title(self) -> str:
        return self.first_h1 or self.first_heading

    def finish(self, tidy: Callable[[str], str]) -> list[Section]:
        self._flush()
        sections = [Section(headings, tidy(raw)) for headings, raw in self.sections]
        return [s for s in sections if s.headings or s.text.strip()]

    def _flush(self) -> None:
        self.sections.append((tuple(text for _, text in self.path), "\n".join(self.parts)))
        self.parts = []


# --- HTML -------------------------------------------------------------------------------------

#: Never text: code, invisible or embedded content, and site chrome around the content.
_DROPPED_TAGS: Final = frozenset({
    "script", "style", "noscript", "template", "nav", "aside", "svg", "iframe", "object",
    "embed", "canvas", "meta", "link", "base",
})  # fmt: skip
_CHROME_ROLES: Final = frozenset({"navigation", "banner", "contentinfo", "complementary"})
#: A header/footer inside these is the content's own (an article's byline), not site chrome.
_CONTENT_CONTAINERS: Final = ("article", "main", "section")
_HEADINGS: Final = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_PARAGRAPH_TAGS: Final = frozenset({
    "p", "div", "section", "article", "main", "blockquote", "ul", "ol", "dl", "table", "figure",
    "figcaption", "form", "fieldset", "address", "details", "summary", "caption", "hr", "body",
    "header", "footer",
})  # fmt: skip
_LINE_TAGS: Final = frozenset({"li", "dt", "dd", "tr", "br"})
_CELL_TAGS: Final = frozenset({"td", "th"})
# Private-use sentinels for structure while the page's own whitespace is collapsed.
_PARA, _LINE, _CELL, _SPACE, _TAB, _NEWLINE = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004", "\ue005"
_SENTINELS = re.compile("[\ue000-\ue005]")
_WHITESPACE = re.compile(r"\s+")
_BREAK_RUN = re.compile("(?: ?[\ue000-\ue002])+ ?")


def _parse_html(text: str, stem: str) -> ParsedDocument:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_SENTINELS.sub("", _normalise(text)), "html.parser")
    _drop_chrome(soup)
    title = ""
    for title_tag in soup.find_all("title"):
        title = title or " ".join(title_tag.get_text().split())
        title_tag.decompose()
    walker = _HtmlWalker()
    walker.walk(soup)
    sections = walker.builder.finish(_html_text)
    return ParsedDocument(title or walker.builder.first_h1 or stem, "html", sections)


def _drop_chrome(soup: BeautifulSoup) -> None:
    for tag in [tag for tag in soup.find_all(True) if _is_chrome(tag)]:
        if not tag.decomposed:  # already gone with an enclosing dropped tag
            tag.decompose()


def _is_chrome(tag: Tag) -> bool:
    role = tag.get("role")
    if (
        tag.name in _DROPPED_TAGS
        or tag.has_attr("hidden")
        or (isinstance(role, str) and role in _CHROME_ROLES)
    ):
        return True
    return tag.name in ("header", "footer") and tag.find_parent(_CONTENT_CONTAINERS) is None


def _html_text(raw: str) -> str:
    """Collapse the page's whitespace, then turn the structure sentinels into line breaks."""
    text = _BREAK_RUN.sub(_break_for, _WHITESPACE.sub(" ", raw))
    text = text.replace(_SPACE, " ").replace(_TAB, "\t").replace(_NEWLINE, "\n")
    return _normalise(text).strip()


def _break_for(run: re.Match[str]) -> str:
    found = run.group()
    if _PARA in found:
        return "\n\n"
    return "\n" if _LINE in found else " | "


class _HtmlWalker:
    """Walks the tree without recursion (a deeply nested page must not overflow the stack),
    emitting text and structure sentinels, and starting a section at every h1..h6."""

    def __init__(self) -> None:
        self.builder = _SectionBuilder()
        self.pre_depth = 0
        self.cell_depth = 0
        self.lists: list[int | None] = []  # the next number of each open <ol>; None for <ul>
        self.bullet = ""

    def walk(self, root: Tag) -> None:
        from bs4.element import NavigableString, PreformattedString, Tag

        stack: list[tuple[PageElement, bool]] = [(root, False)]
        while stack:
            node, closing = stack.pop()
            if isinstance(node, Tag):
                if closing:
                    self._close(node.name)
                elif node.name in _HEADINGS:
                    self.builder.heading(int(node.name[1]), " ".join(node.get_text().split()))
                else:
                    self._open(node)
                    stack.append((node, True))
                    stack.extend((child, False) for child in reversed(node.contents))
            elif isinstance(node, NavigableString) and not isinstance(node, PreformattedString):
                self._text(str(node))

    def _break(self, kind: str) -> None:
        self.builder.add(" " if self.cell_depth and kind != _CELL else kind)

    def _open(self, tag: Tag) -> None:
        name = tag.name
        if name in _PARAGRAPH_TAGS or name == "pre":
            self._break(_PARA)
        elif name in _LINE_TAGS:
            self._break(_LINE)
        elif name in _CELL_TAGS:
            self._break(_CELL)
            self.cell_depth += 1
        if name == "pre":
            self.pre_depth += 1
        elif name == "ol":
            self.lists.append(_ol_start(tag))
        elif name == "ul":
            self.lists.append(None)
        elif name == "li":
            self.bullet = self._bullet()

    def _close(self, name: str) -> None:
        if name in _CELL_TAGS:
            self.cell_depth = max(0, self.cell_depth - 1)
            self._break(_CELL)
        elif name in _PARAGRAPH_TAGS or name == "pre":
            self._break(_PARA)
        elif name in _LINE_TAGS:
            self._break(_LINE)
        if name == "pre":
            self.pre_depth = max(0, self.pre_depth - 1)
        elif name in ("ol", "ul") and self.lists:
            self.lists.pop()

    def _bullet(self) -> str:
        number = self.lists[-1] if self.lists else None
        if number is None:
            return "- "
        self.lists[-1] = number + 1
        return f"{number}. "

    def _text(self, text: str) -> None:
        if self.pre_depth:
            text = text.replace(" ", _SPACE).replace("\t", _TAB).replace("\n", _NEWLINE)
        if self.bullet and text.strip():
            self.builder.add(self.bullet)
            self.bullet = ""
        self.builder.add(text)


def _ol_start(tag: Tag) -> int:
    start = tag.get("start")
    return int(start) if isinstance(start, str) and start.strip().isdigit() and len(start) < 9 else 1


# --- PDF --------------------------------------------------------------------------------------


def _parse_pdf(data: bytes, label: str, stem: str, max_chars: int | None = None) -> ParsedDocument:
    """One section per page. pypdf raises many exception types on damaged files; all of them
    mean the same thing to the operator."""
    try:
        from pypdf import PdfReader

        reader = PdfReader(io.BytesIO(data))
        _unlock(reader, label)
        pages: list[str] = []
        extracted = 0
        for page in reader.pages:
            if max_chars is not None and extracted >= max_chars:
                break
            pages.append(_tidy(page.extract_text()))
            extracted += len(pages[-1])
        total = len(reader.pages)
        title = _pdf_title(reader)
    except DocumentError:
        raise
    except Exception as exc:
        raise DocumentError(f"{label}: not a readable PDF (the file is damaged or not a PDF)") from exc
    if not pages:
        raise DocumentError(f"{label}: the PDF has no pages")
    if not any(text.strip() for text in pages):
        raise DocumentError(f"{label}: the PDF has no text layer (a scanned document?); OCR is not supported")
    sections = [Section((f"page {n}",), text) for n, text in enumerate(pages, start=1)]
    return ParsedDocument(title or stem, "pdf", sections, total_pages=total if len(pages) < total else None)


def _unlock(reader: PdfReader, label: str) -> None:
    """Many "encrypted" PDFs only restrict printing or copying and open with an empty password."""
    if not reader.is_encrypted:
        return
    try:
        opened = bool(reader.decrypt(""))
    except Exception:
        opened = False
    if not opened:
        raise DocumentError(f"{label}: the PDF is encrypted (password-protected); remove the password first")


def _pdf_title(reader: PdfReader) -> str:
    """The document info Title; a broken info dictionary is no reason to refuse the text."""
    try:
        title = reader.metadata.title if reader.metadata else None
    except Exception:
        return ""
    return " ".join(_normalise(title).split()) if isinstance(title, str) else ""


# --- Word (.docx) -----------------------------------------------------------------------------

#: A .docx is a zip: its directory says how much it unpacks to before anything is unpacked
#: (Python's zipfile never inflates a member past its stated size, and checks its CRC).
_DOCX_MAX_UNPACKED: Final = 256 * 1024 * 1024
#: Real Word XML deflates about 10:1; a member this much smaller packed than unpacked is a
#: bomb (checked for members over _DOCX_RATIO_FROM bytes: tiny parts may compress absurdly).
_DOCX_MAX_RATIO: Final = 100
_DOCX_RATIO_FROM: Final = 4 * 1024 * 1024
_DOCX_MAX_MEMBERS: Final = 10_000
_HEADING_STYLE = re.compile(r"heading ([1-9])", re.IGNORECASE)


def _parse_docx(data: bytes, label: str, stem: str) -> ParsedDocument:
    """Paragraphs and tables in document order; "Heading N" paragraphs start sections like
    Markdown headings, "Title" ones sit above them. Headers, footers, footnotes and text
    boxes are not read."""
    _check_zip(data, label)
    try:
        from docx import Document
        from docx.text.paragraph import Paragraph

        document = Document(io.BytesIO(data))
        builder = _SectionBuilder()
        title = ""
        for block in document.iter_inner_content():
            if not isinstance(block, Paragraph):
                builder.add(_docx_table_text(block) + "\n")
                continue
            text = " ".join(block.text.split())
            level = _docx_heading_level(block)
            if level == 0:
                title = title or text
            if level is not None:
                builder.heading(level, text)
            elif text:
                builder.add(_docx_bullet(block) + block.text.strip() + "\n")
        title = title or " ".join((document.core_properties.title or "").split())
    except Exception as exc:  # python-docx and lxml raise many types on a damaged file
        raise _not_docx(label) from exc
    sections = builder.finish(_tidy)
    return ParsedDocument(title or builder.title or stem, "docx", sections)


def _not_docx(label: str) -> DocumentError:
    return DocumentError(f"{label}: not a readable Word document (the file is damaged or not a .docx)")


def _check_zip(data: bytes, label: str) -> None:
    """Refuse a zip bomb from its directory alone, before one byte is inflated."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise _not_docx(label) from exc
    unpacked = sum(m.file_size for m in members)
    bomb = (
        len(members) > _DOCX_MAX_MEMBERS
        or unpacked > _DOCX_MAX_UNPACKED
        or any(
            m.file_size > _DOCX_RATIO_FROM and m.file_size > _DOCX_MAX_RATIO * max(m.compress_size, 1)
            for m in members
        )
    )
    if bomb:
        mib = 1024 * 1024
        raise DocumentError(
            f"{label}: it looks like a zip bomb (it would unpack to {unpacked // mib:,} MB from "
            f"{len(data) / mib:.1f} MB; at most {_DOCX_MAX_UNPACKED // mib} MB)"
        )


def _docx_heading_level(paragraph: Paragraph) -> int | None:
    """0 for the "Title" style, N for "Heading N" (python-docx reports Word's built-in names
    in English whatever the document's language), None for body text."""
    name = (paragraph.style.name if paragraph.style is not None else None) or ""
    if name.lower() == "title":
        return 0
    match = _HEADING_STYLE.fullmatch(name.strip())
    return int(match.group(1)) if match else None


def _docx_bullet(paragraph: Paragraph) -> str:
    name = (paragraph.style.name if paragraph.style is not None else None) or ""
    return "- " if name.lower().startswith("list") else ""


def _docx_table_text(table: Table) -> str:
    """One line per row, cells joined like the HTML parser's tables; a merged cell once."""
    lines = []
    for row in table.rows:
        cells: list[str] = []
        seen: set[int] = set()
        for cell in row.cells:
            if id(cell._tc) in seen:  # a merged cell is the same XML element several times
                continue
            seen.add(id(cell._tc))
            cells.append(" ".join(cell.text.split()))
        if any(cells):
            lines.append(" | ".join(cells))
    return "\n".join(lines)
