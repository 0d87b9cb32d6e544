"""
How the parent of several workers starts a dead one again: at once after
it had run for a while, after a growing delay when it failed at start, and
not at all once starts keep failing, when the whole service stops with one
line and a non-zero status (a supervisor's start limit, as systemd's).
"""

from __future__ import annotations

import signal
from pathlib import Path

from twisted.internet.error import ProcessTerminated, ReactorNotRunning
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent
from twisted.python.failure import Failure

from authsrv.config import ConfigSource
from authsrv.store.errors import StoreUnavailable
from authsrv.workers import GIVE_UP_STATUS, PREPARE_RETRY, RestartPolicy, Supervisor, exit_after_stop


class FakeProcess:
    def __init__(self, pid: int):
        self.pid = pid
        self.signals: list[int] = []

    def signalProcess(self, number):
        self.signals.append(number)


class Reactor(Clock):
    """A clock that records the workers it is asked to start."""

    def __init__(self):
        super().__init__()
        self.spawned: list[tuple[float, object, FakeProcess]] = []

    def spawnProcess(self, protocol, executable, args, env, childFDs):
        process = FakeProcess(len(self.spawned) + 100)
        self.spawned.append((self.seconds(), protocol, process))
        return process


def end(protocol, status: int = 1) -> None:
    protocol.processEnded(Failure(ProcessTerminated(exitCode=status)))


async def nothing_to_prepare():
    return None


def supervisor(reactor, count: int = 1):
    stopped: list[int] = []
    service = Supervisor(reactor, count, [], 0, nothing_to_prepare, config=ConfigSource(Path("authsrv.toml"), b""),
                         argv=["authsrv"], give_up=stopped.append)
    service.startService()
    return service, stopped


def test_a_failed_start_waits_longer_each_time_up_to_a_cap():
    policy = RestartPolicy(burst=100)
    delays = [policy.after_exit(0, uptime=0.5, now=float(t * 100)) for t in range(8)]
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]


def test_a_worker_that_ran_for_a_while_starts_again_at_once_and_its_failures_are_forgotten():
    policy = RestartPolicy(burst=100)
    assert [policy.after_exit(0, 0.5, t * 100.0) for t in range(3)] == [1, 2, 4]
    assert policy.after_exit(0, uptime=3600, now=400) == 1
    assert policy.after_exit(0, uptime=0.5, now=500) == 1


def test_failed_starts_of_any_workers_within_the_window_give_up():
    policy = RestartPolicy(burst=3, window=60)
    assert policy.after_exit(0, 0.5, now=0) == 1
    assert policy.after_exit(1, 0.5, now=30) == 1
    assert policy.after_exit(0, 0.5, now=61) == 2, "the first failure left the window"
    assert policy.after_exit(1, 0.5, now=62) is None


def test_the_supervisor_backs_off_then_stops_everything_with_one_line(logged):
    reactor = Reactor()
    service, stopped = supervisor(reactor)
    for _ in range(5):
        _, protocol, _ = reactor.spawned[-1]
        reactor.advance(0.5)
        end(protocol)
        spawned = len(reactor.spawned)
        while len(reactor.spawned) == spawned and reactor.seconds() < 600:
            reactor.advance(0.5)
    starts = [started_at for started_at, _, _ in reactor.spawned]
    assert [b - a for a, b in zip(starts, starts[1:])] == [1.5, 2.5, 4.5, 8.5]
    assert len(reactor.spawned) == 5, "no start after giving up"
    assert stopped == [GIVE_UP_STATUS]
    [critical] = [e for e in logged if e.get("log_level") == LogLevel.critical]
    assert critical["burst"] == 5 and critical["status"] == 1 and "keep failing at start" in critical["log_format"]


def test_a_worker_that_served_a_while_is_replaced_after_a_second_every_time():
    reactor = Reactor()
    service, stopped = supervisor(reactor)
    for _ in range(10):
        _, protocol, _ = reactor.spawned[-1]
        reactor.advance(3600)
        end(protocol, status=None)
        reactor.advance(1)
    assert len(reactor.spawned) == 11 and stopped == []


def test_sigterm_during_a_back_off_starts_nothing_more():
    reactor = Reactor()
    service, stopped = supervisor(reactor, count=2)
    (_, first, _), (_, second, process) = reactor.spawned
    end(first)
    waiting = service.stopService()
    assert process.signals == [signal.SIGTERM]
    end(second, status=0)
    reactor.advance(60)
    assert len(reactor.spawned) == 2 and stopped == []
    assert waiting.called


def test_a_store_down_before_the_workers_start_is_one_line_each_try(logged):
    """Storing the config's clients is retried while the store is down, with no traceback for an outage."""
    reactor = Reactor()
    refusals = [StoreUnavailable("PostgreSQL: Connection refused")] * 2

    async def prepare():
        if refusals:
            raise refusals.pop()

    service = Supervisor(reactor, 1, [], 0, prepare, config=ConfigSource(Path("authsrv.toml"), b""),
                         argv=["authsrv"], give_up=[].append)
    service.startService()
    reactor.advance(PREPARE_RETRY)
    assert reactor.spawned == []
    reactor.advance(PREPARE_RETRY)
    assert len(reactor.spawned) == 1
    retries = [e for e in logged if "trying again" in e.get("log_format", "")]
    assert [formatEvent(e) for e in retries] == [
        f"could not store the clients declared in the config file (PostgreSQL: Connection refused);"
        f" trying again in {PREPARE_RETRY}s"
    ] * 2
    assert not any("log_failure" in e for e in retries)


class Stopping:
    """A reactor already stopping (SIGTERM came first): C{stop} refuses."""

    def __init__(self):
        self.triggers: list = []

    def addSystemEventTrigger(self, phase, event, f):
        self.triggers.append((phase, event, f))

    def stop(self):
        raise ReactorNotRunning()


def test_giving_up_while_already_stopping_still_sets_the_exit_status():
    reactor = Stopping()
    exit_after_stop(reactor, GIVE_UP_STATUS)
    assert [(phase, event) for phase, event, _ in reactor.triggers] == [("after", "shutdown")]
