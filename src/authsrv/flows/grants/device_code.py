"""
grant_type=urn:ietf:params:oauth:grant-type:device_code (RFC 8628 section
3.4): the device polls with its device code. One atomic store step decides
each poll, so every instance agrees: still pending (or polled too fast,
which lengthens the interval), denied, expired, or approved. An approved
device's tokens are minted and then stored in the one step that redeems its
code, once (as an authorization code's are): a failure before its end, the
store's included, leaves the code for the next poll. A device code
presented again after its redemption revokes what the first one issued, as
a replayed authorization code does (docs/design.md, Authorization codes).
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.grants.users import audience, granted_scope
from authsrv.flows.issue import issued_event, signed_beside
from authsrv.protocol.device import DEVICE_CODE_GRANT, SLOW_DOWN_STEP
from authsrv.protocol.errors import (
    AuthorizationPending,
    DeviceAccessDenied,
    ExpiredToken,
    InvalidGrant,
    SlowDown,
)
from authsrv.protocol.params import require
from authsrv.records import (
    POLL_APPROVED,
    POLL_DENIED,
    POLL_EXPIRED,
    POLL_PENDING,
    POLL_REDEEMED,
    POLL_REUSED,
    POLL_SLOW_DOWN,
    Client,
    DeviceAuthorization,
)
from authsrv.tokens import token_hash

UNKNOWN = "the device code is unknown or was issued to another client"


def _reused(client: Client, device, address: str | None) -> InvalidGrant:
    """The answer to a device code redeemed before (C{device}), from C{address}, once its grant is revoked."""
    events.device_code_reused(client_id=client.client_id, grant_id=device.grant_id, address=address)
    return InvalidGrant("the device code was already used; the tokens issued for it are revoked")


class DeviceCodeGrant:
    """C{users} is a L{GrantUsers}, C{minter} a L{authsrv.flows.issue.TokenMinter}."""

    grant_type = DEVICE_CODE_GRANT

    def __init__(self, *, store, users, minter):
        self._store = store
        self._users = users
        self._minter = minter

    async def exchange(self, client: Client, params: dict[str, str], now: int, jkt: str | None = None,
                       address: str | None = None) -> dict:
        store = self._store
        polled = await store.poll_device_authorization(
            token_hash(require(params, "device_code")), client.client_id, SLOW_DOWN_STEP, now,
        )
        device = polled.device
        if polled.outcome == POLL_PENDING:
            raise AuthorizationPending("the user has not yet approved the device; poll again after the interval")
        if polled.outcome == POLL_SLOW_DOWN:
            raise SlowDown(f"polled too often; wait {device.poll_interval} seconds between requests")
        if polled.outcome == POLL_DENIED:
            raise DeviceAccessDenied("the user denied the device's request")
        if polled.outcome == POLL_EXPIRED:
            raise ExpiredToken("the device code expired; start a new device authorization")
        if polled.outcome == POLL_REUSED:
            await store.revoke_grant(device.grant_id, now)
            raise _reused(client, device, address)
        if polled.outcome != POLL_APPROVED:
            raise InvalidGrant(UNKNOWN)
        minted = await self._mint(device, client, params, now, jkt, address)
        issued, redeemed = await signed_beside(minted, store.redeem_device_authorization(
            device.device_code_hash, minted.issued.access, minted.issued.refresh, now))
        if redeemed == POLL_REUSED:
            raise _reused(client, device, address)
        if redeemed != POLL_REDEEMED:
            raise InvalidGrant("the device code expired or its grant was revoked; start a new device authorization")
        issued_event(issued, client.client_id, self.grant_type, address)
        return issued.response

    async def _mint(self, device: DeviceAuthorization, client: Client, params: dict[str, str], now: int,
                    jkt: str | None, address: str | None):
        """The approved device's tokens, not yet stored nor signed; C{address}, the polling device's."""
        user = await self._users.allowed(device.grant_id, device.sub, client.client_id, now, address=address)
        grant = await self._store.get_grant(device.grant_id)
        if grant is None or grant.revoked_at is not None:
            raise InvalidGrant("the device's grant was revoked")
        offline = "offline_access" in device.scope and "refresh_token" in client.grant_types
        return self._minter.mint(
            grant, client, user,
            scope=granted_scope(device.scope, offline),
            audience=audience(params, device.resource, client),
            nonce=None,
            refresh_scope=device.scope if offline else None,
            now=now, jkt=jkt, refresh_jkt=jkt if client.is_public else None,
        )
