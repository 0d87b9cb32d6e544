"""
Scope strings (RFC 6749 section 3.3): space-separated tokens of printable
ASCII without space, double quote or backslash; order carries no meaning.
"""

from __future__ import annotations

import re

from authsrv.protocol.errors import InvalidScope

_SCOPE_TOKEN = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")


def parse_scope(text: str) -> frozenset[str]:
    """The set of scope tokens in C{text}; L{InvalidScope} for a malformed one."""
    tokens = frozenset(token for token in text.split(" ") if token)
    for token in tokens:
        if not _SCOPE_TOKEN.fullmatch(token):
            raise InvalidScope("scope must be space-separated tokens of printable ASCII")
    return tokens


def scope_text(scope: frozenset[str]) -> str:
    """A scope set as its space-separated wire form, in a stable order."""
    return " ".join(sorted(scope))
