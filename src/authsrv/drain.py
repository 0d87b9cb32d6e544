"""
Graceful stop: on SIGTERM the instance first reports itself not ready,
keeps serving for a drain delay so that a load balancer notices, then stops
accepting connections and lets the requests in flight finish (up to a
timeout) before the service closes its pools.
"""

from __future__ import annotations

import signal

from twisted.internet.defer import Deferred, TimeoutError, gatherResults, maybeDeferred
from twisted.internet.error import ReactorNotRunning
from twisted.internet.task import deferLater
from twisted.logger import Logger


class Drain:
    """
    Counts the requests in flight (from their first byte to their last or a
    lost connection) and runs the stopping sequence on C{clock}.
    """

    log = Logger()

    def __init__(self, clock, delay: float, timeout: float):
        self._clock = clock
        self._delay = delay
        self._timeout = timeout
        self.draining = False
        self.in_flight = 0
        self._idle: list[Deferred] = []

    def started(self) -> None:
        """A request's first byte arrived: count it until L{ended}."""
        self.in_flight += 1

    def ended(self) -> None:
        """A request counted by L{started} was answered, or its connection was lost."""
        self.in_flight -= 1
        if self.in_flight == 0:
            waiting, self._idle = self._idle, []
            for d in waiting:
                d.callback(None)

    async def run(self, ports) -> int:
        """
        Drain, stop listening on C{ports}, and wait for the requests in
        flight; returns how many were still unfinished at the timeout.
        """
        self.draining = True
        self.log.info(
            "draining: not ready, still serving for {delay}s, then waiting up to {timeout}s for requests in flight",
            delay=self._delay, timeout=self._timeout,
        )
        await deferLater(self._clock, self._delay)
        # A port whose socket was already lost answers None rather than a Deferred.
        await gatherResults([maybeDeferred(port.stopListening) for port in ports])
        if self.in_flight == 0:
            return 0
        idle: Deferred[None] = Deferred()
        self._idle.append(idle)
        idle.addTimeout(self._timeout, self._clock)
        try:
            await idle
        except TimeoutError:
            self.log.warn("drain timeout: {count} requests still in flight are cut off", count=self.in_flight)
            return self.in_flight
        return 0


def stop_on_sigterm(reactor) -> None:
    """
    Let SIGTERM stop the reactor like a normal shutdown, so that C{twist}
    exits 0 once draining has finished instead of re-raising the signal;
    a repeated SIGTERM while draining is only logged. Install it once the
    reactor runs (it installs its own handlers at start).
    """
    log = Logger(namespace="authsrv.drain")
    stopping: list[bool] = []

    def stop():
        if stopping:
            log.info("SIGTERM again: still draining")
            return
        stopping.append(True)
        log.info("SIGTERM: stopping gracefully")
        try:
            reactor.stop()
        except ReactorNotRunning:
            # Already stopping: SIGINT from the terminal reached the workers too.
            pass

    signal.signal(signal.SIGTERM, lambda number, frame: reactor.callFromThread(stop))
