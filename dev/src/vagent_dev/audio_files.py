"""Audio files read without a decoder: how long a WAV or Ogg recording is, a WAV's comment
(its RIFF `LIST`/`INFO`/`ICMT` chunk), and writing a small WAV.

Why by hand: the speech-to-text stand-in (`vagent-stt`) answers with a WAV's comment, `make
chat` puts a voice message's duration in its event, and the demo samples are written by
`scripts/make_samples.py`; none of them needs more than the container headers, and the
stand-ins' image carries no audio library.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

#: A chunk size of a WAV written while streaming: "until the end of the file".
_UNKNOWN_SIZE = 0xFFFFFFFF
_OPUS_RATE = 48_000


@dataclass(frozen=True)
class WavInfo:
    """What a WAV's headers say: its length in seconds (None when the format chunk is missing
    or says nothing usable) and its ICMT comment (None without one)."""

    duration: float | None
    comment: str | None


def is_wav(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def riff_chunks(data: bytes, start: int = 12, end: int | None = None) -> Iterator[tuple[bytes, bytes]]:
    """(id, body) of each chunk between `start` and `end`; a chunk cut short by the end of the
    file yields what is there (a recording still being written), then stops."""
    end = len(data) if end is None else min(end, len(data))
    pos = start
    while pos + 8 <= end:
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body_end = end if size == _UNKNOWN_SIZE else min(pos + 8 + size, end)
        yield cid, data[pos + 8 : body_end]
        pos = pos + 8 + size + (size & 1)  # bodies are padded to an even length


def read_wav(data: bytes) -> WavInfo | None:
    """The duration and comment of a RIFF/WAVE file; None when `data` is not one."""
    if not is_wav(data):
        return None
    byte_rate = 0
    samples: int | None = None
    comment: str | None = None
    for cid, body in riff_chunks(data):
        if cid == b"fmt " and len(body) >= 12:
            byte_rate = struct.unpack_from("<I", body, 8)[0]
        elif cid == b"data":
            samples = len(body)
        elif cid == b"LIST" and body[:4] == b"INFO":
            for sub, text in riff_chunks(body, 4):
                if sub == b"ICMT":
                    comment = _text(text) or None
    duration = samples / byte_rate if samples is not None and byte_rate > 0 else None
    return WavInfo(duration, comment)


def _text(raw: bytes) -> str:
    """A RIFF INFO string: NUL-terminated, UTF-8 by today's writers, Latin-1 by older ones."""
    raw = raw.split(b"\x00", 1)[0]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return " ".join(text.split())


def ogg_duration(data: bytes) -> float | None:
    """Seconds of an Ogg Opus or Vorbis file, from its last page's granule position; None when
    it is neither (or the file is cut before its last page)."""
    if not data.startswith(b"OggS") or len(data) < 28:
        return None
    segments = data[26]
    first = data[27 + segments : 27 + segments + 19]
    if first.startswith(b"OpusHead") and len(first) >= 12:
        rate, skip = _OPUS_RATE, struct.unpack_from("<H", first, 10)[0]
    elif first.startswith(b"\x01vorbis") and len(first) >= 16:
        rate, skip = struct.unpack_from("<I", first, 12)[0], 0
    else:
        return None
    last = data.rfind(b"OggS")
    while last > 0 and (last + 27 > len(data) or data[last + 4] != 0):  # "OggS" inside a packet
        last = data.rfind(b"OggS", 0, last)
    if last < 0 or last + 14 > len(data) or rate <= 0:
        return None
    granule = struct.unpack_from("<q", data, last + 6)[0]
    return max(0, granule - skip) / rate if granule >= 0 else None


def audio_duration(data: bytes) -> float | None:
    """Seconds of a WAV or Ogg recording; None for other types or when the headers do not say."""
    wav = read_wav(data)
    if wav is not None:
        return wav.duration
    return ogg_duration(data)


def make_wav(
    seconds: float, *, rate: int = 16_000, frequency: float = 0.0, comment: str | None = None
) -> bytes:
    """A 16-bit mono PCM WAV: silence, or a sine tone at `frequency` Hz at a quarter of full
    scale, with an optional ICMT comment (what `vagent-stt` answers for it)."""
    count = round(seconds * rate)
    amplitude = 8191 if frequency > 0 else 0
    pcm = struct.pack(
        f"<{count}h",
        *(round(amplitude * math.sin(2 * math.pi * frequency * i / rate)) for i in range(count)),
    )
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    chunks = _chunk(b"fmt ", fmt)
    if comment is not None:
        chunks += _chunk(b"LIST", b"INFO" + _chunk(b"ICMT", comment.encode() + b"\x00"))
    chunks += _chunk(b"data", pcm)
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def _chunk(cid: bytes, body: bytes) -> bytes:
    return cid + struct.pack("<I", len(body)) + body + (b"\x00" if len(body) & 1 else b"")
