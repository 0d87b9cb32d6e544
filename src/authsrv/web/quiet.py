"""
Warnings that a failing dependency, or a client, would repeat on every
request or connection: each kind is logged at most once a minute, saying how
many were held back since, so an outage of the store or the directory shows
in the log without flooding it, and a flood of bad connections cannot flood it.
"""

from __future__ import annotations

from collections import Counter

INTERVAL = 60.0


class QuietWarnings:
    """C{log} is a twisted.logger Logger, C{clock} says the time."""

    def __init__(self, log, clock, interval: float = INTERVAL):
        self._log = log
        self._clock = clock
        self._interval = interval
        self._next: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def warn(self, kind: str, error: BaseException) -> None:
        """A warning of C{kind} about C{error}, unless one of that kind was logged within the interval."""
        held = self.due(kind)
        if held is not None:
            self._log.warn("{kind}: {error} ({held} more since the last such line)", kind=kind, error=str(error),
                           held=held)

    def due(self, kind: str) -> int | None:
        """
        Whether a line of C{kind} may be logged now: how many were held back
        since the last one when it may, None (and one more held) when not.
        """
        now = self._clock.seconds()
        if now < self._next.get(kind, 0.0):
            self._held[kind] += 1
            return None
        self._next[kind] = now + self._interval
        held, self._held[kind] = self._held[kind], 0
        return held
