"""
JSON that arrives from outside: a request body, a JWT's payload, a
document fetched from a client's site.

A JSON string may escape half of a surrogate pair alone (C{"\\ud800"}),
and C{json.loads} of bytes lets UTF-8-encoded surrogates through as well;
neither is Unicode text, and such a string fails later wherever it is
written as UTF-8 (a database, a file, a log line), long after the request
could have been told why. RFC 8259 section 8.2 leaves a receiver free to
refuse it: this module refuses it on arrival, as it refuses the NaN and
Infinity Python's reader takes, which JSON has not (section 6).
"""

from __future__ import annotations

import json
from collections.abc import Iterator


class NotJSONText(ValueError):
    """Input that is no JSON text this server reads; the message says why, for a person."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""Python's reader without its extensions to RFC 8259: NaN, Infinity and -Infinity."""


def _unique_members(pairs: list) -> dict:
    names = set()
    for name, _ in pairs:
        if name in names:
            raise ValueError(f"the member {name!r} appears twice in one object")
        names.add(name)
    return dict(pairs)


_UNIQUE_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_members)
"""L{_DECODER} that also refuses an object naming a member twice (I-JSON, RFC 7493 section 2.3)."""


def loads(data: bytes | bytearray | str, *, unique_names: bool = False):
    """
    C{json.loads} of UTF-8 bytes or of text, or L{NotJSONText}: for bytes
    that are not UTF-8, input that is not JSON (NaN and Infinity included)
    or is nested too deeply, and a string holding a lone surrogate. With
    C{unique_names}, an object naming a member twice is refused too, where
    readers that keep the first and the last would disagree on a request
    (a slower reader: not for the hot paths).
    """
    try:
        if isinstance(data, (bytes, bytearray)):
            text = bytes(data).decode("utf-8")
        else:
            text = data
            text.encode("utf-8")  # text handed in may hold a surrogate outside any escape
    except UnicodeError:
        raise NotJSONText("it is not UTF-8 text") from None
    try:
        value = (_UNIQUE_DECODER if unique_names else _DECODER).decode(text)
    except RecursionError:
        raise NotJSONText("it is nested too deeply") from None
    except ValueError as e:
        raise NotJSONText(f"it is not valid JSON ({e})") from None
    if "\\u" in text and _holds_lone_surrogate(value):
        raise NotJSONText("a string in it escapes half of a surrogate pair alone (\\ud800 to \\udfff),"
                          " which is not Unicode text")
    return value


def parts(value) -> Iterator:
    """C{value} and everything in it, member names included, without recursion (however deeply it nests)."""
    pending = [value]
    while pending:
        item = pending.pop()
        yield item
        if isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _holds_lone_surrogate(value) -> bool:
    """Whether any string or member name in C{value} does; a pair was joined by the parser."""
    for item in parts(value):
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False
