"""Should the bot answer? Parsing raw Matrix events and the addressing rules, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from vagent_bot.conversation.routing import (
    Decision,
    IncomingMessage,
    parse_message,
    session_for,
    should_answer,
    strip_reply_fallback,
)
from vagent_shared.session import SessionId

BOT = "@vagent:example.org"
NAME = "vagent"
ROOM = "!room:example.org"
ALICE = "@alice:example.org"


def event(body: Any = "hello", **content: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"msgtype": "m.text", "body": body}
    c.update(content)
    return {
        "type": "m.room.message",
        "event_id": "$ev1",
        "sender": ALICE,
        "origin_server_ts": 1_700_000_000_000,
        "room_id": "!ignored:example.org",
        "content": c,
    }


def msg(
    body: str = "hello",
    *,
    room: str = ROOM,
    sender: str = ALICE,
    extra: dict[str, Any] | None = None,
    **content: Any,
) -> IncomingMessage:
    e = event(body, **(extra or {}), **content)
    e["sender"] = sender
    parsed = parse_message(e, room)
    assert parsed is not None
    return parsed


def decide(
    m: IncomingMessage,
    *,
    dm: bool = False,
    name: str | None = NAME,
    prefix: str = "!ai",
    replied_to: str | None = None,
    in_thread: bool = False,
    bot: str = BOT,
) -> Decision:
    return should_answer(
        m,
        bot_user_id=bot,
        bot_display_name=name,
        is_dm=dm,
        prefix=prefix,
        replied_to_sender=replied_to,
        bot_in_thread=in_thread,
    )


THREAD: dict[str, Any] = {
    "m.relates_to": {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$latest"},
    }
}


# ------------------------------------------------------------------------------ parse_message


def test_parse_a_plain_message() -> None:
    m = msg("hi", format="org.matrix.custom.html", formatted_body="<b>hi</b>")
    assert m == IncomingMessage(
        event_id="$ev1",
        sender=ALICE,
        room_id=ROOM,
        body="hi",
        msgtype="m.text",
        formatted_body="<b>hi</b>",
        thread_root=None,
        in_reply_to=None,
        mentions=(),
        is_edit=False,
        server_ts=1_700_000_000_000,
    )


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "m.room.member", "event_id": "$e", "sender": ALICE, "content": {"body": "x"}},
        {"type": "m.reaction", "event_id": "$e", "sender": ALICE, "content": {}},
        {"type": "m.room.message", "event_id": "$e", "sender": ALICE, "content": {}},  # redacted
        {"type": "m.room.message", "event_id": "$e", "sender": ALICE, "content": {"body": 5}},
        {"type": "m.room.message", "event_id": "$e", "sender": ALICE, "content": {"body": None}},
        {"type": "m.room.message", "event_id": "$e", "sender": ALICE, "content": "body"},
        {"type": "m.room.message", "sender": ALICE, "content": {"body": "x"}},
        {"type": "m.room.message", "event_id": "$e", "content": {"body": "x"}},
        {"type": "m.room.encrypted", "event_id": "$e", "sender": ALICE, "content": {"ciphertext": "x"}},
        {},
    ],
)
def test_parse_refuses_what_is_not_a_text_message(raw: dict[str, Any]) -> None:
    assert parse_message(raw, ROOM) is None


def test_room_id_comes_from_the_argument_and_may_lack_a_server() -> None:
    assert msg(room="!opaqueRoomIdV12").room_id == "!opaqueRoomIdV12"


def test_formatted_body_needs_the_html_format() -> None:
    assert msg("x", formatted_body="<b>x</b>").formatted_body is None
    assert msg("x", format="org.matrix.custom.html", formatted_body=7).formatted_body is None


def test_thread_message_with_fallback_is_not_a_reply() -> None:
    m = msg("in thread", **THREAD)
    assert m.thread_root == "$root" and m.in_reply_to is None


def test_explicit_reply_inside_a_thread_is_a_reply() -> None:
    rel = {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": False,
        "m.in_reply_to": {"event_id": "$bots_answer"},
    }
    m = msg("x", extra={"m.relates_to": rel})
    assert (m.thread_root, m.in_reply_to) == ("$root", "$bots_answer")
    rel.pop("is_falling_back")
    assert msg("x", extra={"m.relates_to": rel}).in_reply_to == "$bots_answer"


def test_plain_reply() -> None:
    m = msg("x", extra={"m.relates_to": {"m.in_reply_to": {"event_id": "$orig"}}})
    assert (m.thread_root, m.in_reply_to, m.is_edit) == (None, "$orig", False)


def test_edit() -> None:
    m = msg(
        "* fixed",
        extra={
            "m.new_content": {"body": "fixed"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$orig"},
        },
    )
    assert m.is_edit and m.thread_root is None and m.in_reply_to is None


def test_mentions_keep_only_strings() -> None:
    m = msg("x", extra={"m.mentions": {"user_ids": [BOT, 3, None, ALICE], "room": True}})
    assert m.mentions == (BOT, ALICE)
    assert msg("x", extra={"m.mentions": {"user_ids": BOT}}).mentions == ()
    assert msg("x", extra={"m.mentions": [BOT]}).mentions == ()


@pytest.mark.parametrize(
    "relates",
    [
        None,
        "x",
        [],
        {"rel_type": "m.thread"},
        {"rel_type": "m.thread", "event_id": 5},
        {"m.in_reply_to": "$x"},
        {"m.in_reply_to": {"event_id": None}},
    ],
)
def test_malformed_relations_are_ignored(relates: Any) -> None:
    m = msg("x", extra={"m.relates_to": relates})
    assert (m.thread_root, m.in_reply_to, m.is_edit) == (None, None, False)


def test_odd_timestamps_and_msgtypes() -> None:
    e = event("x")
    e["origin_server_ts"] = True
    e["content"].pop("msgtype")
    m = parse_message(e, ROOM)
    assert m is not None and m.server_ts == 0 and m.msgtype == ""


# ------------------------------------------------------------------------------ never answered


@pytest.mark.parametrize("dm", [True, False])
def test_own_events_are_ignored_even_with_prefix_or_mention(dm: bool) -> None:
    m = msg(f"!ai {BOT} hello", sender=BOT, extra={"m.mentions": {"user_ids": [BOT]}})
    assert decide(m, dm=dm) == Decision(False, "own_event", "hello")


@pytest.mark.parametrize("dm", [True, False])
def test_notices_are_ignored(dm: bool) -> None:
    assert decide(msg("!ai hi", msgtype="m.notice"), dm=dm).reason == "notice"


@pytest.mark.parametrize("dm", [True, False])
def test_edits_are_ignored(dm: bool) -> None:
    m = msg("* !ai hi", extra={"m.relates_to": {"rel_type": "m.replace", "event_id": "$o"}})
    assert decide(m, dm=dm).reason == "edit"


@pytest.mark.parametrize("msgtype", ["m.image", "m.file", "m.audio", "m.video", "m.location", ""])
def test_non_text_messages_are_ignored_even_in_dms(msgtype: str) -> None:
    d = decide(msg("photo.jpg", msgtype=msgtype), dm=True)
    assert not d.answer and d.reason == "msgtype"


# ------------------------------------------------------------------------------ DMs


@pytest.mark.parametrize(
    "body,text",
    [
        ("hello", "hello"),
        ("  what is 2+2?\n", "what is 2+2?"),
        ("!ai hello", "hello"),
        ("vagent: hello", "hello"),
        ("!reset", "!reset"),
    ],
)
def test_dm_answers_every_message(body: str, text: str) -> None:
    assert decide(msg(body), dm=True) == Decision(True, "dm", text)


def test_dm_emote_is_answered() -> None:
    assert decide(msg("waves", msgtype="m.emote"), dm=True).answer


@pytest.mark.parametrize("body", ["", "   ", "\n\t", "!ai", "!AI   ", f"{BOT}:", "vagent,"])
def test_dm_with_nothing_left_to_say_is_empty(body: str) -> None:
    assert decide(msg(body), dm=True) == Decision(False, "empty", "")


# ------------------------------------------------------------------------------ group rooms


def test_group_message_not_addressed() -> None:
    assert decide(msg("hello everyone")) == Decision(False, "not_addressed", "hello everyone")


def test_mention_by_m_mentions() -> None:
    d = decide(msg("what do you think?", extra={"m.mentions": {"user_ids": [BOT]}}))
    assert d == Decision(True, "mention", "what do you think?")


def test_m_mentions_of_someone_else_do_not_count() -> None:
    assert decide(msg("hi", extra={"m.mentions": {"user_ids": [ALICE]}})).reason == "not_addressed"


@pytest.mark.parametrize(
    "body,text",
    [
        (f"{BOT}: how many records?", "how many records?"),
        (f"{BOT} how many records?", "how many records?"),
        (f"{BOT}, how many records?", "how many records?"),
        (f"{BOT}:how many?", "how many?"),
        (f"hey {BOT}, how many?", f"hey {BOT}, how many?"),  # only a leading mention is removed
        (f"ask ({BOT}) please", f"ask ({BOT}) please"),
        (f"ask {BOT}.", f"ask {BOT}."),
    ],
)
def test_mention_by_user_id_in_body(body: str, text: str) -> None:
    assert decide(msg(body), name=None) == Decision(True, "mention", text)


@pytest.mark.parametrize(
    "body",
    [
        "ask @vagent:example.org.evil.com",  # a longer server name
        "ask @vagent:example.org:8448 about it",  # a port: a different server
        "ask @vagent:example.organic",
        "ask x@vagent:example.org",  # glued to a word
        "ask @vagent:example.org-test",
        "ask @@vagent:example.org",
        "ask @vagent2:example.org",
        "ask @VAGENT:EXAMPLE.ORG",  # user ids are case-sensitive
    ],
)
def test_look_alike_user_ids_are_not_mentions(body: str) -> None:
    assert decide(msg(body), name=None).reason == "not_addressed"


@pytest.mark.parametrize(
    "body,text",
    [
        ("vagent: status?", "status?"),
        ("Vagent, status?", "status?"),
        ("VAGENT status?", "status?"),
        ("@vagent status?", "status?"),
        ("hey vagent, status?", "hey vagent, status?"),
        ("what does vagent think?", "what does vagent think?"),
        ("vagent's answer was wrong", "vagent's answer was wrong"),
        ("(vagent)", "(vagent)"),
        ("ping vagent", "ping vagent"),
    ],
)
def test_mention_by_display_name_as_a_whole_word(body: str, text: str) -> None:
    assert decide(msg(body)) == Decision(True, "mention", text)


@pytest.mark.parametrize(
    "body",
    [
        "vagents are great",
        "myvagent is down",
        "the vagent_bot user",
        "revagent",
        "vagent2 said",
        "v agent",
        "vägent",
    ],
)
def test_display_name_inside_another_word_does_not_count(body: str) -> None:
    assert decide(msg(body)).reason == "not_addressed"


def test_display_name_is_matched_literally_not_as_a_regex() -> None:
    name = "V.Agent (beta)+"
    assert decide(msg("hi V.Agent (beta)+ there"), name=name).reason == "mention"
    assert decide(msg("hi VxAgent (beta)+ there"), name=name).reason == "not_addressed"
    assert decide(msg("hi VAgent beta there"), name=name).reason == "not_addressed"


def test_multi_word_display_name() -> None:
    name = "Data  Helper"
    assert decide(msg("data helper: run it"), name=name) == Decision(True, "mention", "run it")
    assert decide(msg("ask Data\nHelper"), name=name).reason == "mention"
    assert decide(msg("data helpers"), name=name).reason == "not_addressed"


@pytest.mark.parametrize("name", [None, "", "   "])
def test_no_display_name_means_only_ids(name: str | None) -> None:
    assert decide(msg("vagent: hi"), name=name).reason == "not_addressed"
    assert decide(msg(f"{BOT}: hi"), name=name) == Decision(True, "mention", "hi")


def test_mention_by_pill_in_formatted_body() -> None:
    html = '<a href="https://matrix.to/#/%40vagent%3Aexample.org">The Bot</a>: hi'
    d = decide(msg("The Bot: hi", format="org.matrix.custom.html", formatted_body=html))
    assert d.answer and d.reason == "mention"


def test_pill_inside_the_quoted_reply_is_not_a_mention() -> None:
    html = (
        '<mx-reply><blockquote><a href="https://matrix.to/#/@vagent:example.org">vagent</a>'
        "</blockquote></mx-reply>nice"
    )
    m = msg(
        "> <@x:example.org> vagent did it\n\nnice",
        format="org.matrix.custom.html",
        formatted_body=html,
        extra={"m.relates_to": {"m.in_reply_to": {"event_id": "$o"}}},
    )
    assert decide(m, replied_to=ALICE).reason == "not_addressed"


@pytest.mark.parametrize(
    "bot",
    ["@a.b=c/d+e_f-g:sub.example.org:8448", "@bot:[::1]:8448", "@bot:127.0.0.1", "@x:y"],
)
def test_odd_user_ids(bot: str) -> None:
    assert decide(msg(f"{bot}: hi"), bot=bot, name=None) == Decision(True, "mention", "hi")
    assert decide(msg(f"hi {bot}0"), bot=bot, name=None).reason == "not_addressed"


# reply fallbacks


def reply(body: str, to: str = "$orig") -> IncomingMessage:
    return msg(body, extra={"m.relates_to": {"m.in_reply_to": {"event_id": to}}})


def test_reply_to_the_bot_is_answered_and_the_fallback_stripped() -> None:
    m = reply("> <@vagent:example.org> There are 3 records.\n> Second line\n\nand yesterday?")
    assert decide(m, replied_to=BOT) == Decision(True, "reply", "and yesterday?")


def test_reply_to_someone_else_is_not_addressed() -> None:
    assert decide(reply("sure"), replied_to=ALICE).reason == "not_addressed"
    assert decide(reply("sure"), replied_to=None).reason == "not_addressed"


def test_mention_inside_the_quoted_fallback_does_not_count() -> None:
    m = reply("> <@alice:example.org> ask vagent or @vagent:example.org\n\nno thanks")
    assert decide(m, replied_to=ALICE) == Decision(False, "not_addressed", "no thanks")


def test_replied_to_sender_needs_a_real_reply() -> None:
    # a thread fallback pointer is not a reply, even if the caller looked its sender up
    assert decide(msg("hi", **THREAD), replied_to=BOT).reason == "not_addressed"


def test_reply_with_prefix_and_fallback() -> None:
    m = reply("> <@alice:example.org> the numbers\n\n!ai check these")
    assert decide(m, replied_to=ALICE) == Decision(True, "prefix", "check these")


def test_empty_reply_to_the_bot() -> None:
    m = reply("> <@vagent:example.org> done\n\n   ")
    assert decide(m, replied_to=BOT) == Decision(False, "empty", "")


@pytest.mark.parametrize(
    "body,expected",
    [
        ("> <@a:b> quoted\n\nanswer", "answer"),
        ("> * <@a:b> waves\n\nanswer", "answer"),
        ("> <@a:b> one\n>\n> three\n\nanswer\nmore", "answer\nmore"),
        ("> <@a:b> no blank line\nanswer", "> <@a:b> no blank line\nanswer"),
        ("> <@a:b> only a quote", "> <@a:b> only a quote"),
        ("> a quote of my own\n\nwhat does it mean?", "> a quote of my own\n\nwhat does it mean?"),
        ("text\n> <@a:b> later\n\nx", "text\n> <@a:b> later\n\nx"),
        ("", ""),
    ],
)
def test_strip_reply_fallback(body: str, expected: str) -> None:
    assert strip_reply_fallback(body) == expected


def test_a_quote_is_kept_when_the_message_is_not_a_reply() -> None:
    d = decide(msg("> <@a:b> quoted\n\n!ai explain"), dm=True)
    assert d.text == "> <@a:b> quoted\n\n!ai explain"


# prefix


@pytest.mark.parametrize(
    "body,text",
    [
        ("!ai hello", "hello"),
        ("!AI hello", "hello"),
        ("  !ai\thello  ", "hello"),
        ("!ai\nline", "line"),
        ("!Ai !reset", "!reset"),
        (f"!ai {BOT}: hi", "hi"),
    ],
)
def test_prefix(body: str, text: str) -> None:
    d = decide(msg(body), name=None)
    assert d == Decision(True, "prefix" if BOT not in body else "mention", text)


def test_prefix_and_mention_together_are_both_removed() -> None:
    assert decide(msg("!ai vagent: hi")) == Decision(True, "mention", "hi")
    assert decide(msg("vagent: !ai hi")) == Decision(True, "mention", "hi")
    assert decide(msg("vagent, !ai !reset")) == Decision(True, "mention", "!reset")
    assert decide(msg("!ai vagent:"), dm=True) == Decision(False, "empty", "")


@pytest.mark.parametrize("body", ["!aihello", "!ai-hello", "hello !ai", "!a hello", "ai hello", "! ai hello"])
def test_not_the_prefix(body: str) -> None:
    assert decide(msg(body), name=None).reason == "not_addressed"


def test_prefix_alone_is_empty() -> None:
    assert decide(msg("!ai"), name=None) == Decision(False, "empty", "")


def test_custom_and_disabled_prefixes() -> None:
    assert decide(msg("hey bot what?"), prefix="hey bot", name=None) == Decision(True, "prefix", "what?")
    assert decide(msg("hello"), prefix="", name=None).reason == "not_addressed"
    assert decide(msg("hello"), prefix="   ", name=None).reason == "not_addressed"


# threads


def test_thread_the_bot_takes_part_in() -> None:
    assert decide(msg("and then?", **THREAD), in_thread=True) == Decision(True, "thread", "and then?")


def test_thread_without_the_bot() -> None:
    assert decide(msg("and then?", **THREAD), in_thread=False).reason == "not_addressed"


def test_bot_in_thread_needs_a_thread() -> None:
    assert decide(msg("and then?"), in_thread=True).reason == "not_addressed"


def test_mention_in_a_thread_wins_over_thread() -> None:
    assert decide(msg("vagent: go", **THREAD), in_thread=True) == Decision(True, "mention", "go")


def test_answer_yes_in_the_thread() -> None:
    assert decide(msg("yes", **THREAD), in_thread=True) == Decision(True, "thread", "yes")


# ------------------------------------------------------------------------------ sessions


def test_session_for_main_timeline_and_threads() -> None:
    assert session_for(msg("x")) == SessionId(room_id=ROOM, thread_id=None, user_id=ALICE)
    threaded = session_for(msg("x", **THREAD))
    assert threaded.thread_id == "$root"
    assert str(threaded) == f"{ROOM}:$root:{ALICE}"
    assert SessionId.parse(str(threaded)) == threaded


def test_session_for_room_without_server_and_odd_user() -> None:
    odd = "@a.b=c/d+e:example.org:8448"
    sid = session_for(msg("x", room="!AbCdEf123", sender=odd, **THREAD))
    assert SessionId.parse(sid.format()) == sid
    assert (sid.room_id, sid.thread_id, sid.user_id) == ("!AbCdEf123", "$root", odd)


def test_session_for_rejects_malformed_ids() -> None:
    with pytest.raises(ValueError):
        session_for(msg("x", room="not-a-room"))
