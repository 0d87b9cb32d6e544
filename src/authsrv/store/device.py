"""
Device authorization requests (RFC 8628) for every store: L{poll} decides
what one poll does, so SQLite, PostgreSQL and the in-memory store cannot
differ in when a device is told to slow down or may have its tokens; each
store runs it on the row it read inside the one transaction that writes the
result. An approved request is redeemed only later, in the one transaction
that also writes its tokens (as an authorization code is,
L{authsrv.store.codes}): a failure before that, the store's included, leaves
it approved for the next poll. The statements are written once, with the
dialect's parameter marks.
"""

from __future__ import annotations

import attrs
from attrs import frozen

from authsrv.records import (
    DEVICE_APPROVED,
    DEVICE_DENIED,
    DEVICE_PENDING,
    DEVICE_REDEEMED,
    POLL_APPROVED,
    POLL_DENIED,
    POLL_EXPIRED,
    POLL_PENDING,
    POLL_REUSED,
    POLL_SLOW_DOWN,
    POLL_UNKNOWN,
    DeviceAuthorization,
    DevicePoll,
)
from authsrv.store.rows import Dialect, client_exists, issuable


def poll(device: DeviceAuthorization | None, client_id: str, slow_down: int,
         now: int) -> tuple[DevicePoll, DeviceAuthorization | None]:
    """
    The outcome of one poll, and the row to write back (None: unchanged).
    Another client's code is unknown and untouched, so nobody can use up or
    slow down a device code they did not get.
    """
    if device is None or device.client_id != client_id:
        return DevicePoll(POLL_UNKNOWN), None
    if device.status == DEVICE_REDEEMED:
        return DevicePoll(POLL_REUSED, device), None
    if device.expires_at <= now:
        return DevicePoll(POLL_EXPIRED, device), None
    if device.status == DEVICE_DENIED:
        return DevicePoll(POLL_DENIED, device), None
    if device.status == DEVICE_APPROVED:
        return DevicePoll(POLL_APPROVED, device), None
    if device.polled_at is not None and now < device.polled_at + device.poll_interval:
        changed = attrs.evolve(device, poll_interval=device.poll_interval + slow_down, polled_at=now)
        return DevicePoll(POLL_SLOW_DOWN, changed), changed
    changed = attrs.evolve(device, polled_at=now)
    return DevicePoll(POLL_PENDING, changed), changed


def decision(user_code_hash: str, sub: str, grant, now: int) -> dict:
    """The parameters of L{Statements.decide}."""
    return {
        "user_code_hash": user_code_hash, "sub": sub, "now": now, "pending": DEVICE_PENDING,
        "status": DEVICE_DENIED if grant is None else DEVICE_APPROVED,
        "grant_id": None if grant is None else grant.grant_id,
    }


def written(device: DeviceAuthorization) -> dict:
    """The parameters of L{Statements.write}."""
    return {"hash": device.device_code_hash, "status": device.status, "poll_interval": device.poll_interval,
            "polled_at": device.polled_at}


@frozen
class Statements:
    """The device requests' statements in one dialect."""

    find: str
    """The unexpired request of a user code."""
    read: str
    """The request of a device code (with C{FOR UPDATE} where the dialect locks rows)."""
    decide: str
    """Approve or deny a pending, unexpired request of a stored client; returns its device code hash."""
    write: str
    """Write back what L{poll} changed."""
    redeem: str
    """Redeem an approved, unexpired request whose grant is issuable (L{redeeming}); returns its grant."""
    redeemed: str
    """The grant of a redeemed request (L{redeeming})."""


def statements(dialect: Dialect, lock: str = "") -> Statements:
    marks = {name: dialect.mark.format(name) for name in (
        "user_code_hash", "now", "hash", "status", "sub", "grant_id", "pending", "poll_interval", "polled_at",
        "redeemed", "approved",
    )}
    return Statements(
        find="SELECT * FROM device_authorizations WHERE user_code_hash = {user_code_hash} AND expires_at > {now}"
        .format(**marks),
        read="SELECT * FROM device_authorizations WHERE device_code_hash = {hash}".format(**marks) + lock,
        decide=(
            "UPDATE device_authorizations SET status = {status}, sub = {sub}, grant_id = {grant_id}"
            " WHERE user_code_hash = {user_code_hash} AND status = {pending} AND expires_at > {now} AND "
            + client_exists(dialect, "device_authorizations.client_id") + " RETURNING device_code_hash"
        ).format(**marks),
        write=(
            "UPDATE device_authorizations SET status = {status}, poll_interval = {poll_interval},"
            " polled_at = {polled_at} WHERE device_code_hash = {hash}"
        ).format(**marks),
        redeem=(
            "UPDATE device_authorizations SET status = {redeemed}, polled_at = {now}"
            " WHERE device_code_hash = {hash} AND status = {approved} AND expires_at > {now} AND "
        ).format(**marks) + issuable(dialect, "device_authorizations.grant_id") + " RETURNING grant_id",
        redeemed=(
            "SELECT grant_id FROM device_authorizations WHERE device_code_hash = {hash} AND status = {redeemed}"
        ).format(**marks),
    )


def redeeming(device_code_hash: str, now: int) -> dict:
    """The parameters of L{Statements.redeem} and L{Statements.redeemed}."""
    return {"hash": device_code_hash, "now": now, "redeemed": DEVICE_REDEEMED, "approved": DEVICE_APPROVED}
