"""
DPoP proofs (RFC 9449 section 4.3): the checks of one proof JWT against
the request it came with, the key thumbprint a token is bound to (RFC
7638), stateless server nonces (section 8), and whether a client's settings
need DPoP offered. Replay of a proof's jti is the caller's to refuse,
through the store, so every instance agrees.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
from urllib.parse import urlsplit, urlunsplit

from attrs import frozen
from jwcrypto.common import JWException
from jwcrypto.jwk import JWK
from jwcrypto.jws import JWS

from authsrv.protocol import jsontext
from authsrv.protocol.client_assertion import PUBLIC_KEY_TYPES, rsa_key_problem
from authsrv.protocol.errors import InvalidDpopProof, UseDpopNonce
from authsrv.records import Client

PROOF_TYPE = "dpop+jwt"
ALGORITHMS = ("ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "RS256", "EdDSA")
"""Asymmetric only: a proof signed with a shared secret proves nothing about a client's key."""
MAX_PROOF_BYTES = 8192
MAX_JTI_CHARS = 256
_COMPACT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_THUMBPRINT = re.compile(r"[A-Za-z0-9_-]{43}")
_DEFAULT_PORTS = {"http": 80, "https": 443}
UNOFFERED = "needs DPoP offered: set [dpop] enabled = true"


@frozen
class DpopPolicy:
    """
    How old (C{max_age}) or how far ahead (C{leeway}) a proof's iat may be,
    in seconds; whether a server nonce is demanded, and how long one lives
    (C{nonce_lifetime}: a nonce of the current or the previous window counts).
    """

    max_age: int = 60
    leeway: int = 5
    use_nonce: bool = False
    nonce_lifetime: int = 300


@frozen
class Proof:
    """A proof that passed every check but replay: C{jkt} its key's thumbprint, C{replay_key} what single use is kept by."""

    jkt: str
    replay_key: str
    expires_at: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def access_token_hash(access_token: str) -> str:
    """The C{ath} claim for an access token (RFC 9449 section 4.2)."""
    return _b64(hashlib.sha256(access_token.encode()).digest())


def is_thumbprint(value: str) -> bool:
    """Whether C{value} has the shape of a base64url SHA-256 JWK thumbprint (a C{dpop_jkt})."""
    return _THUMBPRINT.fullmatch(value) is not None


def unoffered_dpop(client: Client, offered: bool) -> tuple[str, str] | None:
    """
    (setting, problem) when the client must send DPoP proofs (its own
    setting, or the profile that demands it) on a server that does not
    offer DPoP, so none of its token requests could succeed; else None.
    """
    if offered or not client.dpop_bound_access_tokens:
        return None
    return "dpop_bound_access_tokens", UNOFFERED


def normalise_url(url: str) -> str:
    """
    A URL as RFC 9449 section 4.3 compares C{htu}: scheme and host in lower
    case, the default port dropped, no query and no fragment (RFC 3986
    section 6.2). L{ValueError} when it is no absolute http(s) URL.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError("not an absolute http(s) URL")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", "", ""))


def nonce_for(secret: bytes, now: int, window: int, back: int = 0) -> str:
    """
    The server nonce of the window C{now} falls in (C{back} windows
    earlier): derived from the shared server secret and the time alone, so
    every instance of a fleet issues and accepts the same nonces.
    """
    index = now // window - back
    return _b64(hmac.new(secret, f"dpop-nonce:{index}".encode(), hashlib.sha256).digest()[:24])


def _same(sent: str, expected: str) -> bool:
    """
    Constant-time equality of a claim and the value it must have; as bytes,
    since C{hmac.compare_digest} raises TypeError for text that is not ASCII.
    """
    return hmac.compare_digest(sent.encode(), expected.encode())


def _nonce_ok(value, secret: bytes, now: int, window: int) -> bool:
    return isinstance(value, str) and any(_same(value, nonce_for(secret, now, window, back)) for back in (0, 1))


def _is_proof_type(typ) -> bool:
    """
    Whether C{typ} names the media type application/dpop+jwt: RFC 7515
    section 4.1.9 compares media types without regard to case and reads a
    typ without "/" as under "application/".
    """
    return isinstance(typ, str) and typ.lower() in (PROOF_TYPE, f"application/{PROOF_TYPE}")


def _header_and_key(compact: str) -> tuple[JWS, dict, JWK]:
    jws = JWS()
    try:
        jws.deserialize(compact)
        header = jws.jose_header
    except (JWException, ValueError, TypeError):
        raise InvalidDpopProof("the DPoP header is not a JWS in compact serialisation") from None
    if not isinstance(header, dict) or not _is_proof_type(header.get("typ")):
        raise InvalidDpopProof(f"a DPoP proof must have typ {PROOF_TYPE}")
    if header.get("alg") not in ALGORITHMS:
        raise InvalidDpopProof(f"a DPoP proof must be signed with one of {', '.join(ALGORITHMS)}")
    jwk = header.get("jwk")
    if not isinstance(jwk, dict):
        raise InvalidDpopProof("a DPoP proof must carry the public key as jwk in its header")
    if jwk.get("kty") not in PUBLIC_KEY_TYPES:
        raise InvalidDpopProof("the jwk of a DPoP proof must be a public key (kty RSA, EC or OKP)")
    try:
        key = JWK(**jwk)
    except (JWException, ValueError, TypeError, KeyError):
        raise InvalidDpopProof("the jwk of the DPoP proof is not a valid key") from None
    if key.has_private:
        raise InvalidDpopProof("the jwk of a DPoP proof must be a public key, never a private or symmetric one")
    if jwk["kty"] == "RSA" and (problem := _rsa_problem(key)):
        raise InvalidDpopProof(f"the jwk of the DPoP proof is {problem}")
    return jws, header, key


def _rsa_problem(key: JWK) -> str | None:
    try:
        return rsa_key_problem(key)
    except ValueError:
        raise InvalidDpopProof("the jwk of the DPoP proof is not a valid key") from None


def check_proof(
    compact: str, *, method: str, url: str, now: int, policy: DpopPolicy,
    nonce_secret: bytes | None = None, access_token: str | None = None,
) -> Proof:
    """
    The checks of RFC 9449 section 4.3 but jti replay: C{url} is the
    endpoint's public URL (from the configured issuer, never from request
    headers), C{access_token} the token presented with the proof at a
    resource (its hash must be the proof's C{ath}). C{nonce_secret} is
    needed when the policy uses nonces. Raises L{InvalidDpopProof} or
    L{UseDpopNonce}.
    """
    if len(compact) > MAX_PROOF_BYTES or not _COMPACT.fullmatch(compact):
        raise InvalidDpopProof("the DPoP header must hold one proof JWT in compact serialisation")
    jws, header, key = _header_and_key(compact)
    try:
        jws.verify(key, alg=header["alg"])
    except (JWException, ValueError, TypeError):
        raise InvalidDpopProof("the signature of the DPoP proof does not verify with its jwk") from None
    try:
        claims = jsontext.loads(jws.payload)
    except jsontext.NotJSONText as e:
        raise InvalidDpopProof(f"the payload of the DPoP proof cannot be read: {e}") from None
    if not isinstance(claims, dict):
        raise InvalidDpopProof("the payload of a DPoP proof must be a JSON object")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not 0 < len(jti) <= MAX_JTI_CHARS:
        raise InvalidDpopProof(f"a DPoP proof needs a jti of 1 to {MAX_JTI_CHARS} characters")
    if claims.get("htm") != method:
        raise InvalidDpopProof(f"the DPoP proof's htm must be {method}, the method of this request")
    htu = claims.get("htu")
    try:
        matches = isinstance(htu, str) and normalise_url(htu) == normalise_url(url)
    except ValueError:
        matches = False
    if not matches:
        raise InvalidDpopProof(f"the DPoP proof's htu must be {url}, the URL of this endpoint")
    iat = claims.get("iat")
    if isinstance(iat, bool) or not isinstance(iat, (int, float)):
        raise InvalidDpopProof("a DPoP proof needs iat, a number of seconds since 1970 (RFC 7519 NumericDate)")
    if not now - policy.max_age <= iat <= now + policy.leeway:
        raise InvalidDpopProof("the DPoP proof's iat is too far from the server's time; make a new proof")
    if access_token is not None:
        ath = claims.get("ath")
        if not isinstance(ath, str) or not _same(ath, access_token_hash(access_token)):
            raise InvalidDpopProof("the DPoP proof's ath must be the hash of the access token sent with it")
    if policy.use_nonce:
        assert nonce_secret is not None
        if not _nonce_ok(claims.get("nonce"), nonce_secret, now, policy.nonce_lifetime):
            raise UseDpopNonce(
                "the DPoP proof must carry the nonce from the DPoP-Nonce header",
                nonce_for(nonce_secret, now, policy.nonce_lifetime),
            )
    jkt = key.thumbprint()
    replay_key = hashlib.sha256(f"{jkt}\0{jti}".encode()).hexdigest()
    return Proof(jkt=jkt, replay_key=replay_key, expires_at=math.ceil(iat) + policy.max_age + 1)
