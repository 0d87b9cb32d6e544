"""
The diagnostic log as JSON (C{[log] format = "json"}, or C{twist
--log-format json}): one object per line with C{time}, C{level},
C{namespace}, C{message} (the event's text, as the text log shows it),
C{traceback} for a failure, and the event's own fields. A value JSON cannot
hold is written as its C{repr}, so no event is ever lost to its contents.
"""

from __future__ import annotations

import json

from twisted.logger import FileLogObserver, formatEvent

from authsrv.isotime import iso_utc_ms

_SEPARATORS = (",", ":")


def _safe(value):
    """C{value} if JSON can write it, else its C{repr}."""
    try:
        json.dumps(value, default=repr, separators=_SEPARATORS)
    except (TypeError, ValueError):
        return repr(value)
    return value


def log_record(event) -> dict:
    """The JSON object for one twisted.logger event."""
    level = event.get("log_level")
    record = {
        "time": iso_utc_ms(event["log_time"]) if "log_time" in event else None,
        "level": level.name if level is not None else None,
        "namespace": event.get("log_namespace"),
        "message": formatEvent(event),
    }
    failure = event.get("log_failure")
    if failure is not None:
        record["traceback"] = failure.getTraceback()
    for key, value in event.items():
        if not key.startswith("log_") and key not in record:
            record[key] = value
    return record


def format_json_line(event) -> str:
    record = log_record(event)
    try:
        text = json.dumps(record, default=repr, separators=_SEPARATORS)
    except (TypeError, ValueError):
        text = json.dumps({key: _safe(value) for key, value in record.items()}, default=repr,
                          separators=_SEPARATORS)
    return text + "\n"


def json_log_observer(out) -> FileLogObserver:
    """A file log observer writing L{format_json_line} lines to C{out}, as twist's factories are called."""
    return FileLogObserver(out, format_json_line)
