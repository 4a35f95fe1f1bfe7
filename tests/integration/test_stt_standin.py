"""`vagent-stt`, the development speech-to-text stand-in: the real process answers the bot's
own client (`vagent_bot.clients.transcribe.Transcriber`) with a WAV's comment, says how long other
WAVs are, refuses what is not audio and a wrong key the way OpenAI does, and keeps neither the
audio nor the key. Pure rules and edge cases run in-process (fast); one process covers the
console script, its banner and the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from procutil import free_port

from tests.support.procs import ServiceProcess
from vagent_bot.clients.transcribe import Transcriber, TranscriptionFailed
from vagent_dev.audio_files import make_wav
from vagent_dev.stt import MAX_UPLOAD_BYTES, create_app, key_matches, transcript

ROOT = Path(__file__).resolve().parents[2]
KEY = "dev-stt-key-not-a-secret"
QUESTION = "What is on my calendar today?"
WAV = make_wav(0.1)
#: An Ogg page header with an Opus head: audio by its bytes, no WAV comment to read.
OGG = b"OggS\x00\x02" + bytes(20) + b"\x01\x13OpusHead\x01\x01\x38\x01\x80\xbb\x00\x00\x00\x00\x00"


@pytest.fixture(scope="module")
def stt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """The console script on a free loopback port, asking for KEY."""
    port = free_port()
    env = {"STT_STANDIN_HOST": "127.0.0.1", "STT_STANDIN_PORT": str(port), "STT_STANDIN_API_KEY": KEY}
    log = tmp_path_factory.mktemp("stt") / "stt.log"
    with ServiceProcess("vagent-stt", env, log, f"http://127.0.0.1:{port}/health") as process:
        yield process


def base_url(stt: ServiceProcess) -> str:
    """What the bot's STT_BASE_URL would be."""
    return f"http://127.0.0.1:{stt.env['STT_STANDIN_PORT']}/v1"


def post(client: TestClient | httpx.Client, data: bytes, name: str = "voice.wav", **fields: str) -> Any:
    return client.post(
        "/v1/audio/transcriptions" if isinstance(client, TestClient) else "audio/transcriptions",
        files={"file": (name, data, "application/octet-stream")},
        data={"model": "whisper-1", **fields},
    )


# --------------------------------------------------------------------------- the process


async def test_the_bots_client_hears_the_wav_comment(stt: ServiceProcess) -> None:
    """What `make run` wires: the bot's Transcriber with STT_BASE_URL and STT_API_KEY."""
    transcriber = Transcriber(base_url(stt), "whisper-1", KEY, timeout_seconds=10)
    try:
        text = await transcriber.transcribe(make_wav(1.0, comment=QUESTION), "Voice message", "audio/wav")
        assert text == QUESTION
        silence = await transcriber.transcribe(make_wav(2.0, rate=8000), "voice.wav", "audio/wav")
        assert silence == "(stand-in transcript of a 2.0-second recording)"
    finally:
        await transcriber.aclose()
    with pytest.raises(TranscriptionFailed) as refused:
        wrong = Transcriber(base_url(stt), "whisper-1", "not-the-key", timeout_seconds=10)
        try:
            await wrong.transcribe(make_wav(0.5), "voice.wav", "audio/wav")
        finally:
            await wrong.aclose()
    assert refused.value.reason == "http_401"


def test_key_errors_and_records_over_the_wire(stt: ServiceProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url(stt) + "/", headers=headers, timeout=10) as http:
        http.delete(base_url(stt).removesuffix("/v1") + "/debug/requests")
        ok = post(http, make_wav(0.5, comment=QUESTION), response_format="text", language="en")
        assert ok.status_code == 200 and ok.text == QUESTION + "\n"
        assert ok.headers["content-type"].startswith("text/plain")
        bad = post(http, b"%PDF-1.4 not audio", "report.pdf")
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        assert bad.json()["error"]["param"] == "file"
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            refused = http.post(
                "audio/transcriptions",
                files={"file": ("v.wav", make_wav(0.1))},
                data={"model": "whisper-1"},
                headers={"Authorization": ""} | auth,
            )
            assert refused.status_code == 401, auth
            assert refused.json()["error"]["code"] == "invalid_api_key"
        assert http.get("models").json()["data"][0]["id"] == "whisper-1"
        entries = http.get(base_url(stt).removesuffix("/v1") + "/debug/requests").json()["requests"]
    first = entries[0]
    assert first["model"] == "whisper-1" and first["filename"] == "voice.wav" and first["language"] == "en"
    assert first["mimetype"] == "audio/wav" and first["response_format"] == "text" and first["key_sent"]
    assert [e["outcome"] for e in entries] == [
        "ok",
        "error_400",
        "unauthorized",
        "unauthorized",
        "unauthorized",
    ]
    # neither the audio, the key nor the transcript is kept or logged
    logs = stt.logs()
    assert KEY not in str(entries) and KEY not in logs and QUESTION not in logs
    assert "stt_started" in logs and "DEVELOPMENT" in logs


# --------------------------------------------------------------------------- in-process


@pytest.fixture(scope="module")
def app() -> Iterator[TestClient]:
    with TestClient(create_app()) as client:
        yield client


def test_without_a_key_anyone_may_transcribe(app: TestClient) -> None:
    answer = post(app, make_wav(1.0, comment="  Book a   room\tfor Friday "))
    assert answer.status_code == 200 and answer.json() == {"text": "Book a room for Friday"}
    assert post(app, OGG, "voice.ogg").json() == {"text": "(stand-in transcript of a recording)"}
    assert app.get("/health").json() == {"status": "healthy"}


@pytest.mark.parametrize(
    ("files", "fields", "param"),
    [
        (None, {"model": "whisper-1"}, "file"),
        ({"file": ("v.wav", WAV)}, {}, "model"),
        (
            {"file": ("v.wav", make_wav(0.1))},
            {"model": "whisper-1", "response_format": "srt"},
            "response_format",
        ),
        ({"file": ("notes.txt", b"just text")}, {"model": "whisper-1"}, "file"),
    ],
)
def test_bad_requests_get_openai_errors(
    app: TestClient, files: dict[str, Any] | None, fields: dict[str, str], param: str
) -> None:
    answer = app.post("/v1/audio/transcriptions", files=files, data=fields)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_an_upload_over_the_limit_is_413(app: TestClient) -> None:
    answer = app.post(
        "/v1/audio/transcriptions",
        content=b"x",
        headers={
            "content-type": "multipart/form-data; boundary=b",
            "content-length": str(MAX_UPLOAD_BYTES * 2),
        },
    )
    assert answer.status_code == 413 and answer.json()["error"]["param"] == "file"


def test_transcript_rules() -> None:
    assert transcript(make_wav(0.25, comment=QUESTION)) == QUESTION
    assert transcript(make_wav(1.26)) == "(stand-in transcript of a 1.3-second recording)"
    assert transcript(b"ID3\x04" + bytes(60)) == "(stand-in transcript of a recording)"  # MP3
    assert transcript(b"\x00\x00\x00\x20ftypisom" + bytes(40)) == "(stand-in transcript of a recording)"
    with pytest.raises(Exception, match="Invalid file format"):
        transcript(b"\x89PNG\r\n\x1a\n" + bytes(40))
    assert key_matches(f"Bearer {KEY}", KEY) and key_matches(f"bearer  {KEY}", KEY)
    assert not key_matches(None, KEY) and not key_matches(KEY, KEY) and not key_matches("Bearer x", KEY)
