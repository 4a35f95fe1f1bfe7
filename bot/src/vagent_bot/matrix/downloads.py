"""Downloading a file people sent, and refusing it as early as possible.

Streamed from the homeserver's authenticated media API (`/_matrix/client/v1/media/download`,
with the bot's access token: Synapse serves media no other way). nio's `download` would read
any size into memory; here the declared size is refused before the request, the bytes are
counted while they arrive (past ATTACHMENT_MAX_BYTES the download is aborted) and a server
that sends nothing for ATTACHMENT_STALL_SECONDS is given up. A file of an encrypted room is
decrypted only after its SHA-256 matched the event's; then its bytes must be a kind the agent
takes (`media.type_refusal`). Every refusal is a `MediaRefused` whose `user_message` names
the file.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
import structlog
from nio import AsyncClient
from nio.crypto.attachments import decrypt_attachment
from nio.exceptions import EncryptionError

from vagent_bot.clients.http import proxy_for
from vagent_bot.matrix.media import Media, declared_size_refusal, mxc_parts, too_large, type_refusal
from vagent_shared.attachments import Kind, sniff_mime
from vagent_shared.http_session import LazySession
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

MEDIA_PATH = "/_matrix/client/v1/media/download"
CHUNK = 64 * 1024
TAMPERED = "the file's checksum does not match, it may have been tampered with"


class MediaRefused(Exception):
    """The file is not taken. `user_message` is safe to show and names the file; `reason` is a
    short label for logs and metrics."""

    def __init__(self, reason: str, user_message: str) -> None:
        super().__init__(reason)
        self.reason, self.user_message = reason, user_message


@dataclass(frozen=True)
class Downloaded:
    """A file's (decrypted) bytes and its type as sniffed from them."""

    data: bytes
    mimetype: str


class MediaDownloader:
    """Downloads for one bot: `token` gives the current access token (it changes at login)."""

    def __init__(
        self,
        homeserver: str,
        token: Callable[[], str | None],
        *,
        max_bytes: int,
        stall_seconds: float,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.homeserver = homeserver.rstrip("/")
        self._token, self.max_bytes, self.stall_seconds = token, max_bytes, stall_seconds
        self._proxy = proxy_for(self.homeserver)
        self._session = LazySession(session)

    @classmethod
    def for_client(cls, client: AsyncClient, settings: BotSettings) -> MediaDownloader:
        return cls(
            client.homeserver,
            lambda: client.access_token or None,
            max_bytes=settings.ATTACHMENT_MAX_BYTES,
            stall_seconds=settings.ATTACHMENT_STALL_SECONDS,
        )

    async def aclose(self) -> None:
        await self._session.aclose()

    async def fetch(self, media: Media, accept: frozenset[Kind]) -> Downloaded:
        """The file's bytes, decrypted and of a kind in `accept`; raises MediaRefused."""
        refusal = declared_size_refusal(media, self.max_bytes)
        if refusal is not None:
            raise MediaRefused("too_large", refusal)
        raw = await self._download(media)
        data = await asyncio.to_thread(_decrypt, media, raw) if media.encrypted else raw
        mime = sniff_mime(data, media.name)
        refusal = type_refusal(media.name, mime, accept)
        if refusal is not None or mime is None:
            raise MediaRefused("type", refusal or "")
        log.info("media_downloaded", bytes=len(data), mimetype=mime, encrypted=media.encrypted is not None)
        return Downloaded(data, mime)

    async def _download(self, media: Media) -> bytes:
        parts = mxc_parts(media.url)
        if parts is None:  # parse_media keeps only valid mxc URIs
            raise MediaRefused("bad_url", f"I could not download {media.name}.")
        server, media_id = parts
        url = f"{self.homeserver}{MEDIA_PATH}/{quote(server, safe='')}/{quote(media_id, safe='')}"
        token = self._token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        stall = self.stall_seconds
        timeout = aiohttp.ClientTimeout(total=None, connect=stall, sock_connect=stall, sock_read=stall)
        try:
            async with self._session.get().get(
                url, headers=headers, timeout=timeout, proxy=self._proxy, max_redirects=3
            ) as resp:
                if resp.status != 200:
                    raise _status_refusal(media.name, resp.status)
                size = resp.content_length
                if size is not None and size > self.max_bytes:
                    raise MediaRefused("too_large", too_large(media.name, self.max_bytes, size))
                return await self._read(media.name, resp)
        except TimeoutError as exc:
            log.warning("media_download_stalled", stall_seconds=stall)
            raise MediaRefused(
                "stalled", f"Downloading {media.name} stalled, so I gave up. Please send it again."
            ) from exc
        except aiohttp.ClientError as exc:
            log.warning("media_download_failed", error_type=type(exc).__name__)
            message = f"I could not download {media.name}. Please try again."
            raise MediaRefused("unreachable", message) from exc

    async def _read(self, name: str, resp: aiohttp.ClientResponse) -> bytes:
        """The body, counted as it arrives: past the limit the download stops at once."""
        chunks: list[bytes] = []
        received = 0
        async for chunk in resp.content.iter_chunked(CHUNK):
            received += len(chunk)
            if received > self.max_bytes:
                resp.close()
                raise MediaRefused("too_large", too_large(name, self.max_bytes))
            chunks.append(chunk)
        return b"".join(chunks)


def _status_refusal(name: str, status: int) -> MediaRefused:
    log.warning("media_download_refused", status=status)
    if status == 404:
        return MediaRefused("not_found", f"I could not find {name} on the server any more.")
    if status in (401, 403):
        return MediaRefused("forbidden", f"The server did not let me download {name}.")
    return MediaRefused(f"http_{status}", f"I could not download {name} (the server answered {status}).")


def _decrypt(media: Media, ciphertext: bytes) -> bytes:
    """The plain bytes of an encrypted room's file, only if the ciphertext is the one the event
    names (its SHA-256): anything else was changed on the way."""
    enc = media.encrypted
    assert enc is not None
    try:
        expected = base64.b64decode(enc.sha256 + "=" * (-len(enc.sha256) % 4), validate=True)
    except ValueError as exc:
        raise MediaRefused("tampered", f"I can't use {media.name}: {TAMPERED}.") from exc
    if not hmac.compare_digest(hashlib.sha256(ciphertext).digest(), expected):
        log.warning("media_hash_mismatch")
        raise MediaRefused("tampered", f"I can't use {media.name}: {TAMPERED}.")
    try:
        return bytes(decrypt_attachment(ciphertext, enc.key, enc.sha256, enc.iv))
    except EncryptionError as exc:  # a key or IV that is not one: the event is broken
        raise MediaRefused("undecryptable", f"I could not decrypt {media.name}.") from exc
