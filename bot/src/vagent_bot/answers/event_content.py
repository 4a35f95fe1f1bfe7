"""The exact content of each `m.room.message` the bot sends, its Markdown as HTML only while
the event stays within Matrix's size limit (`size_budget`). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from vagent_bot.answers.rendering import clean_text, render_markdown
from vagent_bot.answers.size_budget import CONTENT_MAX_BYTES, content_size

HTML_FORMAT = "org.matrix.custom.html"


def message_content(
    text: str,
    *,
    thread_root: str | None = None,
    reply_to: str | None = None,
    replaces: str | None = None,
    notice: bool = False,
    html: bool = True,
) -> dict[str, Any]:
    """The content of an `m.room.message`: a message, a thread message, a reply, or an edit.

    In a thread, `reply_to` is the event non-thread clients show it as a reply to (the
    thread fallback, `is_falling_back: true`); it defaults to the thread root. An edit
    (`replaces`) carries only the replace relation: thread and reply are inherited from
    the original event, so thread_root/reply_to are ignored. When the content with HTML
    would exceed CONTENT_MAX_BYTES, formatted_body is left out (see `size_budget`).
    """
    text = clean_text(text)
    # empty m.mentions: nothing an LLM writes ("@room", a user id) can ping anyone
    new: dict[str, Any] = {"msgtype": "m.notice" if notice else "m.text", "body": text, "m.mentions": {}}
    if html:
        new["format"] = HTML_FORMAT
        new["formatted_body"] = render_markdown(text)
    content: dict[str, Any]
    if replaces is not None:
        content = {"msgtype": new["msgtype"], "body": "* " + text, "m.mentions": {}}
        if html:
            content["format"] = HTML_FORMAT
            content["formatted_body"] = "* " + new["formatted_body"]
        content["m.new_content"] = new
        content["m.relates_to"] = {"rel_type": "m.replace", "event_id": replaces}
    else:
        content = dict(new)
        relation = _relation(thread_root, reply_to)
        if relation is not None:
            content["m.relates_to"] = relation
    if html and content_size(content) > CONTENT_MAX_BYTES:
        return message_content(
            text, thread_root=thread_root, reply_to=reply_to, replaces=replaces, notice=notice, html=False
        )
    return content


def image_content(
    name: str,
    mimetype: str,
    size: int,
    *,
    url: str | None = None,
    file: dict[str, Any] | None = None,
    width: int | None = None,
    height: int | None = None,
    thread_root: str | None = None,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """An `m.image` the bot posts (an image a tool returned): `url` in a plain room, `file` (the
    encrypted file's url, key, iv and hashes) in an encrypted one; in the same thread or reply
    chain as the answer it belongs to. `body` is the name, so clients show no caption."""
    info: dict[str, Any] = {"mimetype": mimetype, "size": size}
    if width is not None and height is not None:
        info["w"], info["h"] = width, height
    content: dict[str, Any] = {"msgtype": "m.image", "body": name, "info": info, "m.mentions": {}}
    return _placed(content, url, file, thread_root, reply_to)


def file_content(
    name: str,
    mimetype: str,
    size: int,
    *,
    url: str | None = None,
    file: dict[str, Any] | None = None,
    thread_root: str | None = None,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """An `m.file` the bot posts (a question too long for one message, as a text file): `url`
    in a plain room, `file` (the encrypted file's url, key, iv and hashes) in an encrypted one;
    in the thread or reply chain it belongs to."""
    content: dict[str, Any] = {
        "msgtype": "m.file",
        "body": name,
        "filename": name,
        "info": {"mimetype": mimetype, "size": size},
        "m.mentions": {},
    }
    return _placed(content, url, file, thread_root, reply_to)


def _placed(
    content: dict[str, Any],
    url: str | None,
    file: dict[str, Any] | None,
    thread_root: str | None,
    reply_to: str | None,
) -> dict[str, Any]:
    """A media event's `content` with where its bytes are (`file` when encrypted, else `url`)
    and its place in the thread or reply chain."""
    if file is not None:
        content["file"] = file
    else:
        content["url"] = url
    relation = _relation(thread_root, reply_to)
    if relation is not None:
        content["m.relates_to"] = relation
    return content


def _relation(thread_root: str | None, reply_to: str | None) -> dict[str, Any] | None:
    """In a thread, `reply_to` is the event non-thread clients show it as a reply to (the
    thread fallback); it defaults to the thread root."""
    if thread_root is not None:
        return {
            "rel_type": "m.thread",
            "event_id": thread_root,
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": reply_to or thread_root},
        }
    if reply_to is not None:
        return {"m.in_reply_to": {"event_id": reply_to}}
    return None
