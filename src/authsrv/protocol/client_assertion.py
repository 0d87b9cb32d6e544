"""
private_key_jwt and client_secret_jwt client authentication (RFC 7523
sections 2.2 and 3, OIDC Core section 9): the client signs a short-lived JWT
with a key it registered, or keys an HMAC with its secret. Pure: the caller
supplies the client's key set and records the jti, so that an assertion
authenticates once (a replay is invalid_client).

Every failure is the same L{InvalidClient} with a message that says what
to fix; the signature is checked before any claim is believed.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import TypeGuard

from jwcrypto.common import JWException, base64url_decode, base64url_encode
from jwcrypto.jwk import JWK, JWKSet
from jwcrypto.jws import JWS

from authsrv.protocol import jsontext
from authsrv.protocol.errors import InvalidClient, InvalidRequest

ASSERTION_ALGS = ("RS256", "PS256", "ES256", "EdDSA")
"""What a private_key_jwt assertion may be signed with; never none or HMAC."""
HMAC_BITS = {"HS256": 256, "HS384": 384, "HS512": 512}
"""
What a client_secret_jwt assertion may be keyed with, and the fewest bits of
secret each takes (RFC 7518 section 3.2: at least the hash's size).
"""
HMAC_ALGS = tuple(HMAC_BITS)
MAX_LIFETIME = 3600
"""
An assertion may expire at most this many seconds after now: it is a
one-time proof, not a credential, and its jti is kept in the store until
then. An hour is what client libraries (Authlib) default to.
"""
CLOCK_SKEW = 30
MAX_KEYS_TRIED = 4
"""
The most keys one assertion's signature is checked with: a key set with
more for its algorithm (and its kid, if it names one) refuses it, or one
forged assertion would cost a verify per key (500 Ed25519 keys fit in a
64 KiB key set: 50 ms).
"""
KEYSETS_KEPT = 128
"""Parsed client key sets kept (L{public_keyset}): each at most a fetched document's size."""
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
MAX_ASSERTION = 8192
_JWK_FIELDS_PRIVATE = ("d", "p", "q", "dp", "dq", "qi", "k")
PUBLIC_KEY_TYPES = ("RSA", "EC", "OKP")
"""The key types a client's public key may have; jwcrypto makes an unusable key of a JWK without kty."""
MIN_RSA_BITS, MAX_RSA_BITS = 2048, 8192
"""
The RSA moduli a client's or a DPoP proof's key may have: shorter ones are
factored; longer ones, or an exponent over L{MAX_RSA_EXPONENT}, make every
signature check cost ten to twenty times a usual one, for anyone who can
send a proof.
"""
MAX_RSA_EXPONENT = 2**32


def rsa_key_problem(key: JWK) -> str | None:
    """
    What makes an RSA C{key} of a client or a DPoP proof unfit, or None: a
    modulus outside L{MIN_RSA_BITS} to L{MAX_RSA_BITS}, an exponent over
    L{MAX_RSA_EXPONENT}. ValueError when jwcrypto cannot make it a key.
    """
    try:
        public = key.get_op_key("verify")
        bits, exponent = public.key_size, public.public_numbers().e
    except (JWException, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"not a valid RSA key ({e})") from None
    if exponent > MAX_RSA_EXPONENT:
        return (f"an RSA key with a {exponent.bit_length()}-bit exponent:"
                " its exponent must be at most 2**32 (65537 is usual)")
    if not MIN_RSA_BITS <= bits <= MAX_RSA_BITS:
        return f"an RSA key of {bits} bits: an RSA key has {MIN_RSA_BITS} to {MAX_RSA_BITS} bits"
    return None


def _failed(why: str) -> InvalidClient:
    return InvalidClient(f"client authentication failed: {why}")


def is_numeric_date(value: object) -> TypeGuard[int | float]:
    """
    Whether C{value} is a NumericDate (RFC 7519 section 2): a JSON number of
    seconds, which may have a fraction (a client library that writes
    C{time.time() + 60} sends one); never a boolean.
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def unverified_client_id(assertion: str) -> str:
    """
    The client an assertion claims to come from (its C{iss}), read before
    the signature is checked only to find that client's keys.
    """
    if len(assertion) > MAX_ASSERTION or not _COMPACT_JWS.fullmatch(assertion):
        raise _failed("client_assertion is not a compact signed JWT")
    token = JWS()
    try:
        token.deserialize(assertion)
        claims = jsontext.loads(token.objects["payload"])
    except (JWException, ValueError, KeyError):
        raise _failed("client_assertion is not a compact signed JWT") from None
    issuer = claims.get("iss") if isinstance(claims, dict) else None
    if not isinstance(issuer, str) or not issuer:
        raise _failed("client_assertion has no iss naming the client")
    return issuer


def _parsed(assertion: str) -> tuple[JWS, dict]:
    """
    The assertion as a JWS, not yet verified, and its protected header;
    jwcrypto raises TypeError, not its own error, for a C{crit} that is no
    array of header names (RFC 7515 section 4.1.11).
    """
    token = JWS()
    try:
        token.deserialize(assertion)
        return token, token.jose_header
    except (JWException, ValueError, TypeError):
        raise _failed("client_assertion is not a compact signed JWT") from None


def assertion_kid(assertion: str) -> str | None:
    """The C{kid} of an assertion's header, if any (to tell an unknown key from a bad signature)."""
    try:
        kid = _parsed(assertion)[1].get("kid")
    except InvalidClient:
        return None
    return kid if isinstance(kid, str) else None


def verified_claims(
    assertion: str, client_id: str, keyset: JWKSet, audiences: tuple[str, ...], now: int,
    algorithms: tuple[str, ...] = ASSERTION_ALGS, issuer_only: bool = False,
) -> dict:
    """
    The claims of an assertion signed by a key of C{keyset} with one of
    C{algorithms}, from C{client_id} (iss = sub), for one of C{audiences}
    (with C{issuer_only}, for the first, the issuer, as one string),
    unexpired and expiring within L{MAX_LIFETIME}, with a jti.
    """
    token, header = _parsed(assertion)
    token.allowed_algs = list(algorithms)
    alg = header.get("alg")
    if alg not in algorithms:
        raise _failed(f"client_assertion is signed with {alg!r}; use one of {', '.join(algorithms)}")
    if alg in HMAC_BITS and not any(len(base64url_decode(key.get("k", ""))) * 8 >= HMAC_BITS[alg] for key in keyset):
        shorter = "use HS256" if alg != "HS256" else "the client needs a longer secret"
        raise _failed(f"{alg} needs a client secret of at least {HMAC_BITS[alg] // 8} bytes (RFC 7518 section 3.2);"
                      f" this client's is shorter: {shorter}")
    try:
        token.verify(_keys_for(keyset, alg, kid if isinstance(kid := header.get("kid"), str) else None))
    except (JWException, ValueError):
        raise _failed("the client_assertion signature does not verify with any of the client's keys") from None
    try:
        claims = jsontext.loads(token.payload)
    except jsontext.NotJSONText as e:
        raise _failed(f"client_assertion's payload cannot be read: {e}") from None
    if not isinstance(claims, dict):
        raise _failed("client_assertion's payload is not a JSON object")
    if claims.get("iss") != client_id or claims.get("sub") != client_id:
        raise _failed("client_assertion's iss and sub must both be the client_id")
    aud = claims.get("aud")
    if issuer_only and aud != audiences[0]:
        raise _failed(f"client_assertion's aud must be {audiences[0]!r} (the issuer), as one string:"
                      " this client's profile allows no other audience (FAPI 2.0 section 5.3.2.1)")
    named = aud if isinstance(aud, list) else [aud]
    if not any(isinstance(a, str) and a in audiences for a in named):
        raise _failed(f"client_assertion's aud must be {audiences[0]!r} (the issuer)"
                      + "".join(f" or {other!r}" for other in audiences[1:]))
    exp = claims.get("exp")
    if not is_numeric_date(exp):
        raise _failed("client_assertion has no exp (a NumericDate: seconds since 1970)")
    if exp <= now - CLOCK_SKEW:
        raise _failed("client_assertion has expired")
    if exp > now + MAX_LIFETIME + CLOCK_SKEW:
        raise _failed(f"client_assertion must expire within {MAX_LIFETIME} seconds")
    for name in ("nbf", "iat"):
        value = claims.get(name)
        if value is not None and not is_numeric_date(value):
            raise _failed(f"client_assertion's {name} is not a NumericDate (seconds since 1970)")
        if value is not None and value > now + CLOCK_SKEW:
            raise _failed(f"client_assertion's {name} is in the future")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not jti or len(jti) > 256 or "\x00" in jti:
        # The jti is kept as it came until the assertion expires; PostgreSQL text cannot hold a NUL.
        raise _failed("client_assertion needs a jti of 1 to 256 characters, without NUL")
    return claims


def _keys_for(keyset: JWKSet, alg: str, kid: str | None) -> JWKSet:
    """
    The keys of C{keyset} that may verify C{alg}: those registered for it or
    for no algorithm in particular (RFC 7517 section 4.4; RFC 8725 section
    3.1: a key serves one algorithm), or L{_failed} when there are none, or
    when more than L{MAX_KEYS_TRIED} of them (those named C{kid}, if it is
    given and names any) would each be tried.
    """
    usable = [key for key in keyset["keys"] if key.get("alg", alg) == alg]
    if not usable:
        registered = ", ".join(sorted({str(key.get("alg")) for key in keyset["keys"]}))
        raise _failed(f"the client's keys are registered for {registered}, not {alg}")
    named = [key for key in usable if key.get("kid") == kid]
    tried = named or usable
    if len(tried) > MAX_KEYS_TRIED:
        raise _failed(f"the client has {len(tried)} keys that may verify this {alg} assertion, and at most"
                      f" {MAX_KEYS_TRIED} are tried: name the signing key by a kid that no other key has")
    chosen = JWKSet()
    for key in tried:
        chosen.add(key)
    return chosen


def assertion_params(params: dict[str, str]) -> str | None:
    """The assertion a request carries, or None; L{InvalidRequest} for a wrong assertion type."""
    if "client_assertion" not in params and "client_assertion_type" not in params:
        return None
    if params.get("client_assertion_type") != ASSERTION_TYPE:
        raise InvalidRequest(f"client_assertion_type must be {ASSERTION_TYPE}")
    assertion = params.get("client_assertion")
    if not assertion:
        raise InvalidRequest("client_assertion is missing")
    if "client_secret" in params:
        raise InvalidRequest("use one client authentication method, not client_assertion and client_secret both")
    return assertion


def secret_keyset(secrets: tuple[str, ...]) -> JWKSet:
    """The client's secrets as HMAC keys (RFC 7518 section 3.2: the secret's UTF-8 octets are the key)."""
    keyset = JWKSet()
    for secret in secrets:
        keyset.add(JWK(kty="oct", k=base64url_encode(secret.encode("utf-8"))))
    return keyset


def public_keyset(document: str | dict) -> JWKSet:
    """
    A client's JWK set (JSON text, or a fetched document); ValueError saying
    what is wrong when it is no key set, is empty, or holds a private or
    symmetric key. Made once per distinct text (L{_parsed_keyset}) and
    shared, never changed: making the keys costs more than a whole token
    request besides, and a private_key_jwt client presents the same set on
    every one.
    """
    return _parsed_keyset(document if isinstance(document, str) else json.dumps(document))


@lru_cache(maxsize=KEYSETS_KEPT)
def _parsed_keyset(text: str) -> JWKSet:
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError("jwks is not JSON") from None
    keys = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(keys, list) or not keys:
        raise ValueError('jwks must be a JWK set: {"keys": [...]} with at least one key')
    for key in keys:
        if not isinstance(key, dict) or key.get("kty") not in PUBLIC_KEY_TYPES:
            raise ValueError("jwks keys must be public RSA, EC or OKP keys")
        if any(name in key for name in _JWK_FIELDS_PRIVATE):
            raise ValueError("jwks holds a private key: register only the public half")
    try:
        keyset = JWKSet.from_json(text)
        problems = [problem for key in keyset["keys"] if key.get("kty") == "RSA" and (problem := rsa_key_problem(key))]
    except (JWException, ValueError, TypeError) as e:
        raise ValueError(f"jwks is not a valid JWK set ({e})") from None
    if problems:
        raise ValueError(f"jwks holds {problems[0]}")
    return keyset
