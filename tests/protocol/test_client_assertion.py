"""
The checks of a client_secret_jwt assertion (RFC 7523 section 3, OIDC Core
section 9), as plain functions: what L{verified_claims} refuses and why,
the assertion's shape before its client is known, and, through
L{AssertionChecker} over an in-memory jti record, the single use, the sealed
secret and the client's own method.
"""

from __future__ import annotations

import base64

import pytest
from jwcrypto import jwk, jwt

from authsrv.client_secrets import SecretKeeper
from authsrv.flows.clients import AssertionChecker
from authsrv.protocol.client_assertion import (
    CLOCK_SKEW, HMAC_ALGS, MAX_LIFETIME, public_keyset, secret_keyset, unverified_client_id, verified_claims,
)
from authsrv.protocol.errors import InvalidClient
from authsrv.records import Client
from authsrv.sealing import key_from_text, new_key_text
from authsrv.tokens import token_hash

from token_helpers import hmac_assertion

ISSUER = "https://id.example/api/auth"
TOKEN_URL = ISSUER + "/oauth2/token"
AUDIENCES = (ISSUER, TOKEN_URL)
NOW = 1_800_000_000
SECRET = "s" * 64
"""64 bytes: enough for HS512."""
SHORT = "t" * 40
"""Enough for HS256 only."""


def check(assertion: str, secrets: tuple[str, ...] = (SECRET,), client_id: str = "job") -> dict:
    return verified_claims(assertion, client_id, secret_keyset(secrets), AUDIENCES, NOW, HMAC_ALGS)


def signed(secret: str = SECRET, **claims) -> str:
    return hmac_assertion(secret, "job", ISSUER, NOW, **claims)


def refused(assertion: str, words: str, **options) -> None:
    with pytest.raises(InvalidClient) as caught:
        check(assertion, **options)
    assert caught.value.description.startswith("client authentication failed: ")
    assert words in caught.value.description, caught.value.description


@pytest.mark.parametrize("alg", HMAC_ALGS)
def test_each_hmac_algorithm_verifies_with_a_long_enough_secret(alg):
    claims = check(signed(alg=alg, jti="one"))
    assert (claims["iss"], claims["sub"], claims["jti"]) == ("job", "job", "one")


@pytest.mark.parametrize("aud", [ISSUER, TOKEN_URL, [ISSUER, "https://elsewhere.example"]])
def test_the_issuer_or_the_token_endpoint_is_the_audience(aud):
    assert check(signed(aud=aud))["aud"] == aud


def test_any_of_the_secrets_verifies():
    """During a rotation's overlap the previous secret is a key too."""
    assert check(signed("previous-" + SECRET), secrets=(SECRET, "previous-" + SECRET))


def test_times_are_numeric_dates_which_may_have_a_fraction():
    """RFC 7519 section 2: exp, iat and nbf are JSON numbers of seconds, not only whole ones."""
    claims = check(signed(exp=NOW + 59.5, iat=NOW - 0.25, nbf=NOW + 0.5))
    assert claims["exp"] == NOW + 59.5
    refused(signed(exp=NOW - CLOCK_SKEW - 0.5), "has expired")
    refused(signed(exp=NOW + MAX_LIFETIME + CLOCK_SKEW + 0.5), "must expire within")
    refused(signed(iat=NOW + CLOCK_SKEW + 0.5), "iat is in the future")
    refused(signed(iat="now"), "iat is not a NumericDate")
    refused(signed(nbf=False), "nbf is not a NumericDate")


@pytest.mark.parametrize("assertion, words", [
    (signed("not-the-secret-" + SECRET), "does not verify"),
    (signed(SECRET + "x"), "does not verify"),
    (signed(iss="job", sub="other"), "iss and sub must both be the client_id"),
    (signed(iss="other", sub="other"), "iss and sub must both be the client_id"),
    (signed(aud="https://elsewhere.example"), f"aud must be {ISSUER!r}"),
    (signed(aud=[ISSUER + "/"]), "aud must be"),
    (signed(aud=None), "aud must be"),
    (signed(exp=NOW - CLOCK_SKEW), "has expired"),
    (signed(exp=NOW + MAX_LIFETIME + CLOCK_SKEW + 1), f"must expire within {MAX_LIFETIME} seconds"),
    (signed(exp=None), "has no exp"),
    (signed(exp="soon"), "has no exp"),
    (signed(exp=True), "has no exp"),
    (signed(iat=NOW + CLOCK_SKEW + 1), "iat is in the future"),
    (signed(nbf=NOW + CLOCK_SKEW + 1), "nbf is in the future"),
    (signed(jti=None), "needs a jti"),
    (signed(jti=""), "needs a jti"),
    (signed(jti=7), "needs a jti"),
    (signed(jti="j" * 257), "needs a jti"),
    (signed(jti="\ud800"), "surrogate"),
    (signed(alg="none"), "signed with 'none'; use one of HS256, HS384, HS512"),
    (signed(alg="HS1"), "signed with 'HS1'"),
])
def test_a_bad_assertion_says_what_is_wrong(assertion, words):
    refused(assertion, words)


def test_a_secret_shorter_than_the_hash_says_so():
    refused(signed(SHORT, alg="HS512"), "HS512 needs a client secret of at least 64 bytes", secrets=(SHORT,))
    refused(signed(SHORT, alg="HS384"), "at least 48 bytes", secrets=(SHORT,))
    assert check(signed(SHORT), secrets=(SHORT,))


def test_an_asymmetric_assertion_is_not_one_for_a_client_secret_jwt_client():
    key = jwk.JWK.generate(kty="RSA", size=2048)
    token = jwt.JWT(header={"alg": "RS256"}, claims={
        "iss": "job", "sub": "job", "aud": ISSUER, "exp": NOW + 60, "jti": "rs"})
    token.make_signed_token(key)
    refused(token.serialize(), "signed with 'RS256'; use one of HS256, HS384, HS512")


def test_the_signature_is_checked_before_any_claim_is_believed():
    """A tampered payload with the original signature is refused as unverified, not by its claims."""
    header, _, signature = signed().split(".")
    _, payload, _ = signed(sub="other", exp=NOW - 3600).split(".")
    refused(f"{header}.{payload}.{signature}", "does not verify")


@pytest.mark.parametrize("assertion, words", [
    ("", "not a compact signed JWT"),
    ("a.b", "not a compact signed JWT"),
    (signed(alg="none"), "not a compact signed JWT"),
    ("x" * 9000, "not a compact signed JWT"),
    (signed(iss=None, sub="job"), "no iss naming the client"),
])
def test_the_client_is_read_only_from_a_well_formed_assertion(assertion, words):
    with pytest.raises(InvalidClient, match=words):
        unverified_client_id(assertion)


class Jtis:
    """The store's C{claim_jti}, in memory: each jti of a client is claimed once."""

    def __init__(self):
        self.claimed: set[tuple[str, str]] = set()

    async def claim_jti(self, client_id: str, jti: str, until: int, now: int) -> bool:
        fresh = (client_id, jti) not in self.claimed
        self.claimed.add((client_id, jti))
        return fresh


def settled(coroutine):
    """The value of a coroutine that never waits (every collaborator here answers at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the check waited on something")


SIGNER_JWKS = '{"keys": [%s]}' % jwk.JWK.generate(kty="EC", crv="P-256").export_public()
KEEPER = SecretKeeper(key_from_text(new_key_text()))
HMAC_CLIENT = Client("job", token_hash(SECRET), [], token_endpoint_auth_method="client_secret_jwt",
                     sealed_secret=KEEPER.seal("job", SECRET))


def test_an_assertion_authenticates_once():
    checker = AssertionChecker(store=Jtis(), documents=None, audiences=AUDIENCES, secrets=KEEPER)
    assertion = signed(jti="once")
    assert settled(checker.check(HMAC_CLIENT, assertion, NOW, consume=False)) is HMAC_CLIENT
    assert settled(checker.check(HMAC_CLIENT, assertion, NOW, consume=True)) is HMAC_CLIENT
    with pytest.raises(InvalidClient, match="already used"):
        settled(checker.check(HMAC_CLIENT, assertion, NOW, consume=True))
    assert settled(checker.check(HMAC_CLIENT, signed(jti="twice"), NOW, consume=True)) is HMAC_CLIENT


@pytest.mark.parametrize("client, keeper, words", [
    (HMAC_CLIENT, None, "does not authenticate with a client assertion"),
    (Client("job", token_hash(SECRET), []), KEEPER, "does not authenticate with a client assertion"),
    (None, KEEPER, "does not authenticate with a client assertion"),
    (Client("job", None, [], token_endpoint_auth_method="private_key_jwt", jwks=SIGNER_JWKS), KEEPER,
     "signed with 'HS256'"),
    (Client("job", token_hash(SECRET), [], token_endpoint_auth_method="client_secret_jwt",
            sealed_secret=KEEPER.seal("other", SECRET)), KEEPER, "cannot be read"),
    (HMAC_CLIENT, SecretKeeper(key_from_text(new_key_text())), "cannot be read"),
])
def test_only_a_client_secret_jwt_client_with_a_secret_this_server_opens_is_authenticated(client, keeper, words):
    checker = AssertionChecker(store=Jtis(), documents=None, audiences=AUDIENCES, secrets=keeper)
    with pytest.raises(InvalidClient, match=words):
        settled(checker.check(client, signed(), NOW, consume=True))


def test_a_key_set_with_an_rsa_key_under_2048_bits_is_refused():
    """A client whose RSA key can be factored could be impersonated: refused as DPoP proofs' keys are."""
    weak = jwk.JWK.generate(kty="RSA", size=1024)
    strong = jwk.JWK.generate(kty="RSA", size=2048)
    with pytest.raises(ValueError, match="an RSA key of 1024 bits: an RSA key has 2048 to 8192"):
        public_keyset({"keys": [strong.export_public(as_dict=True), weak.export_public(as_dict=True)]})
    assert len(public_keyset({"keys": [strong.export_public(as_dict=True)]})["keys"]) == 1


@pytest.mark.parametrize(("n", "e", "words"), [
    ((1 << 8199) | 1, 65537, "an RSA key of 8200 bits"),
    ((1 << 2047) | 1, 2**32 + 1, "exponent must be at most 2[*][*]32"),
])
def test_a_key_set_whose_rsa_key_costs_many_checks_is_refused(n, e, words):
    """Each assertion's check would cost ten to twenty usual ones, for anyone who sends one."""
    def number(i: int) -> str:
        return base64.urlsafe_b64encode(i.to_bytes((i.bit_length() + 7) // 8, "big")).rstrip(b"=").decode()
    with pytest.raises(ValueError, match=words):
        public_keyset({"keys": [{"kty": "RSA", "n": number(n), "e": number(e)}]})


def test_one_assertion_is_checked_with_at_most_four_keys(monkeypatch):
    """
    Each key a signature is checked with costs a verify: a key set of 500
    Ed25519 keys (64 KiB) made one forged assertion cost 50 ms. More than
    four keys for the algorithm (and the kid, if named) refuse it unchecked.
    """
    import json

    from jwcrypto.jws import JWS

    keys = [jwk.JWK.generate(kty="EC", crv="P-256", kid=f"k{n}") for n in range(6)]
    unnamed = [jwk.JWK.generate(kty="EC", crv="P-256") for _ in range(5)]

    def keyset(chosen) -> object:
        return public_keyset({"keys": [json.loads(k.export_public()) for k in chosen]})

    def assertion(key, kid: str | None) -> str:
        token = jwt.JWT(header={"alg": "ES256", **({"kid": kid} if kid else {})},
                        claims={"iss": "job", "sub": "job", "aud": ISSUER, "exp": NOW + 60, "jti": "j"})
        token.make_signed_token(key)
        return token.serialize()

    checked = []
    real = JWS.verify
    monkeypatch.setattr(JWS, "verify", lambda self, key, *a, **kw: (checked.append(len(key["keys"])),
                                                                    real(self, key, *a, **kw))[1])
    assert verified_claims(assertion(keys[5], "k5"), "job", keyset(keys), AUDIENCES, NOW)["jti"] == "j"
    assert verified_claims(assertion(keys[3], None), "job", keyset(keys[:4]), AUDIENCES, NOW)["jti"] == "j"
    assert checked == [1, 4]
    for chosen, kid in ((keys, None), (keys, "unknown"), (unnamed + keys[:1], "k0x"), (unnamed, None)):
        with pytest.raises(InvalidClient, match="name the signing key by a kid that no other key has"):
            verified_claims(assertion(chosen[0], kid), "job", keyset(chosen), AUDIENCES, NOW)
    # Five keys without a kid, and the assertion names the one that has it: one check.
    assert verified_claims(assertion(keys[0], "k0"), "job", keyset(unnamed + keys[:1]), AUDIENCES, NOW)
    assert checked == [1, 4, 1]
