"""Tests for the scripted speech-to-text server of tests/support (`ScriptedSTTServer`).

Why: the bot's voice tests trust it to answer like an OpenAI-compatible service and to record
what the bot sent, so it is checked here with the bot's own client and plain httpx.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.stt_server import ScriptedSTTServer
from vagent_bot.clients.transcribe import Transcriber, TranscriptionFailed

KEY = "test-stt-key"


@pytest.fixture(scope="module")
def module_server() -> Iterator[ScriptedSTTServer]:
    with ScriptedSTTServer(api_key=KEY) as server:
        yield server


@pytest.fixture
def stt(module_server: ScriptedSTTServer) -> ScriptedSTTServer:
    """The module's server, with its script, records and options reset."""
    module_server.clear()
    module_server.delay, module_server.error, module_server.api_key = 0.0, None, KEY
    return module_server


def transcribe(stt: ScriptedSTTServer, **fields: str) -> httpx.Response:
    return httpx.post(
        f"{stt.base_url}/audio/transcriptions",
        files={"file": ("voice.ogg", b"OggS" + bytes(60), "audio/ogg")},
        data={"model": "whisper-1", **fields},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=5,
    )


async def test_the_bots_client_gets_the_script_then_the_default(stt: ScriptedSTTServer) -> None:
    stt.push("first answer")
    client = Transcriber(stt.base_url, "small-model", KEY, timeout_seconds=5)
    try:
        assert await client.transcribe(b"OggS" + bytes(100), "Voice message", "audio/ogg") == "first answer"
        assert await client.transcribe(b"OggS" + bytes(10), "v.ogg", "audio/ogg") == stt.default_text
    finally:
        await client.aclose()
    first = stt.requests[0]
    assert (first.model, first.size, first.content_type) == ("small-model", 104, "audio/ogg")
    assert str(first.filename).endswith(".ogg") and first.response_format == "json"
    assert first.auth_header and first.authorized and first.data.startswith(b"OggS")


def test_text_format_errors_and_keys(stt: ScriptedSTTServer) -> None:
    stt.push("plain")
    answer = transcribe(stt, response_format="text", language="de")
    assert answer.text == "plain\n" and stt.requests[-1].language == "de"
    stt.push_error(503, "overloaded")
    failed = transcribe(stt)
    assert failed.status_code == 503 and failed.json()["error"]["message"] == "overloaded"
    stt.error = 500
    assert transcribe(stt).status_code == 500
    stt.error = None
    refused = httpx.post(f"{stt.base_url}/audio/transcriptions", files={"file": ("a", b"x")}, timeout=5)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert not stt.requests[-1].auth_header and not stt.requests[-1].authorized
    stt.api_key = None
    assert transcribe(stt).json() == {"text": stt.default_text}


async def test_delay_reaches_the_bots_timeout(stt: ScriptedSTTServer) -> None:
    stt.delay = 0.5
    client = Transcriber(stt.base_url, "whisper-1", KEY, timeout_seconds=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(TranscriptionFailed) as failed:
            await client.transcribe(b"OggS" + bytes(10), "v.ogg", "audio/ogg")
    finally:
        await client.aclose()
    assert failed.value.reason == "timeout" and time.monotonic() - started < 0.45
    with pytest.raises(ValueError):
        stt.push("x", delay=-1)
