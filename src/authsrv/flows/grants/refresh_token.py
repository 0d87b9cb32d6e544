"""
grant_type=refresh_token (RFC 6749 section 6, docs/design.md Refresh tokens):
the token's lookup brings its grant and its user's ban, the user is asked
for again and ban-checked, then one compare-and-swap in the store decides
between a new pair, the same pair again (the client lost the answer inside
the grace window: the sealed replay, its ID token signed again), and reuse
(the family is revoked). The ID token is signed while the store rotates.
A public client's new refresh token is bound to the key of the proof it
sent (RFC 9449 section 5), even when the one it presented was not.
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.grants.users import audience
from authsrv.flows.issue import issued_event, signed_beside
from authsrv.protocol.errors import InvalidGrant, InvalidScope
from authsrv.protocol.params import require
from authsrv.protocol.replay import seal, unseal
from authsrv.protocol.scope import parse_scope
from authsrv.records import Client, Replayed, Reused, Rotated
from authsrv.tokens import token_hash

UNKNOWN = "the refresh token is unknown, expired, revoked or was issued to another client"


def grace_window(client: Client, limits) -> int:
    """
    How long a rotated token may be presented again for the same answer: the
    client's own setting, else none for public clients (RFC 9700 section
    4.14.2: their tokens live where they can be stolen) and the server's
    window for confidential ones (useless without the client's secret).
    """
    if client.refresh_grace is not None:
        return client.refresh_grace
    return limits.refresh_grace_public if client.is_public else limits.refresh_grace


class RefreshTokenGrant:
    """C{limits} gives the grace windows (L{grace_window})."""

    grant_type = "refresh_token"

    def __init__(self, *, store, users, minter, limits):
        self._store = store
        self._users = users
        self._minter = minter
        self._limits = limits

    async def exchange(self, client: Client, params: dict[str, str], now: int, jkt: str | None,
                       address: str | None) -> dict:
        store = self._store
        presented = require(params, "refresh_token")
        old = await store.get_refresh_token(token_hash(presented), link_provider=self._users.link_provider)
        if old is None or old.client_id != client.client_id or old.revoked or old.expires_at <= now:
            raise InvalidGrant(UNKNOWN)
        if old.jkt is not None and old.jkt != jkt:
            raise InvalidGrant("the refresh token is bound to a DPoP key: send a proof made with that key")
        scope = old.scope
        if "scope" in params:
            scope = parse_scope(params["scope"]) or old.scope
            if not scope <= old.scope:
                raise InvalidScope("a refresh may narrow the granted scope but never widen it")
        grant = old.grant
        if grant is None:
            raise InvalidGrant(UNKNOWN)
        user = await self._users.allowed(old.grant_id, old.sub, client.client_id, now, address=address,
                                         ban=old.user_ban, link=old.linked_user_id)
        minted = self._minter.mint(
            grant, client, user,
            scope=scope,
            audience=audience(params, grant.resource, client),
            nonce=None,
            refresh_scope=old.scope,
            now=now,
            jkt=jkt,
            refresh_jkt=old.jkt if old.jkt is not None or not client.is_public else jkt,
        )
        # Without a grace window nothing can be replayed: nothing is sealed or stored for it.
        window = grace_window(client, self._limits)
        replay = seal(minted.replayable(), presented) if window > 0 else None
        issued, result = await signed_beside(minted, store.rotate_refresh(
            old.token_hash, minted.issued.refresh, minted.issued.access, replay, now + window, now))
        if isinstance(result, Rotated):
            issued_event(issued, client.client_id, self.grant_type, address)
            return issued.response
        if isinstance(result, Replayed):
            sealed = unseal(result.replay, presented)
            if sealed is not None:
                return self._minter.replayed(sealed, now)
        elif isinstance(result, Reused):
            events.refresh_reused(client_id=client.client_id, grant_id=result.grant_id, address=address)
            raise InvalidGrant("the refresh token was already used; every token of its grant is revoked")
        raise InvalidGrant(UNKNOWN)
