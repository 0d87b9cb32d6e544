"""
Codes and token requests for the token, UserInfo, introspection and
revocation tests: a code saved exactly as the authorize flow saves it, and
the relying party's side of the token endpoint.
"""

from __future__ import annotations

import base64
import hmac
import json
import uuid

from jwcrypto import jwt
from jwcrypto.common import base64url_encode

from authsrv.records import AuthorizationCode, Grant
from authsrv.testing.identity import ALICE
from authsrv.tokens import new_token, token_hash
from harness import CLIENTS, ISSUER, SECRETS, pkce_pair

TOKEN = "/api/auth/oauth2/token"
USERINFO = "/api/auth/oauth2/userinfo"
INTROSPECT = "/api/auth/oauth2/introspect"
REVOKE = "/api/auth/oauth2/revoke"
FULL_SCOPE = "openid profile email offline_access"
API = "https://api.example.test"


def redirect_uri_of(client_id: str) -> str:
    return next(c["redirect_uris"][0] for c in CLIENTS if c["client_id"] == client_id)


async def save_code(
    h, client_id: str = "first", sub: str = ALICE.sub, scope: str = FULL_SCOPE, nonce: str | None = "n-0S6_WzA2Mj",
    resource: tuple[str, ...] = (), sid: str | None = "sid-1", auth_time: int | None = None,
    dpop_jkt: str | None = None,
) -> tuple[str, str]:
    """A fresh code as the authorize flow stores it; returns (code, PKCE verifier)."""
    now = h.now()
    verifier, challenge = pkce_pair()
    code = new_token()
    grant = Grant(
        grant_id=new_token(16), client_id=client_id, sub=sub, scope=frozenset(scope.split()),
        resource=resource, auth_time=now - 5 if auth_time is None else auth_time, sid=sid, created_at=now,
        expires_at=now + h.config.limits.refresh_token_absolute_ttl,
    )
    await h.store.save_code(
        AuthorizationCode(
            code_hash=token_hash(code), grant_id=grant.grant_id, client_id=client_id, sub=sub,
            redirect_uri=redirect_uri_of(client_id), scope=grant.scope, code_challenge=challenge,
            code_challenge_method="S256", nonce=nonce, resource=resource, auth_time=grant.auth_time, sid=sid,
            issued_at=now, expires_at=now + h.config.limits.code_ttl, dpop_jkt=dpop_jkt,
        ),
        grant,
    )
    return code, verifier


def hmac_assertion(secret: str, client_id: str, audience: str, now: int, *, alg: str = "HS256", **claims) -> str:
    """
    A client_secret_jwt assertion (RFC 7523) keyed with C{secret}, signed
    with hmac itself as a lax client library would, whatever the secret's
    length, so the server's own checks are what refuse it. C{claims}
    override the usual ones; a claim given as None is left out. alg none
    gives an unsigned JWT.
    """
    body = {"iss": client_id, "sub": client_id, "aud": audience, "iat": now, "exp": now + 60,
            "jti": uuid.uuid4().hex, **claims}
    body = {name: value for name, value in body.items() if value is not None}
    signing_input = f"{base64url_encode(json.dumps({'alg': alg}))}.{base64url_encode(json.dumps(body))}"
    if alg == "none":
        return signing_input + "."
    digest = hmac.new(secret.encode(), signing_input.encode(), "sha" + alg[2:]).digest()
    return f"{signing_input}.{base64url_encode(digest)}"


def basic(client_id: str, secret: str) -> dict:
    raw = base64.b64encode(f"{client_id}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def client_auth(client_id: str, method: str = "post") -> tuple[dict, dict]:
    """(form fields, headers) authenticating C{client_id} the way C{method} says."""
    if client_id not in SECRETS or method == "none":
        return {"client_id": client_id}, {}
    if method == "basic":
        return {}, basic(client_id, SECRETS[client_id])
    return {"client_id": client_id, "client_secret": SECRETS[client_id]}, {}


async def post_form(h, path: str, data: dict, client_id: str | None = "first", method: str = "post",
                    headers: dict | None = None):
    """POST a form as a relying party; (response, parsed JSON body or None)."""
    fields, auth_headers = client_auth(client_id, method) if client_id else ({}, {})
    return await h.json("POST", path, data={**fields, **data}, headers={**auth_headers, **(headers or {})})


async def exchange(h, code: str, verifier: str, client_id: str = "first", method: str = "post",
                   headers: dict | None = None, **extra):
    data = {
        "grant_type": "authorization_code", "code": code, "code_verifier": verifier,
        "redirect_uri": redirect_uri_of(client_id), **extra,
    }
    return await post_form(h, TOKEN, data, client_id, method, headers)


async def tokens(h, client_id: str = "first", **code_options) -> dict:
    """A successful code exchange's token response."""
    code, verifier = await save_code(h, client_id, **code_options)
    response, body = await exchange(h, code, verifier, client_id)
    assert response.code == 200, body
    return body


async def refresh(h, refresh_token: str, client_id: str = "first", headers: dict | None = None, **extra):
    return await post_form(h, TOKEN, {"grant_type": "refresh_token", "refresh_token": refresh_token, **extra},
                           client_id, headers=headers)


async def introspect(h, token: str, client_id: str = "gateway", **extra) -> dict:
    response, body = await post_form(h, INTROSPECT, {"token": token, **extra}, client_id)
    assert response.code == 200, body
    return body


async def active(h, token: str, client_id: str = "first") -> bool:
    """
    Whether the token is active, asked by the client it was issued to (the
    resource server sees access tokens only, never others' refresh tokens).
    """
    return (await introspect(h, token, client_id))["active"]


def verify_jwt(h, token: str, typ: str = "JWT", **check_claims) -> tuple[dict, dict]:
    """(header, claims) of a JWT signed by the harness's keystore, checked as a relying party would."""
    checked = jwt.JWT(
        jwt=token, key=h.keystore.public_keyset(), expected_type="JWS",
        check_claims={"iss": ISSUER, "exp": h.now(), **check_claims},
    )
    header = json.loads(checked.header)
    assert header["typ"] == typ and header["alg"] == "RS256"
    return header, json.loads(checked.claims)


def header(response, name: str) -> list[str] | None:
    return response.headers.getRawHeaders(name)


class SignedAfterSending:
    """
    The order in which C{store}'s C{writes} were sent and C{keystore}
    signed: a write sent before a signature is one the signature goes on
    beside (a fast PostgreSQL on a spare core may even have answered it).
    """

    def __init__(self, monkeypatch, store, keystore, writes):
        self.order: list[str] = []
        for name in writes:
            monkeypatch.setattr(store, name, self._noted(name, getattr(store, name)))
        monkeypatch.setattr(keystore, "sign", self._noted("sign", keystore.sign))

    def _noted(self, name, call):
        def noted(*args, **kwargs):
            self.order.append(name)
            return call(*args, **kwargs)

        return noted

    def since_last(self) -> list[str]:
        order, self.order = self.order, []
        return order
