"""
Client authentication at the token, introspection and revocation endpoints:
client_secret_basic and client_secret_post (RFC 6749 section 2.3.1), and
public clients identified by client_id alone (they prove possession with
PKCE instead). Secrets are compared by their stored hash, keyed with the
server key (or a legacy plain SHA-256), in constant time; after a rotation
the previous secret is accepted too, until its overlap ends.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote_plus

from attrs import frozen

from authsrv.protocol.client_assertion import public_keyset
from authsrv.protocol.errors import InvalidClient, InvalidRequest, InvalidScope
from authsrv.protocol.scope import parse_scope
from authsrv.records import Client
from authsrv.tokens import secret_matches


PRIVATE_KEY_JWT = "private_key_jwt"
CLIENT_SECRET_JWT = "client_secret_jwt"
ASSERTION_METHODS = (PRIVATE_KEY_JWT, CLIENT_SECRET_JWT)
"""The methods that authenticate with a client assertion (RFC 7523) instead of presenting a secret."""
SECRET_METHODS = ("client_secret_basic", "client_secret_post")
AUTH_METHODS = (*SECRET_METHODS, PRIVATE_KEY_JWT, CLIENT_SECRET_JWT, "none")
"""The C{token_endpoint_auth_method} values a client may be registered with."""


@frozen
class ClientCredentials:
    client_id: str
    secret: str | None
    method: str


def client_credentials(authorization: bytes | None, params: dict[str, str]) -> ClientCredentials:
    """
    What the client presented; raises L{InvalidClient} when it presented
    nothing usable and L{InvalidRequest} when it mixed two methods. An
    assertion (RFC 7523) is checked by L{authsrv.protocol.client_assertion}.
    """
    if authorization and authorization[:6].lower() == b"basic ":
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
            raw_id, raw_secret = decoded.split(":", 1)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise InvalidClient("the Basic authorization header is malformed") from None
        client_id, secret = unquote_plus(raw_id), unquote_plus(raw_secret)
        if "client_secret" in params:
            raise InvalidRequest("use one client authentication method, not Basic and client_secret both")
        if params.get("client_id", client_id) != client_id:
            raise InvalidRequest("client_id differs from the one in the Authorization header")
        if not client_id:
            raise InvalidClient("the Basic authorization header names no client")
        return ClientCredentials(client_id, secret, "client_secret_basic")
    posted_id = params.get("client_id")
    if not posted_id:
        raise InvalidClient("client authentication is required: send client_id (and client_secret)")
    posted_secret = params.get("client_secret")
    return ClientCredentials(posted_id, posted_secret, "client_secret_post" if posted_secret is not None else "none")


def _secret_matches(client: Client, secret: str, key: bytes, now: int) -> bool:
    """
    Whether C{secret} is the client's current secret or, before
    C{previous_secret_until}, its previous one. Both comparisons always run,
    so the time taken says nothing of which matched or whether a previous
    secret exists.
    """
    previous_hash = client.previous_secret_hash or client.secret_hash or ""
    current, previous = secret_matches(secret, (client.secret_hash or "", previous_hash), key)
    in_overlap = client.previous_secret_hash is not None and (client.previous_secret_until or 0) > now
    return current | (previous & in_overlap)


def authenticate(client: Client | None, credentials: ClientCredentials, key: bytes, now: int) -> Client:
    """
    The authenticated client, or L{InvalidClient} (one message for every
    failure); C{key} is the server key client secret hashes are keyed with,
    C{now} decides whether a rotated-out secret still works.
    """
    if client is None:
        raise InvalidClient("client authentication failed")
    if client.token_endpoint_auth_method in ASSERTION_METHODS:
        raise InvalidClient(
            f"client authentication failed: this client authenticates with a {client.token_endpoint_auth_method}"
            " assertion"
        )
    if client.is_public:
        if credentials.secret is not None:
            raise InvalidClient("client authentication failed: a public client has no secret")
        return client
    if credentials.secret is None or not _secret_matches(client, credentials.secret, key, now):
        raise InvalidClient("client authentication failed")
    return client


def auth_settings_problem(client: Client) -> tuple[str, str] | None:
    """
    What is inconsistent in how C{client} authenticates and what it may
    do, as (field, problem), or None: the same rules for the config file,
    the admin API and the operator command. A C{jwks_uri} is checked
    against the fetch policy by the caller.
    """
    method = client.token_endpoint_auth_method
    if method is not None and method not in AUTH_METHODS:
        return "token_endpoint_auth_method", f"{method!r} is not offered; use one of {', '.join(AUTH_METHODS)}"
    if method == PRIVATE_KEY_JWT:
        if client.secret_hash is not None:
            return "token_endpoint_auth_method", "a private_key_jwt client has no secret; register it without one"
        if (client.jwks is None) == (client.jwks_uri is None):
            return "jwks", "private_key_jwt needs exactly one of jwks and jwks_uri"
        if client.jwks is not None:
            try:
                public_keyset(client.jwks)
            except ValueError as e:
                return "jwks", str(e)
    elif client.jwks is not None or client.jwks_uri is not None:
        return "jwks" if client.jwks is not None else "jwks_uri", "only a private_key_jwt client registers keys"
    if method in (*SECRET_METHODS, CLIENT_SECRET_JWT) and client.secret_hash is None:
        return "token_endpoint_auth_method", f"{method} needs a client secret"
    if method == CLIENT_SECRET_JWT and client.sealed_secret is None:
        return "token_endpoint_auth_method", (
            "client_secret_jwt needs the secret kept sealed on the server: set [client_secrets]"
            " encryption_key_env or encryption_key_file, and give the client this method when it is made"
        )
    if method == "none" and client.secret_hash is not None:
        return "token_endpoint_auth_method", "none is for public clients, which have no secret"
    if "client_credentials" in client.grant_types and client.is_public:
        return "grant_types", "client_credentials is for confidential clients (a secret or private_key_jwt)"
    if "authorization_code" in client.grant_types and not client.redirect_uris:
        return "redirect_uris", "must name at least one URI (only a client_credentials client needs none)"
    for scope in client.scopes:
        try:
            if len(parse_scope(scope)) != 1:
                raise InvalidScope("one token")
        except InvalidScope:
            return "scopes", f"{scope!r} is not a scope token (printable ASCII, no space, quote or backslash)"
    return None
