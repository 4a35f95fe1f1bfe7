"""Posting the agent's question into the room (`question_message` decides its shape): one
message, or, for a question too long for one, the whole text as a file (encrypted in an
encrypted room, `uploads`) and then the message that asks, in the same thread or reply
chain. If the file cannot be sent, the whole text goes out as several messages instead:
nobody is asked about what they cannot read.
"""

from __future__ import annotations

import structlog
from nio import AsyncClient

from vagent_bot.answers.event_content import file_content
from vagent_bot.answers.question_message import FILENAME, question_message
from vagent_bot.answers.splitting import split_message
from vagent_bot.answers.streaming import Answer
from vagent_bot.matrix import client as matrix
from vagent_bot.matrix.uploads import upload

log = structlog.get_logger(__name__)

TEXT_MIME = "text/plain"


async def post_text_file(
    client: AsyncClient, room_id: str, name: str, text: str, *, thread_root: str | None, reply_to: str | None
) -> str | None:
    """Upload `text` (UTF-8) as the file `name` and post it; its event id, or None."""
    data = text.encode()
    uploaded = await upload(client, room_id, data, TEXT_MIME, name)
    if uploaded is None:
        return None
    content = file_content(
        name,
        TEXT_MIME,
        len(data),
        url=uploaded.url,
        file=uploaded.file,
        thread_root=thread_root,
        reply_to=reply_to,
    )
    return await matrix.send(client, room_id, content)


async def post_question(answer: Answer, question: str, options: list[str]) -> str | None:
    """Ask `question` where `answer` is being written; the event id of the message that asks
    (reactions to it answer a yes/no question), or None when it could not be sent."""
    shown = question_message(question, options)
    if shown.attachment is None:
        return await answer.notice(shown.text)
    file_id = await post_text_file(
        answer.client,
        answer.room_id,
        FILENAME,
        shown.attachment,
        thread_root=answer.thread_root,
        reply_to=answer.reply_to,
    )
    log.info("question_as_file", chars=len(shown.attachment), ok=file_id is not None)
    if file_id is not None:
        answer.sent_event_ids.append(file_id)
        return await answer.notice(shown.text)
    parts = split_message(shown.attachment)
    for part in parts:
        await answer.notice(part)
    first = shown.text.split("\n", 1)[0]
    return await answer.notice(f"{first}\n☝️ The whole question is in the {len(parts)} messages above.")
