"""
grant_type=authorization_code (RFC 6749 section 4.1.3, RFC 7636): the code
is looked up (bringing its grant and its user's ban), checked, the user
asked for, the tokens minted, and only then redeemed, in the one store step
that also writes the tokens (L{authsrv.store.codes}): an exchange is two
store calls and one durable commit, and an outage before the end leaves the
code usable. A failed check refuses the code, which uses it up and revokes
the grant it would have started, and a second redemption revokes whatever
the first one issued (docs/design.md, Authorization codes).
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.grants.users import audience, granted_scope
from authsrv.flows.issue import issued_event, signed_beside
from authsrv.protocol import pkce
from authsrv.protocol.errors import InvalidGrant, OAuthError
from authsrv.protocol.params import require
from authsrv.records import AuthorizationCode, Client
from authsrv.store.codes import CodeNotFound, CodeReused
from authsrv.tokens import token_hash


NOT_FOUND = "the authorization code is unknown or expired"


def _reused(client: Client, reused: CodeReused, address: str | None) -> InvalidGrant:
    """The answer to a code used before (brought back from C{address}), once its grant is revoked."""
    events.code_reused(client_id=client.client_id, grant_id=reused.grant_id, address=address)
    return InvalidGrant("the authorization code was already used; the tokens issued for it are revoked")


def _check_code(code: AuthorizationCode, redirect_uri: str, verifier: str, jkt: str | None) -> None:
    if code.redirect_uri != redirect_uri:
        raise InvalidGrant("redirect_uri differs from the one of the authorization request")
    if not pkce.verify(verifier, code.code_challenge):
        raise InvalidGrant("code_verifier does not match the code_challenge of the authorization request")
    if code.dpop_jkt is not None and code.dpop_jkt != jkt:
        raise InvalidGrant("the authorization code is bound to a DPoP key (dpop_jkt): send a proof made with that key")


class AuthorizationCodeGrant:
    """C{users} is a L{GrantUsers}, C{minter} a L{authsrv.flows.issue.TokenMinter}."""

    grant_type = "authorization_code"

    def __init__(self, *, store, users, minter):
        self._store = store
        self._users = users
        self._minter = minter

    async def exchange(self, client: Client, params: dict[str, str], now: int, jkt: str | None,
                       address: str | None) -> dict:
        store = self._store
        value = require(params, "code")
        redirect_uri = require(params, "redirect_uri")
        verifier = require(params, "code_verifier")
        result = await store.find_code(token_hash(value), now, link_provider=self._users.link_provider)
        if isinstance(result, CodeReused) and result.client_id in (None, client.client_id):
            await store.revoke_grant(result.grant_id, now)
            raise _reused(client, result, address)
        if isinstance(result, CodeNotFound):
            raise InvalidGrant(NOT_FOUND)
        if isinstance(result, CodeReused) or result.code.client_id != client.client_id:
            # Another client's code: refused, but neither used up nor its grant revoked, since any caller
            # may claim a public client's id: only the client it was issued to can spend it.
            raise InvalidGrant("the authorization code was issued to another client")
        code = result.code
        try:
            _check_code(code, redirect_uri, verifier, jkt)
            granted_audience = audience(params, code.resource, client)
        except OAuthError:
            await store.refuse_code(code.code_hash, now)
            raise
        user = await self._users.allowed(code.grant_id, code.sub, client.client_id, now, address=address,
                                         ban=result.user_ban, link=result.linked_user_id)
        offline = "offline_access" in code.scope and "refresh_token" in client.grant_types
        minted = self._minter.mint(
            result.grant, client, user,
            scope=granted_scope(code.scope, offline),
            audience=granted_audience,
            nonce=code.nonce,
            refresh_scope=code.scope if offline else None,
            now=now,
            jkt=jkt,
            refresh_jkt=jkt if client.is_public else None,
        )
        issued, redeemed = await signed_beside(
            minted, store.redeem_code(code.code_hash, minted.issued.access, minted.issued.refresh, now))
        if isinstance(redeemed, CodeReused):
            raise _reused(client, redeemed, address)
        if isinstance(redeemed, CodeNotFound):
            raise InvalidGrant(NOT_FOUND)
        issued_event(issued, client.client_id, self.grant_type, address)
        return issued.response
