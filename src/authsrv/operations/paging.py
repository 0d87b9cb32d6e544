"""Bounded pages over ordered lists, continued with an opaque cursor."""

from __future__ import annotations

import base64
import binascii
from typing import Callable, Sequence, TypeVar

from attrs import frozen

from authsrv.operations.errors import InvalidInput

MAX_LIMIT = 100
DEFAULT_LIMIT = 50

T = TypeVar("T")


@frozen
class Page:
    items: tuple
    next_cursor: str | None


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        key = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidInput("cursor is not one this server gave", "cursor") from None
    if not key:
        raise InvalidInput("cursor is not one this server gave", "cursor")
    return key


def check_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be a whole number from 1 to {MAX_LIMIT}", "limit")
    return limit


def page(items: Sequence[T], key: Callable[[T], str], limit: int | None, cursor: str | None) -> Page:
    """The items after C{cursor} (in the order given, ascending by C{key}), at most C{limit}."""
    limit = check_limit(limit)
    after = decode_cursor(cursor) if cursor else None
    rest = [item for item in items if after is None or key(item) > after]
    chosen = rest[:limit]
    more = len(rest) > limit
    return Page(tuple(chosen), encode_cursor(key(chosen[-1])) if more else None)
