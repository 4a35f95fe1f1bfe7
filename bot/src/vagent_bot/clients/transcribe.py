"""Voice messages to text, by an OpenAI-compatible speech-to-text service.

`POST {STT_BASE_URL}/audio/transcriptions` (multipart: `model`, `file`), the way OpenAI,
whisper.cpp's server, faster-whisper-server and vLLM take it. The transcript becomes the
question, so every failure is a `TranscriptionFailed` whose `user_message` asks the user to
type instead. The API key is sent, never logged; the transcript is not logged either (only
its length).
"""

from __future__ import annotations

import re

import aiohttp
import structlog

from vagent_bot.clients.http import proxy_for
from vagent_shared.http_session import LazySession
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

NOT_CONFIGURED = "🎤 Voice messages are not set up here, so I can't listen to them. Please type instead."
TYPE_INSTEAD = "Please type it instead."
#: The file name's extension is how many services tell the audio format apart.
_EXTENSIONS = {
    "audio/ogg": ".ogg",
    "audio/wav": ".wav",
    "audio/mpeg": ".mp3",
    "audio/mp4": ".m4a",
    "audio/webm": ".webm",
    "audio/flac": ".flac",
}


class TranscriptionFailed(Exception):
    """No transcript; `user_message` is safe to show."""

    def __init__(self, reason: str, user_message: str) -> None:
        super().__init__(reason)
        self.reason, self.user_message = reason, user_message


class Transcriber:
    """The speech-to-text client; `configured` is False without STT_BASE_URL."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        *,
        timeout_seconds: float = 60.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        self.model, self._api_key = model, api_key
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._proxy = proxy_for(self.base_url) if self.base_url else None
        self._session = LazySession(session)

    @classmethod
    def from_settings(cls, settings: BotSettings) -> Transcriber:
        key = settings.STT_API_KEY.get_secret_value() if settings.STT_API_KEY else None
        return cls(
            settings.STT_BASE_URL, settings.STT_MODEL, key, timeout_seconds=settings.STT_TIMEOUT_SECONDS
        )

    @property
    def configured(self) -> bool:
        return self.base_url is not None

    async def aclose(self) -> None:
        await self._session.aclose()

    async def transcribe(self, audio: bytes, name: str, mimetype: str) -> str:
        """The words of `audio` (its type sniffed from its bytes); raises TranscriptionFailed."""
        if self.base_url is None:
            raise TranscriptionFailed("not_configured", NOT_CONFIGURED)
        form = aiohttp.FormData()
        form.add_field("model", self.model)
        form.add_field("response_format", "json")
        form.add_field("file", audio, filename=audio_filename(name, mimetype), content_type=mimetype)
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            async with self._session.get().post(
                f"{self.base_url}/audio/transcriptions",
                data=form,
                headers=headers,
                timeout=self._timeout,
                proxy=self._proxy,
            ) as resp:
                if resp.status != 200:
                    log.warning("stt_refused", status=resp.status)
                    raise TranscriptionFailed(
                        f"http_{resp.status}",
                        f"🎤 The speech service could not transcribe your voice message. {TYPE_INSTEAD}",
                    )
                text = await _transcript(resp)
        except TimeoutError as exc:
            log.warning("stt_timeout")
            raise TranscriptionFailed(
                "timeout", f"🎤 The speech service took too long with your voice message. {TYPE_INSTEAD}"
            ) from exc
        except (aiohttp.ClientError, ValueError) as exc:
            log.warning("stt_failed", error_type=type(exc).__name__)
            raise TranscriptionFailed(
                "unreachable", "🎤 I can't reach the speech service right now. Please type your question."
            ) from exc
        if not text:
            raise TranscriptionFailed("empty", "🎤 I could not make out any words in your voice message.")
        log.info("stt_transcribed", audio_bytes=len(audio), chars=len(text))
        return text


async def _transcript(resp: aiohttp.ClientResponse) -> str:
    """`{"text": ...}`, or the plain text some servers answer with."""
    if resp.content_type == "application/json":
        body = await resp.json()
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str):
            raise ValueError("no text in the transcription answer")
        return text.strip()
    return (await resp.text()).strip()


def audio_filename(name: str, mimetype: str) -> str:
    """`name` in plain ASCII with the extension of its real type (a voice message may be called
    "Voice message"; multipart would percent-encode anything else)."""
    ext = _EXTENSIONS.get(mimetype, "")
    stem = name.rsplit(".", 1)[0] if "." in name else name
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", stem).strip("_")[:64]
    return f"{stem or 'voice'}{ext}"
