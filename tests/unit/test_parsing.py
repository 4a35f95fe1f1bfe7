"""Document parsing: formats, titles, heading sections, and a clear DocumentError for every file
that cannot be ingested (sample files in tests/fixtures/docs/)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.files import docx_with_text, zip_bomb_docx, zip_of
from vagent_graph.knowledge.parsing import (
    DocumentError,
    ParsedDocument,
    Section,
    detect_format,
    parse_document,
)
from vagent_shared.knowledge import DocumentFormat

DOCS = Path(__file__).resolve().parent.parent / "fixtures" / "docs"
FORMATS: tuple[DocumentFormat, ...] = ("markdown", "text", "html", "pdf", "docx")


def parse_fixture(name: str) -> ParsedDocument:
    return parse_document((DOCS / name).read_bytes(), detect_format(name), name)


def all_text(doc: ParsedDocument) -> str:
    return "\n".join(section.text for section in doc.sections)


def section(doc: ParsedDocument, *headings: str) -> Section:
    matches = [s for s in doc.sections if s.headings == headings]
    assert len(matches) == 1, [s.headings for s in doc.sections]
    return matches[0]


def md(source: str, name: str = "notes.md") -> ParsedDocument:
    return parse_document(source.encode(), "markdown", name)


def html(source: str, name: str = "page.html") -> ParsedDocument:
    return parse_document(source.encode(), "html", name)


# --- detect_format ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("a.md", "markdown"),
        ("A.MARKDOWN", "markdown"),
        ("notes.txt", "text"),
        ("notes.Text", "text"),
        ("index.html", "html"),
        ("INDEX.HTM", "html"),
        ("dir/q3-report.pdf", "pdf"),
    ],
)
def test_format_by_extension(filename: str, expected: str) -> None:
    assert detect_format(filename) == expected


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/markdown", "markdown"),
        ("text/x-markdown; charset=utf-8", "markdown"),
        ("text/plain;charset=UTF-8", "text"),
        ("TEXT/HTML; charset=iso-8859-1", "html"),
        ("application/pdf", "pdf"),
    ],
)
def test_known_content_type_wins_over_the_extension(content_type: str, expected: str) -> None:
    assert detect_format("upload.bin", content_type) == expected
    assert detect_format("report.pdf", content_type) == expected


def test_unknown_content_type_falls_back_to_the_extension() -> None:
    assert detect_format("report.pdf", "application/octet-stream") == "pdf"


@pytest.mark.parametrize(("filename", "content_type"), [("slides.pptx", None), ("noext", "image/png")])
def test_unknown_format_names_the_file_and_the_supported_formats(
    filename: str, content_type: str | None
) -> None:
    with pytest.raises(DocumentError) as error:
        detect_format(filename, content_type)
    message = str(error.value)
    assert filename in message
    assert all(ext in message for ext in (".md", ".txt", ".html", ".pdf"))


# --- Markdown ---------------------------------------------------------------------------------


def test_markdown_headings_make_nested_sections() -> None:
    doc = parse_fixture("handbook.md")
    assert doc.format == "markdown"
    assert [s.headings for s in doc.sections] == [
        (),
        ("Acme Handbook",),
        ("Acme Handbook", "Expenses"),
        ("Acme Handbook", "Expenses", "Travel"),
        ("Acme Handbook", "Holidays"),  # setext level 2 closes "Expenses > Travel"
        ("Remote work",),  # setext level 1 starts a new top level
    ]
    assert section(doc).text == "Welcome to the Acme handbook. This paragraph comes before any heading."
    assert section(doc, "Acme Handbook", "Expenses").text == "Submit receipts within 30 days."
    assert section(doc, "Remote work").text == "Remote work is allowed two days a week."


def test_markdown_title_is_the_first_h1_not_the_front_matter() -> None:
    assert parse_fixture("handbook.md").title == "Acme Handbook"


def test_markdown_front_matter_is_skipped() -> None:
    text = all_text(parse_fixture("handbook.md"))
    assert "front-matter-value" not in text
    assert "secret:" not in text


def test_markdown_hash_in_a_code_fence_is_not_a_heading_and_code_and_tables_are_kept() -> None:
    travel = section(parse_fixture("handbook.md"), "Acme Handbook", "Expenses", "Travel")
    assert '```bash\n# this comment is not a heading\necho "book a train"\n```' in travel.text
    assert "| Hotel | 150   |" in travel.text
    assert travel.text.startswith("Book trains for trips under 500 km.")


def test_markdown_lists_are_kept() -> None:
    holidays = section(parse_fixture("handbook.md"), "Acme Handbook", "Holidays")
    assert holidays.text == "- New Year's Day\n- Labour Day"


def test_markdown_heading_paths_skip_levels_and_pop_correctly() -> None:
    doc = md("# A\n\n### C\n\nc\n\n## B\n\nb\n\n# D\n\nd\n")
    assert [(s.headings, s.text) for s in doc.sections] == [
        (("A",), ""),
        (("A", "C"), "c"),
        (("A", "B"), "b"),
        (("D",), "d"),
    ]


def test_markdown_heading_text_drops_inline_markup() -> None:
    doc = md("## The `api` *guide* &amp; [more](https://x.example) ![logo](l.png)\n\nbody\n")
    assert doc.sections[0].headings == ("The api guide & more logo",)


def test_markdown_title_falls_back_to_first_heading_then_file_stem() -> None:
    assert md("## Minutes\n\nWe met.\n").title == "Minutes"
    assert md("Just text.\n", name="docs/q3-report.md").title == "q3-report"


def test_stem_title_comes_from_a_sanitised_name() -> None:
    doc = parse_document(b"plain", "text", "C:\\upload\\minutes\n2024.txt")
    assert doc.title == "minutes2024"


def test_markdown_front_matter_may_open_with_a_comment() -> None:
    doc = md("---\n# generated\nowner: finance\n---\n# Budget\n\nNumbers.\n")
    assert doc.sections == [Section(("Budget",), "Numbers.")]


def test_markdown_opening_thematic_break_is_not_front_matter() -> None:
    doc = md("---\n\nFirst paragraph.\n\n---\n\nSecond paragraph.\n")
    assert "First paragraph." in all_text(doc)


def test_markdown_quoted_heading_stays_body_text() -> None:
    doc = md("# Notes\n\n> # Quoted title\n> quoted text\n")
    assert [s.headings for s in doc.sections] == [("Notes",)]
    assert "Quoted title" in doc.sections[0].text


def test_markdown_html_comments_are_not_text() -> None:
    doc = md("# A\n\n<!-- internal: do not publish -->\n\nvisible\n")
    assert doc.sections[0].text == "visible"


def test_markdown_utf8_bom_is_removed() -> None:
    doc = parse_fixture("bom.md")
    assert doc.title == "BOM heading"
    assert doc.sections == [Section(("BOM heading",), "Body after a BOM.")]


def test_markdown_with_only_headings_has_no_text() -> None:
    with pytest.raises(DocumentError, match=r"titles\.md: .*no text"):
        md("# Title\n\n## Sub\n", name="titles.md")


# --- HTML -------------------------------------------------------------------------------------


def test_html_title_sections_and_entities() -> None:
    doc = parse_fixture("page.html")
    assert doc.format == "html"
    assert doc.title == "Acme & Co — Pricing"
    assert [s.headings for s in doc.sections] == [
        (),
        ("Pricing",),
        ("Pricing", "Plans"),
        ("Pricing", "Plans", "Example"),
    ]
    assert section(doc).text == "Intro text with extra whitespace <kept>."
    assert section(doc, "Pricing").text == "Our plans are simple."


def test_html_tables_lists_and_pre_blocks_stay_readable() -> None:
    doc = parse_fixture("page.html")
    plans = section(doc, "Pricing", "Plans").text
    assert "Plan | Price\nBasic | 10 EUR\nPro | 25 EUR" in plans
    assert "- Cancel any time\n- No setup fee" in plans
    assert "1. Choose\n2. Pay" in plans
    assert section(doc, "Pricing", "Plans", "Example").text == "curl https://acme.example/api\n  --plan pro"


@pytest.mark.parametrize(
    "hidden",
    [
        "scriptSecret",
        "inline script secret",
        "stylesecret",
        "noscriptchrome",
        "templatechrome",
        "navchrome",
        "headerchrome",
        "footerchrome",
        "asidechrome",
    ],
)
def test_html_scripts_styles_and_chrome_are_dropped(hidden: str) -> None:
    doc = parse_fixture("page.html")
    assert hidden not in all_text(doc)
    assert hidden not in doc.title


def test_html_article_header_is_content_not_chrome() -> None:
    doc = html("<header>Site menu</header><article><header><h1>Launch</h1><p>By Ann</p></header></article>")
    assert doc.title == "Launch"
    assert doc.sections == [Section(("Launch",), "By Ann")]


def test_html_title_falls_back_to_h1_then_stem() -> None:
    assert html("<h2>Sub</h2><h1>Main</h1><p>x</p>").title == "Main"
    assert html("<p>x</p>", name="site/about-us.html").title == "about-us"


def test_html_paragraph_breaks_are_blank_lines_and_br_a_line_break() -> None:
    doc = html("<div><p>one\n   two</p><p>three<br>four</p></div>")
    assert doc.sections[0].text == "one two\n\nthree\nfour"


def test_html_paragraphs_inside_a_table_cell_stay_in_the_cell() -> None:
    doc = html("<table><tr><td><p>a</p><p>b</p></td><td>c</td></tr><tr><td>d</td><td>e</td></tr></table>")
    assert doc.sections[0].text == "a b | c\nd | e"


def test_html_declared_charset_is_honoured() -> None:
    doc = parse_fixture("latin1.html")
    assert doc.title == "Café"
    assert doc.sections[0].text == "Crème brûlée"


def test_html_with_only_scripts_has_no_text() -> None:
    with pytest.raises(DocumentError, match=r"scripts-only\.html: .*no text"):
        parse_fixture("scripts-only.html")


def test_deeply_nested_html_parses() -> None:
    doc = html("<div>" * 5000 + "deep" + "</div>" * 5000)
    assert doc.sections[0].text == "deep"


# --- plain text -------------------------------------------------------------------------------


def test_text_is_one_section_with_normalised_paragraphs() -> None:
    doc = parse_fixture("notes.txt")
    assert doc.title == "notes"
    assert doc.format == "text"
    assert doc.sections == [
        Section(
            (),
            "Meeting notes\n\nThe budget was approved.\nAlice will send the invoice.\n\n"
            "Next meeting: Monday.",
        )
    ]


def test_text_utf16_with_bom() -> None:
    assert parse_fixture("utf16.txt").sections[0].text == "Grüße aus Köln\n\nZweiter Absatz."


def test_control_characters_are_removed_but_tabs_kept() -> None:
    doc = parse_document(b"a\x07b\tc\x1b[0m\rnext\x7f", "text", "log.txt")
    assert doc.sections[0].text == "ab\tc[0m\nnext"


def test_markdown_headings_in_not_text_format_are_plain_text() -> None:
    doc = parse_document(b"# Not a heading\n\nbody", "text", "readme.txt")
    assert doc.sections == [Section((), "# Not a heading\n\nbody")]


# --- PDF --------------------------------------------------------------------------------------


def test_pdf_text_is_extracted_per_page_with_the_info_title() -> None:
    doc = parse_fixture("report.pdf")
    assert doc.format == "pdf"
    assert doc.title == "Q3 Financial Report"
    assert [s.headings for s in doc.sections] == [("page 1",), ("page 2",)]
    assert "Revenue grew by 12 percent" in doc.sections[0].text
    assert "Falcon" not in doc.sections[0].text
    assert "Falcon product in November" in doc.sections[1].text


def test_pdf_without_info_title_uses_the_stem() -> None:
    assert parse_fixture("untitled.pdf").title == "untitled"


def test_pdf_encrypted_with_an_empty_password_opens() -> None:
    doc = parse_fixture("encrypted-empty-password.pdf")
    assert doc.sections[0].text == "A page without a title in its metadata."


# --- what cannot be ingested ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("encrypted.pdf", "encrypted"),
        ("corrupt.pdf", "not a readable PDF"),
        ("scanned.pdf", "no text layer"),
        ("binary.txt", "binary"),
        ("invalid-utf8.txt", "not UTF-8"),
        ("empty.md", "empty"),
        ("whitespace.txt", "no text"),
    ],
)
def test_unusable_files_give_a_clear_error_naming_the_file(fixture: str, expected: str) -> None:
    with pytest.raises(DocumentError) as error:
        parse_fixture(fixture)
    message = str(error.value)
    assert message.startswith(f"{fixture}: ")
    assert expected in message
    assert "Traceback" not in message
    assert "\\x" not in message
    assert "b'" not in message


def test_scanned_pdf_says_ocr_is_not_supported() -> None:
    with pytest.raises(DocumentError, match="OCR is not supported"):
        parse_fixture("scanned.pdf")


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_input_is_an_error_in_every_format(fmt: DocumentFormat) -> None:
    with pytest.raises(DocumentError, match="empty"):
        parse_document(b"", fmt, "nothing")


@pytest.mark.parametrize("data", [b"hello, I am text", b"%PDF-1.7\n\x00\xff garbage", b"\x89PNG\r\n\x1a\n"])
def test_not_a_pdf_is_an_error(data: bytes) -> None:
    with pytest.raises(DocumentError, match=r"^fake\.pdf: not a readable PDF"):
        parse_document(data, "pdf", "fake.pdf")


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_nul_bytes_mean_binary_in_markdown_and_html(fmt: DocumentFormat) -> None:
    with pytest.raises(DocumentError, match="binary"):
        parse_document(b"# x\x00y", fmt, "blob")


def test_latin1_html_without_declaration_is_not_utf8() -> None:
    with pytest.raises(DocumentError, match="not UTF-8"):
        parse_document("<p>Café</p>".encode("latin-1"), "html", "old.html")


def test_error_messages_sanitise_the_file_name() -> None:
    with pytest.raises(DocumentError) as error:
        parse_document(b"", "text", "evil\nname\x1b[31m.txt")
    assert str(error.value) == "evilname[31m.txt: the file is empty"


def test_unknown_format_argument_is_a_document_error() -> None:
    with pytest.raises(DocumentError, match="unknown format"):
        parse_document(b"x", "odt", "a.odt")  # type: ignore[arg-type]


# --- fuzz: nothing but DocumentError escapes --------------------------------------------------


def parse_or_reject(data: bytes, fmt: DocumentFormat) -> None:
    try:
        doc = parse_document(data, fmt, "fuzz.bin")
    except DocumentError as error:
        assert str(error).startswith("fuzz.bin: ")
        return
    assert doc.format == fmt
    assert any(s.text.strip() for s in doc.sections)
    assert all("\r" not in s.text and "\x00" not in s.text for s in doc.sections)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=2000), fmt=st.sampled_from(FORMATS))
def test_random_bytes_give_a_document_or_a_document_error(data: bytes, fmt: DocumentFormat) -> None:
    parse_or_reject(data, fmt)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=2000), fmt=st.sampled_from(FORMATS))
def test_random_text_gives_a_document_or_a_document_error(text: str, fmt: DocumentFormat) -> None:
    parse_or_reject(text.encode("utf-8", "surrogatepass"), fmt)


_MARKUP = st.sampled_from(
    ["#", "## ", "\n", "---", "```", "<h1>", "</h1>", "<script>", "<p>", "<td>", "<pre>", "&amp;", " ", "a"]
)


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(_MARKUP, max_size=60), fmt=st.sampled_from(["markdown", "html"]))
def test_random_markup_gives_a_document_or_a_document_error(parts: list[str], fmt: DocumentFormat) -> None:
    parse_or_reject("".join(parts).encode(), fmt)


@settings(max_examples=60, deadline=None)
@given(tail=st.binary(max_size=1500))
def test_damaged_pdfs_give_a_document_or_a_document_error(tail: bytes) -> None:
    report = (DOCS / "report.pdf").read_bytes()
    parse_or_reject(report[: len(report) // 2] + tail, "pdf")


# --- Word (.docx) -----------------------------------------------------------------------------

WORD = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def docx(
    paragraphs: list[str], name: str = "notes.docx", table: list[list[str]] | None = None
) -> ParsedDocument:
    return parse_document(docx_with_text(paragraphs, table=table), "docx", name)


@pytest.mark.parametrize(("filename", "content_type"), [("Minutes.DOCX", None), ("upload.bin", WORD)])
def test_word_documents_are_recognised_by_extension_and_content_type(
    filename: str, content_type: str | None
) -> None:
    assert detect_format(filename, content_type) == "docx"


def test_unsupported_format_message_names_word_too() -> None:
    with pytest.raises(DocumentError, match=r"Word \(\.docx\)"):
        detect_format("slides.pptx")


def test_word_headings_make_nested_sections_like_markdown() -> None:
    doc = docx(
        ["Before any heading.", "# Handbook", "Welcome.", "## Travel", "Book trains.", "# Holidays", "Two."]
    )
    assert doc.format == "docx"
    assert doc.title == "Handbook"
    assert [(s.headings, s.text) for s in doc.sections] == [
        ((), "Before any heading."),
        (("Handbook",), "Welcome."),
        (("Handbook", "Travel"), "Book trains."),
        (("Holidays",), "Two."),
    ]


def test_word_paragraphs_are_separated_and_tables_read_row_by_row() -> None:
    doc = docx(["Prices", "All in EUR."], table=[["Plan", "Price"], ["Basic", "10"], ["Pro", "25"]])
    assert doc.sections[0].text == "Prices\n\nAll in EUR.\n\nPlan | Price\nBasic | 10\nPro | 25"


def test_word_title_style_is_the_title_above_the_headings() -> None:
    from docx import Document

    document = Document()
    document.add_heading("Quarterly report", level=0)  # the "Title" style
    document.add_heading("Revenue", level=1)
    document.add_paragraph("Grew 12%.")
    out = io.BytesIO()
    document.save(out)
    doc = parse_document(out.getvalue(), "docx", "q3.docx")
    assert doc.title == "Quarterly report"
    assert doc.sections[-1] == Section(("Quarterly report", "Revenue"), "Grew 12%.")


def test_word_title_falls_back_to_the_file_name() -> None:
    assert docx(["Just a line."], name="team/minutes-2024.docx").title == "minutes-2024"


def test_word_document_without_text_says_so() -> None:
    with pytest.raises(DocumentError, match=r"^blank\.docx: the document contains no text$"):
        docx(["", "   "], name="blank.docx")


@pytest.mark.parametrize(
    "data",
    [
        b"PK\x03\x04 not really a zip",
        zip_of({"word/document.xml": b"<not xml"}),
        zip_of({"readme.txt": b"a zip, but not a Word document"}),
    ],
    ids=["not-a-zip", "broken-xml", "other-zip"],
)
def test_damaged_word_documents_are_a_clear_error(data: bytes) -> None:
    with pytest.raises(DocumentError, match=r"^bad\.docx: not a readable Word document"):
        parse_document(data, "docx", "bad.docx")


def test_truncated_word_document_is_a_clear_error() -> None:
    whole = docx_with_text(["Some text that is long enough to matter."] * 20)
    with pytest.raises(DocumentError, match="not a readable Word document"):
        parse_document(whole[: len(whole) // 2], "docx", "cut.docx")


def test_zip_bomb_is_refused_from_the_zip_directory_without_unpacking() -> None:
    bomb = zip_bomb_docx()  # 1 MB holding 1 GiB of spaces
    started = time.perf_counter()
    with pytest.raises(DocumentError) as error:
        parse_document(bomb, "docx", "bomb.docx")
    assert time.perf_counter() - started < 1  # inflating it would take seconds and 1 GiB
    assert str(error.value).startswith("bomb.docx: it looks like a zip bomb (it would unpack to 1,024 MB")


def test_many_small_parts_also_count_as_a_zip_bomb() -> None:
    parts = {f"word/media/{n}.bin": b"" for n in range(10_001)}
    with pytest.raises(DocumentError, match="zip bomb"):
        parse_document(zip_of({"word/document.xml": b"<x/>", **parts}), "docx", "many.docx")
