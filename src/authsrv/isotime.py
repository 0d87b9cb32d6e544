"""Times as the contract writes them: ISO 8601 in UTC with a Z."""

from __future__ import annotations

from datetime import datetime, timezone


def iso_utc(seconds: int) -> str:
    """C{seconds} since the epoch as, for example, C{2030-01-31T12:00:00Z}."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_utc_ms(seconds: float) -> str:
    """C{seconds} since the epoch to the millisecond, for log lines: C{2030-01-31T12:00:00.250Z}."""
    # isoformat ends in +00:00 for UTC; it is twice as fast as the same text through strftime.
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"
