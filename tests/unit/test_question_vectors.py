"""The questions' embeddings recall waits for (memory/store.py `_RecentVectors`), with the real
offline model: questions asked while the model is busy are embedded together in one batch,
the same question is embedded once, a failure reaches every waiter and is not kept, and one
waiter giving up does not cancel another's wait."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from tests.support.knowledge import RecordingEmbedder
from vagent_graph.memory.store import QUESTION_BATCH, QUESTION_WORKERS, _RecentVectors

QUESTIONS = [f"what did I tell you about project {n} and my tea?" for n in range(8)]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_questions_asked_while_the_model_is_busy_are_embedded_in_one_batch() -> None:
    embedder = RecordingEmbedder()
    vectors = _RecentVectors(embedder)
    first = asyncio.create_task(vectors(QUESTIONS[:1]))
    await embedder.called.wait()  # the model is busy with the first question
    rows = [*await asyncio.gather(first, *(vectors([q]) for q in QUESTIONS[1:]))]
    # the seven asked meanwhile wait, then go in one batch together
    assert embedder.batches == [QUESTIONS[:1], QUESTIONS[1:]]
    alone = (await embedder.inner.embed(QUESTIONS)).tolist()
    for (row,), single in zip(rows, alone, strict=True):
        assert cosine(row, single) > 0.99  # the same vector as embedded on its own
    assert await vectors([QUESTIONS[3]]) == rows[3]  # cached: the model is not asked again
    assert len(embedder.batches) == 2
    await vectors.aclose()


class HeldFirst(RecordingEmbedder):
    """The first batch takes until `release` is set (a long batch on one core)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        first = not self.batches
        rows = await super().embed(texts)
        if first:
            await self.release.wait()
        return rows


async def test_a_question_asked_while_a_batch_is_embedded_does_not_wait_for_it() -> None:
    """Two batches at once (QUESTION_WORKERS): the second question's vector comes while the
    first batch is still being embedded."""
    assert QUESTION_WORKERS == 2
    embedder = HeldFirst()
    vectors = _RecentVectors(embedder)
    first = asyncio.create_task(vectors(QUESTIONS[:1]))
    await embedder.called.wait()
    (second,) = await asyncio.wait_for(vectors(QUESTIONS[1:2]), 10)
    assert not first.done() and len(second) > 0
    assert embedder.batches == [QUESTIONS[:1], QUESTIONS[1:2]]
    embedder.release.set()
    await first
    await vectors.aclose()


async def test_questions_asked_at_the_same_moment_are_one_batch() -> None:
    embedder = RecordingEmbedder()
    vectors = _RecentVectors(embedder)
    await asyncio.gather(*(vectors([q]) for q in QUESTIONS))
    assert embedder.batches == [QUESTIONS]
    await vectors.aclose()


async def test_a_batch_holds_at_most_question_batch_questions() -> None:
    embedder = RecordingEmbedder()
    vectors = _RecentVectors(embedder)
    many = [f"question number {n}" for n in range(QUESTION_BATCH * 2 + 1)]
    await asyncio.gather(*(vectors([q]) for q in many))
    assert max(len(b) for b in embedder.batches) == QUESTION_BATCH
    assert sorted(q for b in embedder.batches for q in b) == sorted(many)  # each once
    await vectors.aclose()


async def test_a_question_warmed_before_it_is_asked_is_embedded_once() -> None:
    embedder = RecordingEmbedder()
    vectors = _RecentVectors(embedder)
    vectors.warm(QUESTIONS[0])  # the message arrived: started, not awaited
    first, second = await asyncio.gather(vectors([QUESTIONS[0]]), vectors([QUESTIONS[0]]))
    assert first == second and embedder.batches == [QUESTIONS[:1]]
    await vectors.aclose()


async def test_a_failed_embedding_reaches_every_waiter_and_is_tried_again_later() -> None:
    embedder = RecordingEmbedder()
    vectors = _RecentVectors(embedder)
    embedder.fail = True
    results = await asyncio.gather(vectors([QUESTIONS[0]]), vectors([QUESTIONS[0]]), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    (row,) = await vectors([QUESTIONS[0]])  # not kept: asked again, it is embedded
    assert len(row) == 384 and embedder.batches == [QUESTIONS[:1], QUESTIONS[:1]]
    await vectors.aclose()


async def test_a_waiter_that_gives_up_does_not_cancel_another_s_wait() -> None:
    vectors = _RecentVectors(RecordingEmbedder())
    impatient = asyncio.create_task(vectors([QUESTIONS[0]]))
    patient = asyncio.create_task(vectors([QUESTIONS[0]]))
    await asyncio.sleep(0)
    impatient.cancel()
    (row,) = await patient
    assert len(row) == 384
    with pytest.raises(asyncio.CancelledError):
        await impatient
    await vectors.aclose()


async def test_closing_cancels_the_waits_and_keeps_nothing() -> None:
    vectors = _RecentVectors(RecordingEmbedder())
    waiting = asyncio.create_task(vectors([QUESTIONS[0]]))
    await asyncio.sleep(0)
    await vectors.aclose()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not vectors._rows


async def test_it_keeps_the_latest_questions_up_to_its_size_and_never_one_still_wanted() -> None:
    embedder = RecordingEmbedder()
    vectors = _RecentVectors(embedder, size=3)
    for q in QUESTIONS[:5]:
        await vectors([q])
    assert list(vectors._rows) == QUESTIONS[2:5]  # the two oldest went
    await vectors([QUESTIONS[2]])  # asked again: the newest now, from the cache
    assert list(vectors._rows) == [*QUESTIONS[3:5], QUESTIONS[2]] and len(embedder.batches) == 5
    # beyond the size while questions are still being embedded: only finished ones go
    waits = [vectors.warm(q) for q in QUESTIONS[5:8]]
    assert set(QUESTIONS[5:8]) <= set(vectors._rows)
    await asyncio.gather(*waits)
    vectors.warm(QUESTIONS[7])
    assert len(vectors._rows) <= 3 and QUESTIONS[7] in vectors._rows
