"""
The audit log (C{[audit] path}, docs/audit.md): each security event of
L{authsrv.events} as one JSON object on one line, with every common field
(C{null} where it does not apply) and the event's own, flushed at once.
It is apart from the diagnostic log, which leaves these events out.
"""

from __future__ import annotations

import json

from twisted.logger import ILogFilterPredicate, ILogObserver, PredicateResult
from zope.interface import implementer

from authsrv import events
from authsrv.isotime import iso_utc_ms
from authsrv.logfile import LineFile

_LATER_COMMON = events.COMMON_FIELDS[2:]


def is_audit(event) -> bool:
    return event.get("log_namespace") == events.log.namespace and "event" in event


def audit_record(event) -> dict:
    """The audit line's fields of a twisted.logger event from L{authsrv.events}."""
    name = event["event"]
    record = {"event": name, "time": iso_utc_ms(event["log_time"])}
    for field in _LATER_COMMON:
        record[field] = event.get(field)
    for field in events.EVENT_FIELDS.get(name, ()):
        record[field] = event.get(field)
    return record


_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))
"""Made once: C{json.dumps} with options makes an encoder for every line."""


def audit_line(event) -> str:
    return _ENCODER.encode(audit_record(event)) + "\n"


REPLAY_WINDOW = 64
"""How many written events are remembered to recognise a replay."""


@implementer(ILogObserver)
class AuditObserver:
    """
    Writes the audit events it sees to C{file} (a L{LineFile}), one line
    each. When C{twist} begins logging it replays the events logged before
    to every observer of the publisher, this one included: an event already
    written (the very same event) is not written twice. The last events
    written are kept by their C{id}, which no other live object can share
    while they are kept: one lookup per event, where every token and sign-in
    writes one or more.
    """

    def __init__(self, file: LineFile):
        self.file = file
        self._written: dict[int, dict] = {}

    def __call__(self, event) -> None:
        written = self._written
        if not is_audit(event) or written.get(id(event)) is event:
            return
        written[id(event)] = event
        if len(written) > REPLAY_WINDOW:
            del written[next(iter(written))]
        self.file.write(audit_line(event))


@implementer(ILogFilterPredicate)
class WithoutAudit:
    """The diagnostic log's filter: the audit events have their own file."""

    def __call__(self, event) -> PredicateResult:
        return PredicateResult.no if is_audit(event) else PredicateResult.maybe

