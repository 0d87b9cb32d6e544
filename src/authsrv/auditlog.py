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


def audit_line(event) -> str:
    return json.dumps(audit_record(event), default=str, separators=(",", ":")) + "\n"


@implementer(ILogObserver)
class AuditObserver:
    """Writes the audit events it sees to C{file} (a L{LineFile}), one line each."""

    def __init__(self, file: LineFile):
        self.file = file

    def __call__(self, event) -> None:
        if is_audit(event):
            self.file.write(audit_line(event))


@implementer(ILogFilterPredicate)
class WithoutAudit:
    """The diagnostic log's filter: the audit events have their own file."""

    def __call__(self, event) -> PredicateResult:
        return PredicateResult.no if is_audit(event) else PredicateResult.maybe

