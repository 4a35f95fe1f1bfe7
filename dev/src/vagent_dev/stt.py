"""`vagent-stt`: a DEVELOPMENT stand-in for an OpenAI-compatible speech-to-text server.

Why: the bot turns a voice message into a question with `POST {STT_BASE_URL}/audio/
transcriptions`, as OpenAI, faster-whisper-server, whisper.cpp's server and vLLM take it.
`make run`, the demo and the tests need such a server, and no speech model can be downloaded
where this project is built, so this one is deterministic instead of listening:

    POST /v1/audio/transcriptions   multipart: file, model, response_format (json | text),
                                    language (optional, recorded only)
        a WAV with a comment (RIFF LIST/INFO/ICMT chunk) -> {"text": <that comment>}
        any other WAV      -> {"text": "(stand-in transcript of a 1.5-second recording)"}
        other audio        -> {"text": "(stand-in transcript of a recording)"}
        (the type sniffed from the bytes, never taken from the upload's name or header)
        not audio, a missing field, an unknown response_format -> 400; over 25 MB -> 413;
        all in OpenAI's error shape {"error": {"message", "type", "param", "code"}}
    Authorization: Bearer <STT_STANDIN_API_KEY>   when that is set; otherwise 401 invalid_api_key
    GET /v1/models, GET /health, GET/DELETE /debug/requests (model, file name, size, sniffed
    type, format, language, whether a key was sent; never the audio, the key or the text)

`scripts/make_samples.py` writes deploy/dev/samples/voice.wav with the comment "What is on my
calendar today?", so `/voice deploy/dev/samples/voice.wav` in `make chat` asks exactly that.
"""

from __future__ import annotations

import argparse
import hmac
from typing import Any

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from vagent_dev.api_keys import add_request_log_routes, request_log
from vagent_dev.audio_files import read_wav
from vagent_dev.serving import install_json_error_handlers, serve
from vagent_dev.settings import SttSettings
from vagent_shared.attachments import kind_of, sniff_mime

log = structlog.get_logger(__name__)

#: OpenAI's limit for one upload.
MAX_UPLOAD_BYTES = 25 * 1024 * 1024
#: Room for the multipart envelope and the other fields around the file.
_FORM_OVERHEAD = 64 * 1024
RESPONSE_FORMATS = ("json", "text")
#: What `GET /v1/models` lists (any model name is accepted for a transcription).
MODELS = ("whisper-1",)
#: Containers OpenAI transcribes although their bytes sniff as video (the sound track is heard).
_VIDEO_CONTAINERS = frozenset({"video/mp4", "video/webm"})
_SUPPORTED = "flac, m4a, mp3, mp4, mpeg, mpga, oga, ogg, wav, webm"


class SttError(Exception):
    """A request answered in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }
        return JSONResponse(body, status_code=self.status)


# --------------------------------------------------------------------------- pure parts


def transcript(data: bytes, name: str = "") -> str:
    """What the stand-in "hears" in `data`; SttError (400) when it is not audio."""
    mime = sniff_mime(data, name)
    if kind_of(mime) != "audio" and mime not in _VIDEO_CONTAINERS:
        raise SttError(400, f"Invalid file format. Supported formats: {_SUPPORTED}", "file", "invalid_value")
    info = read_wav(data) if mime == "audio/wav" else None
    if info is not None and info.comment:
        return info.comment
    if info is not None and info.duration is not None:
        return f"(stand-in transcript of a {info.duration:.1f}-second recording)"
    return "(stand-in transcript of a recording)"


def key_matches(authorization: str | None, key: str) -> bool:
    """`Authorization: Bearer <key>`, compared in constant time."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


# --------------------------------------------------------------------------- HTTP


async def _read_form(request: Request) -> tuple[bytes, str, str, str, str | None]:
    """(audio, file name, model, response_format, language) of the upload; SttError otherwise."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_UPLOAD_BYTES + _FORM_OVERHEAD:
        raise SttError(413, f"Maximum content size limit ({MAX_UPLOAD_BYTES} bytes) exceeded.", "file")
    try:
        async with request.form(max_files=1, max_fields=20) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise SttError(400, "You must provide a file (multipart field 'file').", "file")
            data = await upload.read(MAX_UPLOAD_BYTES + 1)
            name = upload.filename or ""
            wanted = ("model", "response_format", "language")
            fields = {k: str(form[k]) for k in wanted if isinstance(form.get(k), str)}
    except HTTPException as exc:  # the multipart body itself is broken
        raise SttError(400, f"Could not parse multipart form: {exc.detail}") from None
    if len(data) > MAX_UPLOAD_BYTES:
        raise SttError(413, f"Maximum content size limit ({MAX_UPLOAD_BYTES} bytes) exceeded.", "file")
    model = fields.get("model", "").strip()
    if not model:
        raise SttError(400, "You must provide a model parameter.", "model")
    response_format = fields.get("response_format", "json").strip() or "json"
    if response_format not in RESPONSE_FORMATS:
        raise SttError(
            400,
            f"response_format: {response_format[:40]!r} is not supported by this stand-in "
            f"(one of {', '.join(RESPONSE_FORMATS)})",
            "response_format",
        )
    return data, name, model, response_format, (fields.get("language") or None)


def create_app(api_key: str | None = None) -> FastAPI:
    """The service; `api_key` set: every /v1 request must carry it as a bearer token."""
    app = FastAPI(
        title="vagent speech-to-text stand-in",
        version="0.1.0",
        description="DEV ONLY. An OpenAI-compatible /v1/audio/transcriptions that answers a WAV's "
        "comment instead of listening.",
    )
    install_json_error_handlers(app)
    record = request_log()
    add_request_log_routes(app, record)

    def refused(request: Request) -> Response | None:
        if api_key is None or key_matches(request.headers.get("authorization"), api_key):
            return None
        record.append({"outcome": "unauthorized", "key_sent": "authorization" in request.headers})
        log.info("stt_request", outcome="unauthorized")
        return SttError(401, "Incorrect API key provided.", code="invalid_api_key").response()

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        """OpenAI's transcription endpoint: the WAV's comment, or a fixed stand-in text."""
        if (answer := refused(request)) is not None:
            return answer
        entry: dict[str, Any] = {"key_sent": "authorization" in request.headers}
        try:
            data, name, model, response_format, language = await _read_form(request)
            entry.update(
                model=model,
                filename=name,
                bytes=len(data),
                mimetype=sniff_mime(data, name),
                response_format=response_format,
                language=language,
            )
            text = transcript(data, name)
        except SttError as exc:
            record.append({**entry, "outcome": f"error_{exc.status}"})
            log.info("stt_request", outcome=f"error_{exc.status}", param=exc.param)
            return exc.response()
        record.append({**entry, "outcome": "ok"})
        log.info("stt_request", outcome="ok", bytes=len(data), mimetype=entry["mimetype"], chars=len(text))
        if response_format == "text":
            return PlainTextResponse(text + "\n")
        return JSONResponse({"text": text})

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        """The model names this stand-in lists (it accepts any in a transcription)."""
        if (answer := refused(request)) is not None:
            return answer
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "vagent-stt"} for m in MODELS]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Always 200: the stand-in has nothing that can break."""
        return {"status": "healthy"}

    return app


def main(argv: list[str] | None = None) -> int:
    """Serve on STT_STANDIN_HOST:STT_STANDIN_PORT (configured by STT_STANDIN_* variables)."""
    argparse.ArgumentParser(
        prog="vagent-stt",
        description="DEVELOPMENT speech-to-text stand-in, OpenAI-compatible (never production): "
        "answers a WAV's comment instead of listening. Configured by STT_STANDIN_* variables.",
    ).parse_args(argv)
    settings = SttSettings()
    key = settings.STT_STANDIN_API_KEY.get_secret_value() if settings.STT_STANDIN_API_KEY else None
    return serve(
        "vagent-stt",
        lambda: create_app(key),
        host=settings.STT_STANDIN_HOST,
        port=settings.STT_STANDIN_PORT,
        log_level=settings.LOG_LEVEL,
        startup_errors=(),
        note="DEVELOPMENT speech-to-text stand-in (answers a WAV's comment), never use in production",
        base_url=f"http://{settings.STT_STANDIN_HOST}:{settings.STT_STANDIN_PORT}/v1",
        api_key_required=key is not None,
    )


if __name__ == "__main__":
    raise SystemExit(main())
