"""Should the bot answer this Matrix event, and what did the human actually say?

Pure functions over the raw event JSON (nio's `event.source`): the Matrix client only
looks up the facts these rules need (is the room a DM, who sent the replied-to event,
has the bot spoken in this thread) and passes them in, so every rule is unit-tested
without a homeserver. A media event's file is read by `media`; what it asks is its caption.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from vagent_bot.matrix.media import Media, parse_media
from vagent_shared.session import SessionId

ROOM_MESSAGE = "m.room.message"
TEXT, EMOTE, NOTICE = "m.text", "m.emote", "m.notice"
#: Typed text is handed to the agent as it is; a media event (`media`) only through its
#: caption (its body may be just the file name, never a question).
ANSWERABLE_MSGTYPES = frozenset({TEXT, EMOTE})
REL_THREAD, REL_REPLACE = "m.thread", "m.replace"
HTML_FORMAT = "org.matrix.custom.html"

# A user id written into a message: not glued to a longer id (`@bot:example.org.evil`,
# `@bot:example.org:8448`), but punctuation after it is fine (`@bot:example.org.`, `...org:hi`).
_ID_BEFORE = r"(?<![\w@.=/+\-])"
_ID_AFTER = r"(?![\w=/+\-\[\]]|\.[\w\[]|:\d)"
# The first quoted line of a rich-reply fallback names the replied-to sender:
# `> <@alice:example.org> original` (or `> * <@alice:example.org> waves` for an emote).
_FALLBACK_HEAD = re.compile(r"> (?:\* )?<@[^\s>]+>")
# A permalink pill to a user in formatted_body: href="https://matrix.to/#/@bot:server".
_PILL = re.compile(r"""href\s*=\s*["']https://matrix\.to/#/([^"'?]+)""", re.IGNORECASE)
_MX_REPLY = re.compile(r"<mx-reply>.*?</mx-reply>", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class IncomingMessage:
    """The parts of an `m.room.message` event the routing rules look at."""

    event_id: str
    sender: str
    room_id: str
    body: str
    msgtype: str
    formatted_body: str | None = None
    #: Root event of the thread this message is in (rel_type m.thread).
    thread_root: str | None = None
    #: A real rich reply; None when `m.in_reply_to` is only a thread's `is_falling_back` pointer.
    in_reply_to: str | None = None
    #: `m.mentions.user_ids` (intentional mentions).
    mentions: tuple[str, ...] = ()
    is_edit: bool = False
    server_ts: int = 0
    #: The file of a media event (`m.file`, `m.image`, `m.audio`, `m.video`); None for text.
    media: Media | None = None


@dataclass(frozen=True)
class Decision:
    """Whether to answer, a short machine-readable why (for logs/metrics), and the cleaned text."""

    answer: bool
    reason: str
    text: str


def parse_message(event: dict[str, Any], room_id: str) -> IncomingMessage | None:
    """Read a raw event; None for anything that is not an `m.room.message` with a string body.

    Events without a string event_id or sender are dropped too: they cannot be answered or
    de-duplicated. Malformed optional fields are ignored rather than fatal (any client can
    send any JSON).
    """
    if event.get("type") != ROOM_MESSAGE:
        return None
    content = event.get("content")
    if not isinstance(content, dict):
        return None
    body, event_id, sender = content.get("body"), event.get("event_id"), event.get("sender")
    if not isinstance(body, str) or not isinstance(event_id, str) or not isinstance(sender, str):
        return None
    relates = _dict(content.get("m.relates_to"))
    rel_type = relates.get("rel_type")
    thread_root = _str(relates.get("event_id")) if rel_type == REL_THREAD else None
    in_reply_to = _str(_dict(relates.get("m.in_reply_to")).get("event_id"))
    if relates.get("is_falling_back") is True:
        in_reply_to = None  # only the thread fallback for clients without threads
    user_ids = _dict(content.get("m.mentions")).get("user_ids")
    mentions = tuple(u for u in user_ids if isinstance(u, str)) if isinstance(user_ids, list) else ()
    formatted = content.get("formatted_body") if content.get("format") == HTML_FORMAT else None
    ts = event.get("origin_server_ts")
    return IncomingMessage(
        event_id=event_id,
        sender=sender,
        room_id=room_id,
        body=body,
        msgtype=_str(content.get("msgtype")) or "",
        formatted_body=_str(formatted),
        thread_root=thread_root,
        in_reply_to=in_reply_to,
        mentions=mentions,
        is_edit=rel_type == REL_REPLACE,
        server_ts=ts if isinstance(ts, int) and not isinstance(ts, bool) else 0,
        media=parse_media(content),
    )


def should_answer(
    msg: IncomingMessage,
    *,
    bot_user_id: str,
    bot_display_name: str | None,
    is_dm: bool,
    prefix: str,
    replied_to_sender: str | None,
    bot_in_thread: bool,
) -> Decision:
    """Apply the addressing rules; `reason` names the rule that decided (for logs and metrics).

    Never: own events, notices (other bots; avoids bot loops), edits, non-text msgtypes
    (reason "msgtype"). In a DM: everything. In a group room: a mention, a reply to the
    bot, the command prefix, or any message in a thread the bot takes part in. Mentions
    are looked for in the message itself, not in a quoted reply fallback. Media events:
    `_media_decision`.
    """
    said = msg.body if msg.media is None else (msg.media.caption or "")
    body = strip_reply_fallback(said) if msg.in_reply_to or msg.thread_root else said
    text = strip_address(body, bot_user_id=bot_user_id, bot_display_name=bot_display_name, prefix=prefix)
    if msg.sender == bot_user_id:
        return Decision(False, "own_event", text)
    if msg.msgtype == NOTICE:
        return Decision(False, "notice", text)
    if msg.is_edit:
        return Decision(False, "edit", text)
    if msg.media is None and msg.msgtype not in ANSWERABLE_MSGTYPES:
        return Decision(False, "msgtype", text)
    if is_dm:
        reason = "dm"
    elif msg.media is not None and msg.media.caption is None:
        reason = _uncaptioned_address(msg, msg.media, replied_to_sender, bot_user_id, bot_in_thread)
    elif is_mentioned(msg, body, bot_user_id=bot_user_id, bot_display_name=bot_display_name):
        reason = "mention"
    elif msg.in_reply_to is not None and replied_to_sender == bot_user_id:
        reason = "reply"
    elif _prefix_match(body.lstrip(), prefix) is not None:
        reason = "prefix"
    elif bot_in_thread and msg.thread_root is not None:
        reason = "thread"
    else:
        reason = "not_addressed"
    if reason == "not_addressed":
        return Decision(False, reason, text)
    if msg.media is not None:
        return _media_decision(msg.media, reason, text)
    if not text:
        return Decision(False, "empty", text)
    return Decision(True, reason, text)


def _uncaptioned_address(
    msg: IncomingMessage, media: Media, replied_to_sender: str | None, bot_user_id: str, in_thread: bool
) -> str:
    """A file without a caption in a group room says nothing to anyone: not addressed. A voice
    message cannot mention anyone either: it is for the bot in a reply to the bot or in a
    thread the bot takes part in."""
    if media.kind != "audio":
        return "not_addressed"
    if msg.in_reply_to is not None and replied_to_sender == bot_user_id:
        return "reply"
    if in_thread and msg.thread_root is not None:
        return "thread"
    return "not_addressed"


def _media_decision(media: Media, reason: str, text: str) -> Decision:
    """An addressed media event: a video is answered with a refusal ("video"); a voice message
    is a question whatever its caption (the transcript is the text); a file without a question
    ("file_alone", empty text) is kept for the next one; with one, the caption is the question."""
    if media.kind == "video":
        return Decision(True, "video", text)
    if media.kind == "audio":
        return Decision(True, reason, text)
    if not text:
        return Decision(True, "file_alone", "")
    return Decision(True, reason, text)


def session_for(msg: IncomingMessage) -> SessionId:
    """The conversation this message belongs to; raises ValueError for malformed ids."""
    return SessionId(room_id=msg.room_id, thread_id=msg.thread_root, user_id=msg.sender)


def is_mentioned(msg: IncomingMessage, body: str, *, bot_user_id: str, bot_display_name: str | None) -> bool:
    """m.mentions, a pill in formatted_body, the user id, or the display name as a whole word.

    `body` is the message without its reply fallback (quoting a message that mentioned the
    bot is not a mention).
    """
    if bot_user_id in msg.mentions:
        return True
    if msg.formatted_body and _has_pill(msg.formatted_body, bot_user_id):
        return True
    if _user_id_re(bot_user_id).search(body):
        return True
    name = _name_pattern(bot_display_name)
    return bool(name) and re.search(rf"(?<!\w){name}(?!\w)", body, re.IGNORECASE) is not None


def strip_reply_fallback(body: str) -> str:
    """Remove a Matrix rich-reply fallback: quoted lines at the top, then a blank line.

    Only a quote that starts like a fallback (`> <@sender> ...`) is removed, so a human
    quoting something at the top of a message keeps the quote.
    """
    lines = body.split("\n")
    if not _FALLBACK_HEAD.match(lines[0]):
        return body
    i = 0
    while i < len(lines) and (lines[i].startswith("> ") or lines[i].rstrip("\r") == ">"):
        i += 1
    if i >= len(lines) or lines[i].strip():
        return body  # a quote without the blank line after it is not a fallback
    return "\n".join(lines[i + 1 :])


def strip_address(body: str, *, bot_user_id: str, bot_display_name: str | None, prefix: str) -> str:
    """The text without a leading prefix and/or mention (`!ai`, `@bot:server:`, `Bot,`), trimmed."""
    text = body.strip()
    leading = _leading_mention_re(bot_user_id, _name_pattern(bot_display_name))
    for _ in range(3):  # "!ai vagent: hi", "vagent: !ai hi"
        after = _prefix_match(text, prefix)
        if after is None:
            m = leading.match(text)
            after = text[m.end() :] if m else None
        if after is None:
            break
        text = after.strip()
    return text


def _prefix_match(text: str, prefix: str) -> str | None:
    """The text after `prefix` (case-insensitive, then white space or the end); None if absent.

    An empty prefix disables prefix addressing (it would match every message).
    """
    prefix = prefix.strip()
    if not prefix or text[: len(prefix)].lower() != prefix.lower():
        return None
    rest = text[len(prefix) :]
    if rest and not rest[0].isspace():
        return None  # "!aiden" is not "!ai"
    return rest


def _user_id_re(user_id: str) -> re.Pattern[str]:
    return re.compile(_ID_BEFORE + re.escape(user_id) + _ID_AFTER)


def _leading_mention_re(user_id: str, name_re: str) -> re.Pattern[str]:
    """The bot's id or (optionally @-prefixed) name at the start, then `:`/`,` or white space."""
    who = re.escape(user_id) + _ID_AFTER
    if name_re:
        who += rf"|(?i:@?{name_re})(?!\w)"
    return re.compile(rf"(?:{who})(?:\s*[:,]|(?=\s)|$)")


def _has_pill(formatted_body: str, user_id: str) -> bool:
    html = _MX_REPLY.sub("", formatted_body)
    return any(unquote(m.group(1)) == user_id for m in _PILL.finditer(html))


def _name_pattern(name: str | None) -> str:
    """Regex for a display name, any run of white space between its words; "" when unset."""
    return r"\s+".join(re.escape(word) for word in name.split()) if name else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
