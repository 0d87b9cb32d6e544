"""
DPoP proofs as a client makes them (RFC 9449 section 4.2), with jwcrypto,
for the tests that play a DPoP client or an attacker on one.
"""

from __future__ import annotations

from jwcrypto import jwk, jwt

from authsrv.protocol.dpop import access_token_hash
from authsrv.tokens import new_token


def ec_key() -> jwk.JWK:
    return jwk.JWK.generate(kty="EC", crv="P-256")


def proof(key: jwk.JWK, method: str, url: str, iat: float, *, access_token: str | None = None,
          nonce: str | None = None, alg: str = "ES256", typ: str = "dpop+jwt", public: dict | None = None,
          jti: str | None = None, extra: dict | None = None) -> str:
    """A proof signed by C{key}; C{public} replaces the jwk its header carries, C{extra} adds or replaces claims."""
    claims = {"jti": jti or new_token(12), "htm": method, "htu": url, "iat": iat, **(extra or {})}
    if access_token is not None:
        claims["ath"] = access_token_hash(access_token)
    if nonce is not None:
        claims["nonce"] = nonce
    jwk_header = public if public is not None else key.export_public(as_dict=True)
    token = jwt.JWT(header={"typ": typ, "alg": alg, "jwk": jwk_header}, claims=claims)
    token.make_signed_token(key)
    return token.serialize()
