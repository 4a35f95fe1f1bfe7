"""Messages sent while an event is handled get transaction ids derived from the event, so the
same event handled again (after a crash) re-sends under the same ids (vagent_bot.matrix.client)."""

from __future__ import annotations

import asyncio

from vagent_bot.matrix.client import _next_txn_id, handling


async def test_ids_follow_the_event_and_the_order_of_sends_tasks_included() -> None:
    assert _next_txn_id() is None  # not handling an event: nio picks a random id

    async def in_a_task() -> str | None:
        return _next_txn_id()

    with handling("$question:localhost"):
        first = _next_txn_id()
        second = await asyncio.create_task(in_a_task())  # e.g. the answer's first-message timer
    assert _next_txn_id() is None
    with handling("$question:localhost"):  # handled again: the same ids, in the same order
        again = [_next_txn_id(), _next_txn_id()]
    with handling("$other:localhost"):
        other = _next_txn_id()
    assert first is not None and second is not None and other is not None
    assert [first, second] == again and first != second
    assert first.endswith(".0") and second.endswith(".1") and other != first
    assert all(c.isalnum() or c == "." for c in first)  # safe in the URL path
