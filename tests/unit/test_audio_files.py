"""WAV and Ogg headers read by hand (vagent_dev.audio_files), and the demo samples of
deploy/dev/samples/ (scripts/make_samples.py): small, real, what their names say, and what
the script writes today (the committed files are not stale)."""

from __future__ import annotations

import struct
import subprocess
import sys
import wave
from io import BytesIO
from pathlib import Path

import pytest

from vagent_dev.audio_files import audio_duration, make_wav, ogg_duration, read_wav, riff_chunks
from vagent_shared.attachments import sniff_mime

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "deploy" / "dev" / "samples"


def ogg_page(granule: int, packet: bytes) -> bytes:
    """One Ogg page with one segment (no CRC: these readers do not check it)."""
    return b"OggS\x00\x00" + struct.pack("<q", granule) + bytes(12) + bytes([1, len(packet)]) + packet


def test_a_written_wav_is_read_back_by_the_standard_library() -> None:
    data = make_wav(0.5, rate=8000, frequency=440, comment="hello")
    with wave.open(BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 8000, 4000)
    assert read_wav(b"RIFF") is None and read_wav(b"OggS" + bytes(60)) is None
    info = read_wav(data)
    assert info is not None and info.duration == 0.5 and info.comment == "hello"


def test_odd_chunks_cut_files_and_foreign_comments() -> None:
    # an odd-sized chunk is padded; a Latin-1 comment; the data chunk cut short by the end
    fmt = struct.pack("<HHIIHH", 1, 1, 1000, 2000, 2, 16)
    info = b"INFO" + b"ICMT" + struct.pack("<I", 5) + "caf\xe9".encode("latin-1") + b"\x00" + b"\x00"
    body = b"fmt " + struct.pack("<I", 16) + fmt
    body += b"odd " + struct.pack("<I", 3) + b"abc\x00"
    body += b"LIST" + struct.pack("<I", len(info)) + info
    body += b"data" + struct.pack("<I", 4000) + bytes(1000)  # says 2 s, holds 0.5 s
    data = b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body
    assert [cid for cid, _ in riff_chunks(data)] == [b"fmt ", b"odd ", b"LIST", b"data"]
    parsed = read_wav(data)
    assert parsed is not None and parsed.comment == "café" and parsed.duration == 0.5
    streamed = data.replace(struct.pack("<I", 4000), b"\xff\xff\xff\xff")  # size unknown
    assert read_wav(streamed) == parsed
    no_format = b"RIFF\x00\x00\x00\x00WAVEdata\x02\x00\x00\x00\x00\x00"
    assert read_wav(no_format) is not None and read_wav(no_format).duration is None  # type: ignore[union-attr]


def test_ogg_durations() -> None:
    opus = ogg_page(0, b"OpusHead\x01\x01" + struct.pack("<H", 312) + bytes(7)) + ogg_page(96_312, b"x")
    assert ogg_duration(opus) == 2.0 and audio_duration(opus) == 2.0
    vorbis_head = b"\x01vorbis" + bytes(4) + b"\x02" + struct.pack("<I", 44_100) + bytes(10)  # 2 channels
    assert ogg_duration(ogg_page(0, vorbis_head) + ogg_page(44_100 * 3, b"y")) == 3.0
    assert ogg_duration(ogg_page(0, b"Speex   ")) is None
    assert audio_duration(b"ID3\x04rest") is None


# --------------------------------------------------------------------------- samples


@pytest.mark.parametrize(
    ("name", "mime"),
    [
        ("report.pdf", "application/pdf"),
        ("notes.docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
        ("screenshot.png", "image/png"),
        ("voice.wav", "audio/wav"),
    ],
)
def test_samples_are_small_and_what_they_say(name: str, mime: str) -> None:
    data = (SAMPLES / name).read_bytes()
    assert 0 < len(data) < 50 * 1024
    assert sniff_mime(data, name) == mime


def test_samples_hold_their_text() -> None:
    info = read_wav((SAMPLES / "voice.wav").read_bytes())
    assert info is not None and info.comment == "What is on my calendar today?" and info.duration == 1.5
    pypdf = pytest.importorskip("pypdf")
    text = pypdf.PdfReader(SAMPLES / "report.pdf").pages[0].extract_text()
    assert "Quarterly report Q4 2026" in text and "Revenue: 5.1 M EUR" in text
    docx = pytest.importorskip("docx")
    paragraphs = [(p.style.name, p.text) for p in docx.Document(str(SAMPLES / "notes.docx")).paragraphs]
    assert ("Heading 1", "Action items") in paragraphs
    assert ("Normal", "Bob: draft the API specification by 2026-12-04.") in paragraphs


def test_the_committed_samples_are_what_the_script_writes() -> None:
    """Reproducible: the same bytes every run (the PNG too, with the Pillow this venv has)."""
    script = ROOT / "scripts" / "make_samples.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
