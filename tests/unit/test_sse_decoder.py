"""The SSE decoder the bot reads the graph's streams with: byte boundaries anywhere,
every line ending, comments (pings), multi-line data."""

from __future__ import annotations

import pytest

from vagent_shared.events import Done, RawEvent, SSEDecoder, TextChunk, parse_sse_event

STREAM = (
    b": ping - 2026-11-22 10:00:00\r\n\r\n"
    b'event: text_chunk\r\ndata: {"content":"Hel","chunk_index":0}\r\n\r\n'
    b'event: text_chunk\ndata: {"content":"lo \\u2713","chunk_index":1}\n\n'
    b"event: done\rdata: {}\r\r"
)
EXPECTED = [
    RawEvent("text_chunk", '{"content":"Hel","chunk_index":0}'),
    RawEvent("text_chunk", '{"content":"lo \\u2713","chunk_index":1}'),
    RawEvent("done", "{}"),
]


def feed_in_pieces(data: bytes, size: int) -> list[RawEvent]:
    d = SSEDecoder()
    out: list[RawEvent] = []
    for i in range(0, len(data), size):
        out += d.feed(data[i : i + size])
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
def test_any_split_gives_the_same_events(size: int) -> None:
    assert feed_in_pieces(STREAM, size) == EXPECTED


def test_events_parse_into_the_contract_models() -> None:
    events = [parse_sse_event(r.event, r.data) for r in feed_in_pieces(STREAM, 5)]
    assert events == [
        TextChunk(content="Hel", chunk_index=0),
        TextChunk(content="lo \u2713", chunk_index=1),
        Done(),
    ]


def test_a_utf8_character_split_across_reads_survives() -> None:
    raw = 'event: text_chunk\ndata: {"content":"é✓","chunk_index":0}\n\n'.encode()
    cut = raw.index("✓".encode()) + 1  # inside the 3-byte character
    d = SSEDecoder()
    assert d.feed(raw[:cut]) == []
    [ev] = d.feed(raw[cut:])
    assert parse_sse_event(ev.event, ev.data) == TextChunk(content="é✓", chunk_index=0)


def test_multi_line_data_joins_with_newlines_and_unknown_fields_are_ignored() -> None:
    d = SSEDecoder()
    got = d.feed(b"id: 7\nretry: 100\nevent: progress\ndata: one\ndata:two\nfoo: bar\n\n")
    assert got == [RawEvent("progress", "one\ntwo")]


def test_no_data_no_event_and_default_type_is_message() -> None:
    d = SSEDecoder()
    assert d.feed(b"event: lonely\n\n") == []
    assert d.feed(b"data: x\n\n") == [RawEvent("message", "x")]


def test_incomplete_event_is_held_until_its_blank_line() -> None:
    d = SSEDecoder()
    assert d.feed(b"event: done\ndata: {}\n") == []
    assert d.feed(b"\n") == [RawEvent("done", "{}")]


def test_bom_at_stream_start_is_dropped() -> None:
    assert SSEDecoder().feed(b"\xef\xbb\xbfevent: done\ndata: {}\n\n") == [RawEvent("done", "{}")]


def test_crlf_split_between_reads_is_one_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"event: done\r\ndata: {}\r") == []
    assert d.feed(b"") == []
    assert d.feed(b"\n\r\n") == [RawEvent("done", "{}")]
