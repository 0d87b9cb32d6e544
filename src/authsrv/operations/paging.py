"""
Bounded pages of a store's ordered list, continued with an opaque cursor
that holds the last key shown: the store reads one page (keyset paging).
"""

from __future__ import annotations

import base64
import binascii
from typing import Awaitable, Callable, Sequence, TypeVar

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


def refused_cursor() -> InvalidInput:
    return InvalidInput("cursor is not one this server gave: give the next_cursor of the page before, or none"
                        " for the first page", "cursor")


def decode_cursor(cursor: str) -> str:
    try:
        key = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise refused_cursor() from None
    if not key or "\x00" in key:
        raise refused_cursor()
    return key


def check_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be a whole number from 1 to {MAX_LIMIT}", "limit")
    return limit


async def page(read: Callable[[str | None, int], Awaitable[Sequence[T]]], key: Callable[[T], str],
               limit: int | None, cursor: str | None) -> Page:
    """
    At most C{limit} items after C{cursor}: C{read(after, n)} gives the
    first C{n} items (ascending by C{key}) whose key is after C{after}; one
    more than the page is read, to know whether another page follows.
    """
    limit = check_limit(limit)
    rows = await read(decode_cursor(cursor) if cursor else None, limit + 1)
    chosen = rows[:limit]
    return Page(tuple(chosen), encode_cursor(key(chosen[-1])) if len(rows) > limit else None)
