"""Files, images, voice and video in the conversation, without a server: what a media event
says (`media`), when the bot answers one (`routing`), the words a user reads when a file is
not taken, and the `m.image` the bot posts (`event_content`)."""

from __future__ import annotations

from typing import Any

import pytest

from vagent_bot.answers.event_content import image_content
from vagent_bot.conversation.routing import Decision, IncomingMessage, parse_message, should_answer
from vagent_bot.matrix.media import (
    FILE_KINDS,
    VOICE_KINDS,
    EncryptedFile,
    declared_size_refusal,
    heard_line,
    human_size,
    kind_refusal,
    media_of_event,
    mxc_parts,
    parse_media,
    type_refusal,
    video_refusal,
    with_transcript,
)

BOT = "@vagent:example.org"
ALICE = "@alice:example.org"
ROOM = "!room:example.org"
MXC = "mxc://example.org/AbC123_-x"
REPLY: dict[str, Any] = {"m.relates_to": {"m.in_reply_to": {"event_id": "$b"}}}
THREAD: dict[str, Any] = {"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}


def content(msgtype: str = "m.file", body: str = "report.pdf", **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"msgtype": msgtype, "body": body, "url": MXC}
    c.update(extra)
    return c


def media_msg(
    msgtype: str = "m.file", body: str = "report.pdf", *, sender: str = ALICE, **extra: Any
) -> IncomingMessage:
    event = {
        "type": "m.room.message",
        "event_id": "$file",
        "sender": sender,
        "origin_server_ts": 1,
        "content": content(msgtype, body, **extra),
    }
    msg = parse_message(event, ROOM)
    assert msg is not None
    return msg


def decide(
    msg: IncomingMessage, *, dm: bool = False, replied_to: str | None = None, in_thread: bool = False
) -> Decision:
    return should_answer(
        msg,
        bot_user_id=BOT,
        bot_display_name="vagent",
        is_dm=dm,
        prefix="!ai",
        replied_to_sender=replied_to,
        bot_in_thread=in_thread,
    )


# ---- what a media event says ------------------------------------------------------------------
def test_a_plain_file_event() -> None:
    m = parse_media(content(info={"mimetype": "application/pdf", "size": 1234}))
    assert m is not None
    assert (m.msgtype, m.kind, m.name, m.caption) == ("m.file", "file", "report.pdf", None)
    assert (m.mimetype, m.size, m.url, m.encrypted, m.is_voice) == ("application/pdf", 1234, MXC, None, False)


def test_an_encrypted_file_event_carries_its_key_iv_and_hash() -> None:
    file = {
        "v": "v2",
        "url": MXC,
        "key": {"kty": "oct", "alg": "A256CTR", "k": "KEY", "ext": True, "key_ops": ["decrypt"]},
        "iv": "IV",
        "hashes": {"sha256": "HASH"},
    }
    c = content("m.image", "cat.png", file=file)
    del c["url"]
    m = parse_media(c)
    assert m is not None and m.url == MXC and m.kind == "file"
    assert m.encrypted == EncryptedFile(key="KEY", iv="IV", sha256="HASH")


@pytest.mark.parametrize(
    "file",
    [
        {"url": MXC, "iv": "IV", "hashes": {"sha256": "H"}},  # no key
        {"url": MXC, "key": {"k": "K"}, "hashes": {"sha256": "H"}},  # no iv
        {"url": MXC, "key": {"k": "K"}, "iv": "IV", "hashes": {}},  # no hash
        {"url": "https://evil.example/x", "key": {"k": "K"}, "iv": "IV", "hashes": {"sha256": "H"}},
    ],
)
def test_an_encrypted_file_without_what_decrypts_it_is_no_file(file: dict[str, Any]) -> None:
    c = content(file=file)
    del c["url"]
    assert parse_media(c) is None


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        (MXC, ("example.org", "AbC123_-x")),
        ("mxc://localhost:8448/abc", ("localhost:8448", "abc")),
        ("mxc://[::1]:8448/abc", ("[::1]:8448", "abc")),
        ("mxc://example.org/../etc/passwd", None),
        ("mxc://example.org/a/b", None),
        ("mxc://example.org/", None),
        ("http://example.org/abc", None),
        ("mxc://exa mple.org/abc", None),
    ],
)
def test_only_real_mxc_uris_are_downloaded(url: str, parts: tuple[str, str] | None) -> None:
    assert mxc_parts(url) == parts
    assert (parse_media(content(url=url)) is None) == (parts is None)


def test_caption_is_the_body_when_a_different_filename_is_given() -> None:
    """MSC2530: `filename` present and different from `body` -> `body` is the caption."""
    m = parse_media(content(body="What does page 3 say?", filename="report.pdf"))
    assert m is not None and m.name == "report.pdf" and m.caption == "What does page 3 say?"
    same = parse_media(content(body="report.pdf", filename="report.pdf"))
    assert same is not None and same.caption is None
    blank = parse_media(content(body="   ", filename="report.pdf"))
    assert blank is not None and blank.caption is None
    no_name = parse_media(content(body="report.pdf", filename=""))
    assert no_name is not None and no_name.name == "report.pdf" and no_name.caption is None


def test_the_file_name_is_cleaned() -> None:
    m = parse_media(content(body="../../etc/passwd\x07"))
    assert m is not None and m.name == "passwd"


def test_voice_messages_and_odd_info() -> None:
    voice = parse_media(content("m.audio", "Voice message.ogg", **{"org.matrix.msc3245.voice": {}}))
    assert voice is not None and voice.is_voice and voice.kind == "audio"
    music = parse_media(content("m.audio", "song.mp3"))
    assert music is not None and not music.is_voice and music.kind == "audio"
    odd = parse_media(content(info={"mimetype": 5, "size": True}))
    assert odd is not None and odd.mimetype is None and odd.size is None
    assert parse_media(content(info={"size": -1})).size is None  # type: ignore[union-attr]
    video = parse_media(content("m.video", "clip.mp4"))
    assert video is not None and video.kind == "video"


@pytest.mark.parametrize("msgtype", ["m.text", "m.notice", "m.location", "m.emote", ""])
def test_other_msgtypes_are_no_media(msgtype: str) -> None:
    assert parse_media(content(msgtype)) is None


def test_media_of_a_fetched_event() -> None:
    assert media_of_event({"type": "m.room.message", "content": content()}) is not None
    assert media_of_event({"type": "m.sticker", "content": content()}) is None
    assert media_of_event({"type": "m.room.message"}) is None


# ---- when the bot answers a media event -------------------------------------------------------
def test_dm_file_alone_is_kept_for_the_next_question() -> None:
    assert decide(media_msg(), dm=True) == Decision(True, "file_alone", "")


def test_dm_file_with_caption_is_a_question() -> None:
    assert decide(media_msg(body="!ai summarise this", filename="r.pdf"), dm=True) == Decision(
        True, "dm", "summarise this"
    )
    # a caption that is only the address asks nothing: the file is kept
    assert decide(media_msg(body="@vagent:example.org", filename="r.pdf"), dm=True) == Decision(
        True, "file_alone", ""
    )


def test_group_file_without_caption_is_not_for_the_bot() -> None:
    assert decide(media_msg()) == Decision(False, "not_addressed", "")
    # not even when its name happens to be the bot's name, in a reply to the bot or in its thread
    assert not decide(media_msg(body="vagent-notes.pdf")).answer
    assert not decide(media_msg(**REPLY), replied_to=BOT).answer
    assert not decide(media_msg(**THREAD), in_thread=True).answer


def test_group_file_is_answered_when_its_caption_addresses_the_bot() -> None:
    mention = decide(media_msg(body="vagent: what is in it?", filename="r.pdf"))
    assert mention == Decision(True, "mention", "what is in it?")
    prefix = decide(media_msg(body="!ai what is in it?", filename="r.pdf"))
    assert prefix == Decision(True, "prefix", "what is in it?")
    mentions: dict[str, Any] = {"m.mentions": {"user_ids": [BOT]}}
    pill = media_msg(body="hey what is this", filename="r.pdf", **mentions)
    assert decide(pill).reason == "mention"
    chatter = decide(media_msg(body="look at this, everyone", filename="r.pdf"))
    assert chatter == Decision(False, "not_addressed", "look at this, everyone")
    only_address = decide(media_msg(body="@vagent", filename="r.pdf"))
    assert only_address == Decision(True, "file_alone", "")


def test_videos_are_answered_with_a_refusal_when_addressed() -> None:
    assert decide(media_msg("m.video", "clip.mp4"), dm=True) == Decision(True, "video", "")
    assert decide(media_msg("m.video", "clip.mp4")).answer is False
    addressed = decide(media_msg("m.video", "what happens here, vagent?", filename="clip.mp4"))
    assert addressed.answer and addressed.reason == "video"


VOICE: dict[str, Any] = {"org.matrix.msc3245.voice": {}, "info": {"mimetype": "audio/ogg"}}


def test_voice_in_a_dm_is_always_a_question() -> None:
    assert decide(media_msg("m.audio", "Voice message.ogg", **VOICE), dm=True) == Decision(True, "dm", "")


def test_voice_in_a_group_only_in_the_bots_thread_or_as_a_reply_to_it() -> None:
    voice = media_msg("m.audio", "Voice message.ogg", **VOICE)
    assert decide(voice) == Decision(False, "not_addressed", "")
    reply = media_msg("m.audio", "Voice message.ogg", **VOICE, **REPLY)
    assert decide(reply, replied_to=BOT) == Decision(True, "reply", "")
    assert not decide(reply, replied_to="@bob:example.org").answer
    in_thread = media_msg("m.audio", "Voice message.ogg", **VOICE, **THREAD)
    assert decide(in_thread, in_thread=True) == Decision(True, "thread", "")
    assert not decide(in_thread, in_thread=False).answer


def test_own_media_and_media_without_a_file_are_never_answered() -> None:
    assert decide(media_msg(sender=BOT), dm=True).reason == "own_event"
    event = {
        "type": "m.room.message",
        "event_id": "$x",
        "sender": ALICE,
        "content": {"msgtype": "m.image", "body": "x.png"},
    }
    no_url = parse_message(event, ROOM)
    assert no_url is not None and no_url.media is None
    assert decide(no_url, dm=True) == Decision(False, "msgtype", "x.png")


def test_a_text_reply_to_a_file_follows_the_text_rules() -> None:
    event = {
        "type": "m.room.message",
        "event_id": "$q",
        "sender": ALICE,
        "content": {
            "msgtype": "m.text",
            "body": "> <@bob:example.org> report.pdf\n\n!ai summarise this",
            "m.relates_to": {"m.in_reply_to": {"event_id": "$file"}},
        },
    }
    msg = parse_message(event, ROOM)
    assert msg is not None and msg.media is None and msg.in_reply_to == "$file"
    assert decide(msg, replied_to="@bob:example.org") == Decision(True, "prefix", "summarise this")
    assert decide(msg, dm=True) == Decision(True, "dm", "summarise this")


# ---- the words a user reads ---------------------------------------------------------------------
def test_sizes_read_like_clients_show_them() -> None:
    assert [human_size(n) for n in (10, 1536, 20 * 1024 * 1024, 3 * 1024**3)] == [
        "10 bytes",
        "1.5 KB",
        "20 MB",
        "3 GB",
    ]


def test_refusals_name_the_file_and_the_reason() -> None:
    big = parse_media(content(info={"size": 30 * 1024 * 1024}))
    assert big is not None
    assert (
        declared_size_refusal(big, 20 * 1024 * 1024)
        == "report.pdf (30 MB) is larger than the 20 MB I can take."
    )
    small = parse_media(content(info={"size": 10}))
    assert small is not None and declared_size_refusal(small, 1024) is None
    mib = 1024 * 1024
    just_over = parse_media(content(info={"size": 2 * mib + 10}))  # "2 MB", like the limit
    assert just_over is not None
    assert declared_size_refusal(just_over, 2 * mib) == "report.pdf is larger than the 2 MB I can take."
    assert type_refusal("a.pdf", "application/pdf", FILE_KINDS) is None
    assert type_refusal("cat.png", "image/png", FILE_KINDS) is None
    assert "can't read setup.exe" in (type_refusal("setup.exe", None, FILE_KINDS) or "")
    assert type_refusal("song.ogg", "audio/ogg", FILE_KINDS) is not None
    assert type_refusal("v.ogg", "audio/ogg", VOICE_KINDS) is None
    assert "v.pdf is not a voice recording" in (type_refusal("v.pdf", "application/pdf", VOICE_KINDS) or "")
    video = parse_media(content("m.video", "clip.mp4"))
    audio = parse_media(content("m.audio", "talk.ogg"))
    assert video is not None and audio is not None
    assert kind_refusal(video) == video_refusal(
        "clip.mp4"
    ) and "videos are not supported yet" in video_refusal("x")
    assert "talk.ogg" in (kind_refusal(audio) or "")
    assert kind_refusal(parse_media(content())) is None  # type: ignore[arg-type]


def test_the_heard_line_quotes_the_transcript_on_one_short_line() -> None:
    assert heard_line("what is on\nmy   calendar") == '> 🎤 "what is on my calendar"\n\n'
    long = heard_line("word " * 200)
    assert len(long) < 320 and long.endswith('…"\n\n') and "\n" not in long.strip()
    assert with_transcript("", "hello") == "hello"
    assert with_transcript("translate:", "hallo") == "translate:\n\nhallo"


# ---- the m.image the bot posts ------------------------------------------------------------------
def test_image_content_plain_and_encrypted() -> None:
    plain = image_content("chart.png", "image/png", 42, url=MXC, width=10, height=20, reply_to="$q")
    assert plain == {
        "msgtype": "m.image",
        "body": "chart.png",
        "info": {"mimetype": "image/png", "size": 42, "w": 10, "h": 20},
        "m.mentions": {},
        "url": MXC,
        "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}},
    }
    file = {"url": MXC, "key": {"k": "K"}, "iv": "IV", "hashes": {"sha256": "H"}, "v": "v2"}
    enc = image_content("chart.png", "image/png", 42, file=file, thread_root="$root", reply_to="$q")
    assert "url" not in enc and enc["file"] == file and enc["info"] == {"mimetype": "image/png", "size": 42}
    assert enc["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$q"},
    }
