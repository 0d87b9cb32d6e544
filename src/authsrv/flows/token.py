"""
The token endpoint's grants (DESIGN.md, Token response, Authorization codes,
Refresh tokens): authorization_code with PKCE and refresh_token with
rotation, its grace-window replay and family revocation. Every decision that
must hold across instances is one atomic store step (consume_code,
rotate_refresh); this module only prepares the values and reads the answer.

C{server} is anything with C{store}, C{keystore}, C{identity}, C{limits}
and C{issuer} (the L{authsrv.web.app.AuthServer}).
"""

from __future__ import annotations

from attrs import frozen

from authsrv import events
from authsrv.flows.standing import Standing, standing
from authsrv.protocol import pkce
from authsrv.protocol.clientauth import authenticate, client_credentials
from authsrv.protocol.errors import (
    InvalidGrant,
    InvalidScope,
    InvalidTarget,
    OAuthError,
    UnsupportedGrantType,
)
from authsrv.protocol.jwt_access import ACCESS_TOKEN_TYPE, access_token_claims
from authsrv.protocol.oidc import ID_TOKEN_TYPE, id_token_claims
from authsrv.protocol.params import require
from authsrv.protocol.replay import seal, unseal
from authsrv.protocol.scope import parse_scope, scope_text
from authsrv.records import (
    AccessToken,
    AuthorizationCode,
    Client,
    CodeNotFound,
    CodeReused,
    Grant,
    RefreshToken,
    Replayed,
    Reused,
    Rotated,
    User,
)
from authsrv.tokens import fingerprint, new_token, token_hash

SIGNING_ALG = "RS256"
GRANT_TYPES = ("authorization_code", "refresh_token")


async def authenticate_client(clients, authorization: bytes | None, params: dict[str, str]) -> Client:
    """
    The client a token, introspection or revocation request comes from
    (client_secret_basic, client_secret_post, or a public client by its
    client_id), or L{authsrv.protocol.errors.InvalidClient}.
    """
    credentials = client_credentials(authorization, params)
    return authenticate(await clients.get_client(credentials.client_id), credentials)


async def token_response(server, authorization: bytes | None, params: dict[str, str], now: int) -> dict:
    """
    The JSON token response to a token request, or an
    L{authsrv.protocol.errors.OAuthError}. The grant type is checked before
    the client, so a request for a grant we never offer says so plainly.
    """
    grant_type = require(params, "grant_type")
    if grant_type not in GRANT_TYPES:
        raise UnsupportedGrantType(f"grant_type must be one of {', '.join(GRANT_TYPES)}")
    client = await authenticate_client(server.clients, authorization, params)
    if grant_type == "authorization_code":
        return await redeem_code(server, client, params, now)
    return await refresh(server, client, params, now)


def _check_code(code: AuthorizationCode, client: Client, redirect_uri: str, verifier: str) -> None:
    if code.client_id != client.client_id:
        raise InvalidGrant("the authorization code was issued to another client")
    if code.redirect_uri != redirect_uri:
        raise InvalidGrant("redirect_uri differs from the one of the authorization request")
    if not pkce.verify(verifier, code.code_challenge):
        raise InvalidGrant("code_verifier does not match the code_challenge of the authorization request")


async def redeem_code(server, client: Client, params: dict[str, str], now: int) -> dict:
    """
    grant_type=authorization_code. The code is consumed before it is checked,
    so that every attempt, failed or not, uses it up; a failed one also
    revokes the grant it would have started, and a second redemption revokes
    whatever the first one issued.
    """
    store = server.store
    value = require(params, "code")
    redirect_uri = require(params, "redirect_uri")
    verifier = require(params, "code_verifier")
    result = await store.consume_code(token_hash(value), now)
    if isinstance(result, CodeReused):
        await store.revoke_grant(result.grant_id, now)
        events.code_reused(client_id=client.client_id, grant_id=result.grant_id)
        raise InvalidGrant("the authorization code was already used; the tokens issued for it are revoked")
    if isinstance(result, CodeNotFound):
        raise InvalidGrant("the authorization code is unknown or expired")
    code = result.code
    try:
        _check_code(code, client, redirect_uri, verifier)
        audience = _audience(params, code.resource)
    except OAuthError:
        await store.revoke_grant(code.grant_id, now)
        raise
    state = await standing(server.identity, store, code.sub, now)
    user = await server.claims_user(await _allowed_user(server, state, code.grant_id, code.sub, client.client_id, now))
    grant = await store.get_grant(code.grant_id)
    if grant is None:
        raise InvalidGrant("the authorization code is unknown or expired")
    issued = mint(
        server, grant, client.client_id, user,
        scope=code.scope,
        audience=audience,
        nonce=code.nonce,
        refresh_scope=code.scope if "offline_access" in code.scope else None,
        now=now,
    )
    await store.issue_tokens(issued.access, issued.refresh)
    _issued_event(issued, client.client_id, "authorization_code")
    return issued.response


async def refresh(server, client: Client, params: dict[str, str], now: int) -> dict:
    """
    grant_type=refresh_token: the user is asked for again and ban-checked,
    then one compare-and-swap in the store decides between a new pair, the
    same pair again (grace window), and reuse (the family is revoked).
    """
    store = server.store
    presented = require(params, "refresh_token")
    old = await store.get_refresh_token(token_hash(presented))
    if old is None or old.client_id != client.client_id or old.revoked or old.expires_at <= now:
        raise InvalidGrant("the refresh token is unknown, expired, revoked or was issued to another client")
    scope = old.scope
    if "scope" in params:
        scope = parse_scope(params["scope"]) or old.scope
        if not scope <= old.scope:
            raise InvalidScope("a refresh may narrow the granted scope but never widen it")
    state = await standing(server.identity, store, old.sub, now, old.user_ban)
    user = await server.claims_user(await _allowed_user(server, state, old.grant_id, old.sub, client.client_id, now))
    grant = await store.get_grant(old.grant_id)
    if grant is None:
        raise InvalidGrant("the refresh token is unknown, expired, revoked or was issued to another client")
    issued = mint(
        server, grant, client.client_id, user,
        scope=scope,
        audience=_audience(params, grant.resource),
        nonce=None,
        refresh_scope=old.scope,
        now=now,
    )
    result = await store.rotate_refresh(
        old.token_hash, issued.refresh, issued.access, seal(issued.response, presented),
        now + server.limits.refresh_grace, now,
    )
    if isinstance(result, Rotated):
        _issued_event(issued, client.client_id, "refresh_token")
        return issued.response
    if isinstance(result, Replayed):
        response = unseal(result.replay, presented)
        if response is not None:
            return response
    elif isinstance(result, Reused):
        events.refresh_reused(client_id=client.client_id, grant_id=result.grant_id)
        raise InvalidGrant("the refresh token was already used; every token of its grant is revoked")
    raise InvalidGrant("the refresh token is unknown, expired, revoked or was issued to another client")


async def _allowed_user(server, state: Standing, grant_id: str, sub: str, client_id: str, now: int) -> User:
    """
    The user, as the identity backend knows them now; a user who is gone,
    disabled or banned ends the grant instead.
    """
    if not state.allowed:
        if await server.store.revoke_grant(grant_id, now):
            events.grant_revoked(sub=sub, client_id=client_id, grant_id=grant_id, reason="user not allowed")
        raise InvalidGrant("the user may no longer use this service")
    return state.user


def _audience(params: dict[str, str], granted: tuple[str, ...]) -> tuple[str, ...]:
    """The access token's audience: what the grant allows, or one of it (RFC 8707 section 2.2)."""
    resource = params.get("resource")
    if resource is None:
        return granted
    if resource not in granted:
        raise InvalidTarget("resource was not granted in the authorization request")
    return (resource,)


@frozen
class Issued:
    """A token response and the records that make its tokens live."""

    response: dict
    access: AccessToken
    refresh: RefreshToken | None


def mint(
    server, grant: Grant, client_id: str, user: User, *,
    scope: frozenset[str], audience: tuple[str, ...], nonce: str | None,
    refresh_scope: frozenset[str] | None, now: int,
) -> Issued:
    """
    New tokens of C{grant}: an opaque access token, or an RFC 9068 JWT when
    it has an C{audience}; a refresh token of C{refresh_scope} unless None
    (its life is the idle time, never past the grant's absolute end); an ID
    token when C{scope} has openid.
    """
    limits = server.limits
    jti = None
    if audience:
        jti = new_token(16)
        claims = access_token_claims(
            issuer=server.issuer, sub=grant.sub, client_id=client_id, audience=audience, scope=scope,
            auth_time=grant.auth_time, jti=jti, now=now, ttl=limits.access_token_ttl,
        )
        access_value = server.keystore.sign(claims, alg=SIGNING_ALG, typ=ACCESS_TOKEN_TYPE)
    else:
        access_value = new_token()
    access = AccessToken(
        token_hash=token_hash(access_value), grant_id=grant.grant_id, client_id=client_id, sub=grant.sub,
        scope=scope, audience=audience, jti=jti, issued_at=now, expires_at=now + limits.access_token_ttl,
    )
    response = {
        "access_token": access_value,
        "token_type": "Bearer",
        "expires_in": limits.access_token_ttl,
        "scope": scope_text(scope),
    }
    refresh_token = None
    if refresh_scope is not None:
        refresh_value = new_token()
        refresh_token = RefreshToken(
            token_hash=token_hash(refresh_value), grant_id=grant.grant_id, client_id=client_id, sub=grant.sub,
            scope=refresh_scope, issued_at=now,
            expires_at=min(now + limits.refresh_token_idle_ttl, grant.expires_at),
        )
        response["refresh_token"] = refresh_value
    if "openid" in scope:
        claims = id_token_claims(
            issuer=server.issuer, client_id=client_id, user=user, scope=scope, auth_time=grant.auth_time,
            sid=grant.sid, nonce=nonce, access_token=access_value, now=now, ttl=limits.id_token_ttl,
            alg=SIGNING_ALG,
        )
        response["id_token"] = server.keystore.sign(claims, alg=SIGNING_ALG, typ=ID_TOKEN_TYPE)
    return Issued(response, access, refresh_token)


def _issued_event(issued: Issued, client_id: str, grant_type: str) -> None:
    events.token_issued(
        sub=issued.access.sub, client_id=client_id, grant_id=issued.access.grant_id, grant_type=grant_type,
        token_fp=fingerprint(issued.response["access_token"]),
    )
