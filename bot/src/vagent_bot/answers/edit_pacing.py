"""Pacing the edits of a streamed answer: when may the next edit of the message go out?

Pure and clock-free: the caller (`streaming.Answer`) passes the time and owns the network.
"""

from __future__ import annotations

#: The floor of the edit interval, so first_delay=0 still backs off.
MIN_EDIT_INTERVAL = 0.25


class EditThrottle:
    """When may the next edit of a streamed message be sent? A pure, clock-free state machine.

    After `start` (the first text was sent) the first edit may follow after `first_delay`;
    each sent edit multiplies the interval by `backoff` up to `max_interval`, so short
    answers update briskly and long ones do not flood the room. At most `max_edits`
    intermediate edits are sent. The FINAL edit (the complete text, at text_final) is
    always allowed: it is neither throttled by the interval nor counted against the cap;
    it only has to wait for a server rate limit (`final_at`). A rate limit
    (M_LIMIT_EXCEEDED) blocks until its retry_after and raises the interval to at least
    that for the rest of the answer.
    """

    def __init__(
        self, first_delay: float = 0.5, max_interval: float = 4.0, backoff: float = 1.5, max_edits: int = 30
    ) -> None:
        if first_delay < 0 or max_interval <= 0 or backoff < 1 or max_edits < 0:
            raise ValueError("need first_delay >= 0, max_interval > 0, backoff >= 1, max_edits >= 0")
        self.first_delay, self.max_interval, self.backoff, self.max_edits = (
            first_delay,
            max_interval,
            backoff,
            max_edits,
        )
        self._interval = first_delay
        self._next: float | None = None
        self._blocked_until = float("-inf")
        self._sent = 0

    @property
    def started(self) -> bool:
        return self._next is not None

    @property
    def edits_left(self) -> int:
        """Intermediate edits still allowed (the final edit does not count)."""
        return self.max_edits - self._sent

    @property
    def interval(self) -> float:
        """The current gap between edits."""
        return self._interval

    def start(self, now: float) -> None:
        """The first text was sent at `now`."""
        self._next = max(now + self.first_delay, self._blocked_until)

    def next_at(self) -> float | None:
        """When the next intermediate edit may be sent; None before start or once the cap is reached."""
        if self._next is None or self.edits_left <= 0:
            return None
        return self._next

    def due(self, now: float) -> bool:
        """May an intermediate edit go out now?"""
        at = self.next_at()
        return at is not None and now >= at

    def sent(self, now: float) -> None:
        """An intermediate edit was sent at `now`."""
        self._sent += 1
        grown = min(self.max_interval, max(self._interval, MIN_EDIT_INTERVAL) * self.backoff)
        self._interval = max(self._interval, grown)  # never shrinks below a rate-limit's retry_after
        self._next = max(now + self._interval, self._blocked_until)

    def rate_limited(self, now: float, retry_after_ms: int) -> None:
        """The server answered M_LIMIT_EXCEEDED: nothing before now + retry_after."""
        retry = max(0, retry_after_ms) / 1000
        self._blocked_until = max(self._blocked_until, now + retry)
        self._interval = max(self._interval, retry)
        if self._next is not None:
            self._next = max(self._next, self._blocked_until)

    def final_at(self, now: float) -> float:
        """When the final edit may be sent: now, unless a rate limit is still running."""
        return max(now, self._blocked_until)
