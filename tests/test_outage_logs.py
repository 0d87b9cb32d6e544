"""A dependency's outage is logged once a minute, not once a request, and housekeeping's with one line."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet.defer import FirstError
from twisted.internet.task import Clock
from twisted.logger import Logger, capturedLogs
from twisted.python.failure import Failure

from authsrv.service import AuthsrvService
from authsrv.store.errors import StoreUnavailable
from authsrv.web.quiet import QuietWarnings


def test_a_warning_repeated_within_a_minute_is_held_back_and_counted():
    clock = Clock()
    log = Logger()
    quiet = QuietWarnings(log, clock)
    with capturedLogs() as events:
        for _ in range(5):
            quiet.warn("store unavailable", ConnectionError("refused"))
        quiet.warn("identity backend unavailable", ConnectionError("timed out"))
        clock.advance(61)
        quiet.warn("store unavailable", ConnectionError("refused"))
    assert [(e["kind"], e["held"]) for e in events] == [
        ("store unavailable", 0), ("identity backend unavailable", 0), ("store unavailable", 4),
    ]


def test_maintenance_put_off_by_an_outage_is_one_line_without_a_traceback():
    owner = SimpleNamespace(log=Logger())
    with capturedLogs() as events:
        AuthsrvService._maintenance_failed(owner, Failure(FirstError(Failure(StoreUnavailable("refused")), 1)))
        AuthsrvService._maintenance_failed(owner, Failure(FirstError(Failure(KeyError("a bug")), 0)))
    put_off, failed = events
    assert put_off["log_level"].name == "warn" and "log_failure" not in put_off
    assert failed["log_level"].name == "critical" and failed["log_failure"].check(FirstError)
