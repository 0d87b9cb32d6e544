"""
Login throttling (DESIGN.md, Limits): failures are counted per account and
per client address in a sliding window; past the limit, attempts are refused
before any password is checked. L{MemoryLoginThrottle} keeps the counts in
process memory, for the login flow until it uses the store's
L{authsrv.interfaces.ILoginThrottle}; L{account_key} is how both name an
account.
"""

from __future__ import annotations

import math
import unicodedata
from collections import OrderedDict, deque

from twisted.internet.defer import succeed

ACCOUNT_FAILURES = 5
ADDRESS_FAILURES = 20
WINDOW = 15 * 60
MAX_KEYS = 100_000
"""Keys remembered at most, so a flood of made-up logins cannot exhaust memory."""


def account_key(login: str) -> str:
    """Logins compared as the identity backends compare them: NFC, casefolded."""
    return "account:" + unicodedata.normalize("NFC", login).casefold()


class MemoryLoginThrottle:
    """Failure timestamps per key, with the times given by the caller."""

    def __init__(self, account_failures=ACCOUNT_FAILURES, address_failures=ADDRESS_FAILURES, window=WINDOW):
        self._limits = {"account": account_failures, "address": address_failures}
        self._window = window
        self._failures: OrderedDict[str, deque] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque:
        failures = self._failures.get(key)
        if failures is None:
            return deque()
        while failures and failures[0] <= now - self._window:
            failures.popleft()
        if not failures:
            del self._failures[key]
        return failures

    def _keys(self, login: str, address: str) -> list[tuple[str, int]]:
        return [
            (account_key(login), self._limits["account"]),
            ("address:" + address, self._limits["address"]),
        ]

    def retry_after(self, login: str, address: str, now: float):
        waits = [
            max(1, math.ceil(failures[0] + self._window - now))
            for key, limit in self._keys(login, address)
            if len(failures := self._recent(key, now)) >= limit
        ]
        return succeed(max(waits) if waits else None)

    def failed(self, login: str, address: str, now: float):
        for key, _ in self._keys(login, address):
            failures = self._recent(key, now)
            self._failures[key] = failures
            self._failures.move_to_end(key)
            failures.append(now)
        while len(self._failures) > MAX_KEYS:
            self._failures.popitem(last=False)
        return succeed(None)

    def succeeded(self, login: str, address: str, now: float):
        self._failures.pop(account_key(login), None)
        return succeed(None)
