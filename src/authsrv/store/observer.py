"""
How long store calls take, reported by label to whoever watches (metrics).

A store given an C{observer} calls C{observer(label, seconds, failed)} when
each call ends: C{label} names the operation in a word or two
(C{"redeem_code"}, C{"rotate_refresh"}), as Synapse's C{desc} does. A
store without one times nothing.
"""

from __future__ import annotations

from time import perf_counter
from typing import Callable

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

Observer = Callable[[str, float, bool], None]


def watched(observer: Observer, label: str, started: float, result: Deferred) -> Deferred:
    """C{result}, reported to C{observer} when it fires; C{started} is its L{perf_counter} start."""

    def report(outcome):
        observer(label, perf_counter() - started, isinstance(outcome, Failure))
        return outcome

    return result.addBoth(report)
