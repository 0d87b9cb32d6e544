"""
The login throttle's rules (docs/design.md, Brute force), shared by every store.

A store keeps one row per counted attempt (C{login_attempts}: account,
address, when, until when it counts) and, inside the one transaction that
may count a new attempt, reads the few numbers in L{Counts} and whether the
browser is a known device of the account (one statement); L{wait} decides
from them, so SQLite, PostgreSQL and the in-memory store cannot differ in
what they allow. The statements are written once, with the dialect's
parameter marks.
"""

from __future__ import annotations

from attrs import field, frozen

from authsrv.records import ThrottlePolicy
from authsrv.store.rows import Dialect


@frozen
class Counts:
    """What the rules need to know about the attempts still counted at C{now}."""

    pair: int
    """Attempts of this (account, address) pair."""
    pair_last: int | None
    """When the latest of them was made."""
    address_free_at: int | None
    """When the address falls below its limit again, None while it is below."""
    account_free_at: int | None
    """When the account falls below its limit again, None while it is below."""
    known_device: bool = field(converter=bool)
    """The browser signed in to this account before and is still remembered."""


def wait(policy: ThrottlePolicy, counts: Counts, now: int) -> int | None:
    """
    Seconds until an attempt may be made, or None when it may be made now.
    Past the pair's limit, each failure doubles the delay after the latest
    one (1 s, 2 s, 4 s, ... up to C{max_delay}); past the address's or the
    account's limit, attempts wait until enough failures have left the
    window; a known device skips the account's limit.
    """
    waits = [0]
    if counts.pair >= policy.failures_per_pair:
        delay = min(policy.max_delay, 2 ** min(counts.pair - policy.failures_per_pair, 64))
        waits.append(counts.pair_last + delay - now)
    if counts.address_free_at is not None:
        waits.append(counts.address_free_at - now)
    if counts.account_free_at is not None and not counts.known_device:
        waits.append(counts.account_free_at - now)
    longest = max(waits)
    return longest if longest > 0 else None


def params(account: str, address: str, device_hash: str | None, policy: ThrottlePolicy, now: int) -> dict:
    """The parameters of L{Statements.counts} and L{Statements.insert}; no C{device_hash} is no known device."""
    return {
        "account": account,
        "address": address,
        "device_hash": device_hash,
        "now": now,
        "expires_at": now + policy.window,
        "address_offset": policy.failures_per_address - 1,
        "account_offset": policy.failures_per_account - 1,
    }


@frozen
class Statements:
    """The throttle's and known devices' statements in one dialect."""

    counts: str
    """One row of L{Counts}' fields, the known device's included."""
    insert: str
    """Count an attempt; returns its C{attempt_id}, the ticket."""
    remember: str
    """Remember a known device, or keep it until the new time."""


def statements(dialect: Dialect) -> Statements:
    # The address and account limits are reached when their limit-th newest
    # attempt still counts; once it leaves the window, fewer remain.
    marks = {name: dialect.mark.format(name) for name in (
        "account", "address", "now", "expires_at", "address_offset", "account_offset", "device_hash",
    )}
    return Statements(
        counts=(
            "SELECT p.n AS pair, p.last AS pair_last,"
            " (SELECT expires_at FROM login_attempts WHERE address = {address} AND expires_at > {now}"
            "  ORDER BY expires_at DESC LIMIT 1 OFFSET {address_offset}) AS address_free_at,"
            " (SELECT expires_at FROM login_attempts WHERE account = {account} AND expires_at > {now}"
            "  ORDER BY expires_at DESC LIMIT 1 OFFSET {account_offset}) AS account_free_at,"
            " EXISTS (SELECT 1 FROM known_devices WHERE account = {account} AND device_hash = {device_hash}"
            "  AND expires_at > {now}) AS known_device"
            " FROM (SELECT count(*) AS n, max(at) AS last FROM login_attempts"
            "  WHERE account = {account} AND address = {address} AND expires_at > {now}) AS p"
        ).format(**marks),
        insert=(
            "INSERT INTO login_attempts (account, address, at, expires_at)"
            " VALUES ({account}, {address}, {now}, {expires_at}) RETURNING attempt_id"
        ).format(**marks),
        remember=(
            "INSERT INTO known_devices (account, device_hash, expires_at)"
            " VALUES ({account}, {device_hash}, {expires_at})"
            " ON CONFLICT (account, device_hash) DO UPDATE SET expires_at = EXCLUDED.expires_at"
        ).format(**marks),
    )
