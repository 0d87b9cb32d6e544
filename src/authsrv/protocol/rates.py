"""Request rates as operators write them: C{"50/s"}, C{"600/m"}, C{"10000/h"}, or C{"off"}."""

from __future__ import annotations

import re

from attrs import frozen

_RATE = re.compile(r"\s*([1-9][0-9]{0,8})\s*/\s*(s|m|h)\s*")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


@frozen
class Rate:
    """C{count} requests per C{per} seconds."""

    count: int
    per: int


def parse_rate(text: str) -> Rate | None:
    """A rate, or None for C{"off"}; L{ValueError} says what is wrong."""
    if text.strip().lower() == "off":
        return None
    match = _RATE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a rate such as \"50/s\", \"600/m\", \"10000/h\" or \"off\"")
    return Rate(int(match[1]), _SECONDS[match[2]])
