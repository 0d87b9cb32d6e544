"""
JSON without spaces, as every response body, signed token and sealed answer
is written, in UTF-8 bytes: orjson, a tenth of the standard encoder's time
for a small answer (0.17 µs against 1.5 for an introspection answer), where
the standard encoder's Python layers cost more than the encoding itself.
What orjson refuses and the standard encoder writes (an integer beyond 64
bits, nesting deeper than 254, a lone surrogate) is written by the standard
encoder as before, escaped to ASCII.
"""

from __future__ import annotations

import json

import orjson

_FALLBACK = json.JSONEncoder(separators=(",", ":"))


def compact(value) -> bytes:
    """C{value} as compact JSON in UTF-8, non-string keys written as C{json.dumps} writes them."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return _FALLBACK.encode(value).encode("ascii")
