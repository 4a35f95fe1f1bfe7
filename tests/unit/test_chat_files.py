"""`make chat`'s files: `/file PATH [caption]` and `/voice PATH` become the events the bot reads
(the type from the bytes, the caption as MSC2530 says, a voice message as MSC3245 says), an
encrypted room gets ciphertext with the key in the event, and the bot's own images are shown
as one readable line and saved decrypted. No homeserver: a fake client stands in for nio's."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from nio import MemoryDownloadResponse, UploadResponse
from nio.crypto.attachments import decrypt_attachment, encrypt_attachment

from vagent_dev.audio_files import make_wav
from vagent_dev.chat import RESET, Transcript, save_media, upload
from vagent_dev.chat_files import (
    AUDIO_KEY,
    HELP,
    VOICE_KEY,
    CommandError,
    FileCommand,
    describe_media,
    image_size,
    load_file,
    max_bytes_from_env,
    media_content,
    outgoing,
    parse_command,
    saved_path,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "deploy" / "dev" / "samples"
PNG_HEADER = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR" + (640).to_bytes(4, "big") + (480).to_bytes(4, "big")


# --------------------------------------------------------------------------- commands


@pytest.mark.parametrize(
    ("line", "path", "caption", "voice"),
    [
        ("/file report.pdf", "report.pdf", None, False),
        ("/file report.pdf  what is the outlook? ", "report.pdf", "what is the outlook?", False),
        ('/file "my notes.docx" who does what?', "my notes.docx", "who does what?", False),
        ("/file 'a b.png'", "a b.png", None, False),
        ("/voice deploy/dev/samples/voice.wav", "deploy/dev/samples/voice.wav", None, True),
    ],
)
def test_commands_are_parsed(line: str, path: str, caption: str | None, voice: bool) -> None:
    assert parse_command(line) == FileCommand(Path(path), caption, voice)


def test_other_lines_are_text_and_bad_commands_say_why() -> None:
    for text in ("hello", "/filed x", "!help", "", "what is /file?"):
        assert parse_command(text) is None
    with pytest.raises(CommandError, match="usage: /file PATH"):
        parse_command("/file  ")
    with pytest.raises(CommandError, match="closing quotation"):
        parse_command('/file "unfinished.pdf')
    assert parse_command("/file ~/x.pdf") == FileCommand(Path.home() / "x.pdf", None, False)
    assert "/file PATH [caption]" in HELP and "/voice PATH" in HELP


def test_missing_empty_and_too_large_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no such file"):
        load_file(FileCommand(tmp_path / "nope.pdf", None, False), 1024)
    with pytest.raises(CommandError, match="not a file"):
        load_file(FileCommand(tmp_path, None, False), 1024)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(CommandError, match="empty"):
        load_file(FileCommand(tmp_path / "empty.txt", None, False), 1024)
    (tmp_path / "big.txt").write_bytes(b"x" * 2048)
    with pytest.raises(CommandError, match=r"2 KB is larger than the 1 KB .*ATTACHMENT_MAX_BYTES"):
        load_file(FileCommand(tmp_path / "big.txt", None, False), 1024)
    assert max_bytes_from_env({"ATTACHMENT_MAX_BYTES": "4096"}) == 4096
    assert max_bytes_from_env({"ATTACHMENT_MAX_BYTES": "lots"}) == max_bytes_from_env({}) == 20 * 1024 * 1024


# --------------------------------------------------------------------------- events


@pytest.mark.parametrize(
    ("name", "msgtype", "mimetype"),
    [
        ("report.pdf", "m.file", "application/pdf"),
        ("notes.docx", "m.file", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
        ("screenshot.png", "m.image", "image/png"),
        ("voice.wav", "m.audio", "audio/wav"),
    ],
)
def test_the_samples_go_as_their_kind(name: str, msgtype: str, mimetype: str) -> None:
    file = load_file(FileCommand(SAMPLES / name, None, False), 1 << 20)
    assert (file.name, file.msgtype, file.mimetype) == (name, msgtype, mimetype)
    if msgtype == "m.image":
        assert (file.width, file.height) == (480, 270)
    if msgtype == "m.audio":
        assert file.duration_ms == 1500


def test_a_file_with_a_caption_and_without(tmp_path: Path) -> None:
    file = outgoing("chart.png", PNG_HEADER + bytes(20))
    plain = media_content(file, url="mxc://localhost/abc")
    assert plain == {
        "msgtype": "m.image",
        "body": "chart.png",
        "filename": "chart.png",
        "info": {"mimetype": "image/png", "size": len(file.data), "w": 640, "h": 480},
        "url": "mxc://localhost/abc",
    }
    captioned = media_content(file, caption="what does it show?", encrypted={"url": "mxc://localhost/abc"})
    assert captioned["body"] == "what does it show?" and captioned["filename"] == "chart.png"
    assert "url" not in captioned and captioned["file"] == {"url": "mxc://localhost/abc"}
    odd = outgoing("data.bin", bytes(range(256)))
    assert (odd.msgtype, odd.mimetype) == ("m.file", "application/octet-stream")
    with pytest.raises(ValueError):
        media_content(file)


def test_a_voice_message() -> None:
    file = outgoing("voice.wav", make_wav(2.5, rate=8000), voice=True)
    content = media_content(file, voice=True, url="mxc://localhost/v")
    assert content["msgtype"] == "m.audio" and content[VOICE_KEY] == {}
    assert content[AUDIO_KEY] == {"duration": 2500} and content["info"]["duration"] == 2500
    with pytest.raises(CommandError, match="not an audio recording"):
        outgoing("report.pdf", (SAMPLES / "report.pdf").read_bytes(), voice=True)


class FakeClient:
    """What `upload` and `save_media` use of nio's AsyncClient, keeping what was uploaded."""

    def __init__(self) -> None:
        self.uploaded: dict[str, tuple[bytes, str]] = {}

    async def upload(self, data: io.BytesIO, content_type: str, filename: str, filesize: int) -> Any:
        uri = f"mxc://localhost/m{len(self.uploaded)}"
        self.uploaded[uri] = (data.read(), content_type)
        assert filesize == len(self.uploaded[uri][0])
        return UploadResponse(uri), None

    async def download(self, mxc: str) -> Any:
        return MemoryDownloadResponse(self.uploaded[mxc][0], "application/octet-stream", None)


async def test_an_encrypted_room_gets_ciphertext_and_the_key_in_the_event(tmp_path: Path) -> None:
    client = FakeClient()
    data = (SAMPLES / "report.pdf").read_bytes()
    content = await upload(client, outgoing("report.pdf", data), True, "summarise it", False)  # type: ignore[arg-type]
    stored, kind = client.uploaded[content["file"]["url"]]
    assert kind == "application/octet-stream" and stored != data and "url" not in content
    key = content["file"]
    assert decrypt_attachment(stored, key["key"]["k"], key["hashes"]["sha256"], key["iv"]) == data
    assert content["body"] == "summarise it" and content["info"]["mimetype"] == "application/pdf"
    # ... and saved back decrypted, under a name not taken yet
    (tmp_path / "report.pdf").write_bytes(b"older")
    path = await save_media(client, content, tmp_path, 1 << 20)  # type: ignore[arg-type]
    assert path == tmp_path / "report-2.pdf" and path.read_bytes() == data
    plain = await upload(client, outgoing("report.pdf", data), False, None, False)  # type: ignore[arg-type]
    assert client.uploaded[plain["url"]] == (data, "application/pdf")


async def test_saving_refuses_what_it_cannot_decrypt_or_is_too_large(tmp_path: Path) -> None:
    client = FakeClient()
    ciphertext, keys = encrypt_attachment(b"image bytes")
    client.uploaded["mxc://localhost/x"] = (ciphertext, "application/octet-stream")
    bad = {**keys, "url": "mxc://localhost/x", "hashes": {"sha256": "AAAA"}}
    with pytest.raises(CommandError, match="could not decrypt"):
        await save_media(client, {"body": "x.png", "file": bad}, tmp_path, 1 << 20)  # type: ignore[arg-type]
    with pytest.raises(CommandError, match="larger than"):
        await save_media(client, {"body": "x.png", "url": "mxc://localhost/x"}, tmp_path, 4)  # type: ignore[arg-type]
    with pytest.raises(CommandError, match="names no file"):
        await save_media(client, {"body": "x.png"}, tmp_path, 1 << 20)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the bot's files


def test_the_bots_files_are_one_readable_line() -> None:
    image = {"msgtype": "m.image", "body": "chart.png", "info": {"w": 640, "h": 480, "size": 12 * 1024}}
    assert describe_media(image) == "[image: chart.png, 640x480, 12 KB]"
    audio = {"msgtype": "m.audio", "body": "hi", "filename": "a.ogg", "info": {"duration": 1500}}
    assert describe_media(audio) == "[audio: a.ogg, 1.5 s] hi"
    assert (
        describe_media({"msgtype": "m.file", "body": "../../x\x1b.txt", "info": "junk"}) == "[file: x .txt]"
    )
    assert describe_media({"msgtype": "m.text", "body": "hello"}) is None
    out = io.StringIO()
    transcript = Transcript(out)
    transcript.new("$1", describe_media(image) or "")
    transcript.note("(saved to .data/chat/received/chart.png)")
    assert out.getvalue().replace("\033[36m", "").replace("\033[2m", "").replace(RESET, "") == (
        "vagent: [image: chart.png, 640x480, 12 KB]\n(saved to .data/chat/received/chart.png)\n"
    )


def test_saved_names_are_clean_and_new(tmp_path: Path) -> None:
    assert saved_path(tmp_path, "../../etc/passwd") == tmp_path / "passwd"
    (tmp_path / "README").write_text("")
    assert saved_path(tmp_path, "README") == tmp_path / "README-2"


def test_image_sizes_from_headers() -> None:
    assert image_size(PNG_HEADER) == (640, 480)
    assert image_size(b"GIF89a\x20\x00\x10\x00") == (32, 16)
    jpeg = b"\xff\xd8\xff\xe0\x00\x04ab\xff\xc0\x00\x11\x08\x00\x78\x00\xa0\x03"
    assert image_size(jpeg) == (160, 120)
    vp8x = (
        b"RIFF\x00\x00\x00\x00WEBPVP8X" + bytes(8) + (99).to_bytes(3, "little") + (49).to_bytes(3, "little")
    )
    assert image_size(vp8x) == (100, 50)
    assert image_size(b"not an image") is None


def test_image_sizes_agree_with_pillow() -> None:
    pil = pytest.importorskip("PIL.Image")
    for fmt in ("PNG", "JPEG", "GIF", "WEBP"):
        for size in ((1, 1), (33, 17), (300, 200)):
            out = io.BytesIO()
            pil.new("RGB", size, (10, 20, 30)).save(out, format=fmt)
            assert image_size(out.getvalue()) == size, (fmt, size)
