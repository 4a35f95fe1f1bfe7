"""Pacing the edits of a streamed answer (`vagent_bot.answers.edit_pacing.EditThrottle`)."""

from __future__ import annotations

import itertools

import pytest

from vagent_bot.answers.edit_pacing import EditThrottle


def test_throttle_before_start_never_due() -> None:
    t = EditThrottle()
    assert not t.started and t.next_at() is None and not t.due(1e9)


def test_first_edit_after_first_delay_then_backoff_up_to_max_interval() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5, max_edits=30)
    t.start(10.0)
    assert t.next_at() == 10.5
    assert not t.due(10.49) and t.due(10.5)
    gaps = []
    now = 10.5
    for _ in range(10):
        t.sent(now)
        nxt = t.next_at()
        assert nxt is not None
        gaps.append(nxt - now)
        now = nxt
    assert gaps[:3] == pytest.approx([0.75, 1.125, 1.6875])
    assert gaps == sorted(gaps) and max(gaps) == 4.0 and gaps[-1] == 4.0


def test_not_due_between_edits() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=2.0)
    t.start(0.0)
    t.sent(0.5)
    assert t.next_at() == 1.5
    assert not t.due(1.0) and not t.due(1.4999) and t.due(1.5) and t.due(100)


def test_late_edits_measure_the_interval_from_when_they_were_sent() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=2.0)
    t.start(0.0)
    t.sent(7.0)  # the text arrived late
    assert t.next_at() == 8.0


def test_zero_first_delay_still_backs_off() -> None:
    t = EditThrottle(first_delay=0.0, max_interval=4.0, backoff=1.5)
    t.start(5.0)
    assert t.due(5.0)
    t.sent(5.0)
    nxt = t.next_at()
    assert nxt is not None and nxt > 5.0


def test_cap_on_intermediate_edits() -> None:
    t = EditThrottle(first_delay=0.0, max_interval=1.0, backoff=1.0, max_edits=3)
    t.start(0.0)
    now = 0.0
    for left in (3, 2, 1):
        assert t.edits_left == left and t.due(now)
        t.sent(now)
        now += 10
    assert t.edits_left == 0 and t.next_at() is None and not t.due(1e9)
    assert t.final_at(now) == now  # the final edit is never capped


def test_zero_edits_allowed_means_only_the_final_one() -> None:
    t = EditThrottle(max_edits=0)
    t.start(0.0)
    assert t.next_at() is None and not t.due(100) and t.final_at(3.0) == 3.0


def test_rate_limit_blocks_until_retry_after_and_raises_the_interval() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5)
    t.start(0.0)
    t.sent(0.5)  # next at 1.25
    t.rate_limited(1.25, retry_after_ms=2000)
    assert t.next_at() == 3.25 and not t.due(3.2) and t.due(3.25)
    assert t.edits_left == 29  # the refused edit does not count
    assert t.interval >= 2.0
    assert t.final_at(2.0) == 3.25 and t.final_at(5.0) == 5.0  # the final edit waits for it too
    t.sent(3.25)
    assert t.next_at() == pytest.approx(3.25 + 3.0)  # 2.0 * 1.5, still <= max_interval


def test_rate_limit_longer_than_max_interval_is_respected_for_the_rest() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5)
    t.start(0.0)
    t.rate_limited(0.5, retry_after_ms=10_000)
    assert t.next_at() == 10.5
    t.sent(10.5)
    assert t.next_at() == 20.5  # the interval never shrinks below the server's retry_after


def test_rate_limit_before_start_and_odd_values() -> None:
    t = EditThrottle(first_delay=0.5)
    t.rate_limited(0.0, retry_after_ms=3000)
    assert not t.started and t.final_at(1.0) == 3.0
    t.start(1.0)
    assert t.next_at() == 3.0
    t2 = EditThrottle(first_delay=0.5)
    t2.start(0.0)
    t2.rate_limited(1.0, retry_after_ms=-5)  # nonsense from a server: no effect, no crash
    assert t2.next_at() == 1.0
    t2.rate_limited(1.0, retry_after_ms=100)
    t2.rate_limited(1.0, retry_after_ms=50)  # a shorter second limit does not shorten the first
    assert t2.next_at() == 1.1


@pytest.mark.parametrize(
    "kwargs", [{"first_delay": -1}, {"max_interval": 0}, {"backoff": 0.9}, {"max_edits": -1}]
)
def test_throttle_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EditThrottle(**kwargs)  # type: ignore[arg-type]


def test_a_long_stream_stays_within_the_limits() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5, max_edits=30)
    t.start(0.0)
    sent: list[float] = []
    for i in range(1, 3000):  # a token every 50 ms for 150 s
        now = i * 0.05
        if t.due(now):
            t.sent(now)
            sent.append(now)
    assert len(sent) == 30 and t.edits_left == 0
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(g <= 4.0 + 0.05 + 1e-9 for g in gaps) and sent[0] == pytest.approx(0.5)
