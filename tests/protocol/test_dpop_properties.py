"""
Properties of the DPoP proof checks (authsrv.protocol.dpop, RFC 9449
section 4.3) over generated requests and proofs: every well-formed proof
for the request is accepted, with the key's thumbprint; its htu may differ
from the endpoint's URL only in what section 4.3 says is ignored (query,
fragment, the case of scheme and host, a default port); and every change
to htm, htu, iat, jti, ath, the signature, typ, alg or jwk is refused with
the error that names it. Keys are made once: examples only sign.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jwcrypto import jwk, jws

from authsrv.protocol.dpop import MAX_JTI_CHARS, DpopPolicy, access_token_hash, check_proof, nonce_for
from authsrv.protocol.errors import InvalidDpopProof, UseDpopNonce

POLICY = DpopPolicy()
KEYS = {
    "ES256": jwk.JWK.generate(kty="EC", crv="P-256"),
    "ES384": jwk.JWK.generate(kty="EC", crv="P-384"),
    "PS256": (rsa := jwk.JWK.generate(kty="RSA", size=2048)),
    "RS256": rsa,
    "EdDSA": jwk.JWK.generate(kty="OKP", crv="Ed25519"),
}
STRANGER = jwk.JWK.generate(kty="EC", crv="P-256")
WEAK_RSA = jwk.JWK.generate(kty="RSA", size=1024)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
SETTINGS = settings(max_examples=40, deadline=None)

algs = st.sampled_from(sorted(KEYS))
times = st.integers(1_000_000_000, 2_000_000_000)
jtis = st.text(min_size=1, max_size=MAX_JTI_CHARS)
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True)
paths = st.lists(st.from_regex(r"[A-Za-z0-9._~-]{1,10}", fullmatch=True), max_size=4).map(
    lambda parts: "/" + "/".join(parts))
ports = st.one_of(st.none(), st.integers(1, 65535))
schemes = st.sampled_from(["http", "https"])
tails = st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters="=&-._~%/"), max_size=20)


@st.composite
def requests(draw) -> dict:
    """An endpoint's public URL in parts, a method, and the server's time."""
    return {"scheme": draw(schemes), "host": draw(hosts), "port": draw(ports), "path": draw(paths),
            "method": draw(st.sampled_from(METHODS)), "now": draw(times)}


def url_of(r: dict, *, scheme=None, host=None, port=None, path=None) -> str:
    port = r["port"] if port is None else port
    return (f"{scheme or r['scheme']}://{host or r['host']}{'' if port is None else f':{port}'}"
            f"{r['path'] if path is None else path}")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(header: dict, claims: dict, key: jwk.JWK) -> str:
    token = jws.JWS(json.dumps(claims).encode())
    token.add_signature(key, header["alg"], protected=json.dumps(header))
    return token.serialize(compact=True)


def made(r: dict, alg: str, *, header=None, claims=None, key=None, access_token=None, nonce=None) -> str:
    """A proof for request C{r} signed with C{alg}'s key; C{header} and C{claims} override fields."""
    key = key or KEYS[alg]
    base_claims = {"jti": "j", "htm": r["method"], "htu": url_of(r), "iat": r["now"]}
    if access_token is not None:
        base_claims["ath"] = access_token_hash(access_token)
    if nonce is not None:
        base_claims["nonce"] = nonce
    return signed({"typ": "dpop+jwt", "alg": alg, "jwk": KEYS[alg].export_public(as_dict=True), **(header or {})},
                  {**base_claims, **(claims or {})}, key)


def check(r: dict, compact: str, access_token=None, policy=POLICY, secret=None):
    return check_proof(compact, method=r["method"], url=url_of(r), now=r["now"], policy=policy,
                       nonce_secret=secret, access_token=access_token)


def refused(r: dict, compact: str, words: str, access_token=None) -> None:
    with pytest.raises(InvalidDpopProof) as caught:
        check(r, compact, access_token)
    assert words in caught.value.description, caught.value.description


@SETTINGS
@given(requests(), algs, jtis, st.integers(-POLICY.max_age, POLICY.leeway), st.one_of(st.none(), st.text(max_size=40)))
def test_a_well_formed_proof_is_accepted(r, alg, jti, age, access_token):
    compact = made(r, alg, claims={"jti": jti, "iat": r["now"] + age}, access_token=access_token)
    accepted = check(r, compact, access_token)
    assert accepted.jkt == KEYS[alg].thumbprint()
    assert accepted.expires_at > r["now"]
    again = check(r, made(r, alg, claims={"jti": jti}, access_token=access_token), access_token)
    assert again.replay_key == accepted.replay_key, "a replay is known by key and jti, whatever else changed"
    other = jti[:-1] + ("y" if jti[-1] != "y" else "z")
    assert check(r, made(r, alg, claims={"jti": other})).replay_key != accepted.replay_key


@SETTINGS
@given(requests(), tails, tails, st.booleans(), st.booleans())
def test_htu_ignores_query_fragment_case_and_default_port(r, query, fragment, shout, spell_port):
    default = {"http": 80, "https": 443}[r["scheme"]]
    scheme = r["scheme"].upper() if shout else r["scheme"]
    host = r["host"].upper() if shout else r["host"]
    port = default if spell_port and r["port"] is None else r["port"]
    htu = url_of(r, scheme=scheme, host=host, port=port) + f"?{query}#{fragment}"
    check(r, made(r, "ES256", claims={"htu": htu}))
    with_query = {**r, "path": r["path"] + f"?{query}"}
    check(with_query, made(r, "ES256"))


@SETTINGS
@given(requests(), st.sampled_from(["host", "path", "port", "scheme", "trailing slash", "not a URL"]))
def test_htu_for_another_url_is_refused(r, change):
    other_port = 1 + (r["port"] or 8000) % 65535
    htu = {
        "host": url_of(r, host="x" + r["host"]),
        "path": url_of(r, path=r["path"].rstrip("/") + "/x"),
        "port": url_of(r, port=other_port if other_port != {"http": 80, "https": 443}[r["scheme"]] else 1),
        "scheme": url_of(r, scheme="https" if r["scheme"] == "http" else "http"),
        "trailing slash": url_of(r, path=r["path"] + ("/" if r["path"] != "/" else "x")),
        "not a URL": r["path"],
    }[change]
    refused(r, made(r, "ES256", claims={"htu": htu}), "htu")


@SETTINGS
@given(requests(), st.sampled_from(METHODS), st.text(max_size=10))
def test_htm_of_another_method_is_refused(r, method, anything):
    other = method if method != r["method"] else anything
    if other == r["method"]:
        other = r["method"].lower()
    refused(r, made(r, "ES256", claims={"htm": other}), "htm")


@SETTINGS
@given(requests(), st.one_of(
    st.integers(POLICY.max_age + 1, 10**6).map(lambda n: -n), st.integers(POLICY.leeway + 1, 10**6)))
def test_iat_outside_the_window_is_refused(r, offset):
    refused(r, made(r, "ES256", claims={"iat": r["now"] + offset}), "iat")


@SETTINGS
@given(requests(), st.floats(-POLICY.max_age, POLICY.leeway))
def test_a_fractional_iat_inside_the_window_is_accepted(r, offset):
    """RFC 7519's NumericDate may have a fraction (a client's time.time()); node-oidc-provider and Keycloak take it."""
    accepted = check(r, made(r, "ES256", claims={"iat": r["now"] + offset}))
    assert accepted.expires_at > r["now"] + offset + POLICY.max_age


@SETTINGS
@given(requests(), st.one_of(
    st.floats(POLICY.max_age + 0.001, 1e7).map(lambda n: -n),
    st.floats(POLICY.leeway + 0.001, 1e7)))
def test_a_fractional_iat_outside_the_window_is_refused(r, offset):
    refused(r, made(r, "ES256", claims={"iat": r["now"] + offset}), "iat")


@SETTINGS
@given(requests(), st.sampled_from(["1e400", "-1e400", "1" + "0" * 400]))
def test_an_iat_too_large_for_a_float_is_refused(r, literal):
    """JSON's 1e400 reads as an infinite float: refused by the window, never an overflow."""
    claims = json.dumps({"jti": "j", "htm": r["method"], "htu": url_of(r), "iat": 0})
    text = claims.replace('"iat": 0', f'"iat": {literal}')
    token = jws.JWS(text.encode())
    token.add_signature(KEYS["ES256"], "ES256", protected=json.dumps(
        {"typ": "dpop+jwt", "alg": "ES256", "jwk": KEYS["ES256"].export_public(as_dict=True)}))
    refused(r, token.serialize(compact=True), "iat")


@SETTINGS
@given(requests(), st.one_of(st.text(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)))
def test_iat_that_is_no_number_is_refused(r, iat):
    refused(r, made(r, "ES256", claims={"iat": iat}), "iat")


@SETTINGS
@given(requests(), st.sampled_from([float("inf"), float("-inf"), float("nan")]))
def test_iat_of_a_constant_json_has_not_leaves_the_payload_unreadable(r, iat):
    """Python writes these as Infinity and NaN, which are no JSON: the payload cannot be read at all."""
    refused(r, made(r, "ES256", claims={"iat": iat}), "not valid JSON")


@SETTINGS
@given(requests(), st.one_of(st.just(""), st.text(min_size=MAX_JTI_CHARS + 1, max_size=MAX_JTI_CHARS + 20),
                             st.integers(), st.none(), st.lists(st.text(), max_size=2)))
def test_jti_missing_empty_long_or_no_string_is_refused(r, jti):
    refused(r, made(r, "ES256", claims={"jti": jti}), "jti")


@SETTINGS
@given(requests(), st.sampled_from(["jti", "htu", "nonce"]), st.characters(categories=("Cs",)))
def test_a_claim_that_is_no_unicode_text_is_refused(r, name, surrogate):
    refused(r, made(r, "ES256", claims={name: "j" + surrogate}), "surrogate")


@SETTINGS
@given(requests(), algs, st.text(max_size=30), st.sampled_from(["another token", "absent"]))
def test_ath_of_another_token_or_none_is_refused(r, alg, token, how):
    claims = {"ath": access_token_hash(token + "x")} if how == "another token" else {}
    refused(r, made(r, alg, claims=claims), "ath", access_token=token)


@SETTINGS
@given(requests(), st.text(max_size=30), st.one_of(st.text(min_size=1, max_size=50), st.integers(), st.none()))
@example(r={"scheme": "https", "host": "as.example", "port": None, "path": "/userinfo", "method": "GET",
            "now": 1_700_000_000}, token="t", ath="\u00e9")
def test_any_other_ath_is_refused_even_one_that_is_no_ascii(r, token, ath):
    """An ath (or nonce) of non-ASCII text made hmac.compare_digest raise TypeError: a 500 once."""
    if ath == access_token_hash(token):
        ath = None
    refused(r, made(r, "ES256", claims={"ath": ath}), "ath", access_token=token)


@SETTINGS
@given(requests(), st.integers(60, 3600), st.one_of(st.text(min_size=1, max_size=50), st.integers(), st.none()))
@example(r={"scheme": "https", "host": "as.example", "port": None, "path": "/token", "method": "POST",
            "now": 1_700_000_000}, window=300, nonce="\u00e9t\u00e9")
def test_any_other_nonce_asks_for_the_current_one(r, window, nonce):
    policy = DpopPolicy(use_nonce=True, nonce_lifetime=window)
    secret = b"s" * 32
    with pytest.raises(UseDpopNonce) as caught:
        check(r, made(r, "ES256", claims={"nonce": nonce}), policy=policy, secret=secret)
    assert caught.value.nonce == nonce_for(secret, r["now"], window)


@SETTINGS
@given(requests(), algs, st.data())
def test_any_change_to_the_signature_or_the_signed_bytes_is_refused(r, alg, data):
    header, payload, signature = made(r, alg).split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= 1 << data.draw(st.integers(0, 7))
    refused(r, f"{header}.{payload}.{b64(bytes(raw))}", "signature")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    changed = {**claims, "iat": claims["iat"] - data.draw(st.integers(1, POLICY.max_age))}
    refused(r, f"{header}.{b64(json.dumps(changed).encode())}.{signature}", "signature")


@SETTINGS
@given(requests(), algs)
def test_a_proof_signed_by_another_key_than_its_jwk_is_refused(r, alg):
    other = "ES256" if alg != "ES256" else "ES384"
    refused(r, made(r, other, header={"jwk": KEYS[alg].export_public(as_dict=True)}), "signature")
    refused(r, made(r, "ES256", key=STRANGER), "signature")


@SETTINGS
@given(requests(), st.one_of(st.text(max_size=20), st.integers(), st.none()).filter(lambda t: t != "dpop+jwt"))
def test_any_other_typ_is_refused(r, typ):
    refused(r, made(r, "ES256", header={"typ": typ}), "typ")


@SETTINGS
@given(requests(), st.one_of(st.sampled_from(["none", "HS256", "HS512", "RSA1_5", "ES256K", "dir"]),
                             st.text(max_size=12)).filter(lambda a: a not in KEYS and a not in ("ES512", "PS384",
                                                                                                "PS512")))
def test_an_algorithm_outside_the_list_is_refused(r, alg):
    header = {"typ": "dpop+jwt", "alg": alg, "jwk": KEYS["ES256"].export_public(as_dict=True)}
    claims = {"jti": "j", "htm": r["method"], "htu": url_of(r), "iat": r["now"]}
    compact = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}.{b64(b'not a signature')}"
    refused(r, compact, "signed with one of")


@SETTINGS
@given(requests(), algs)
def test_a_private_or_symmetric_jwk_is_refused(r, alg):
    refused(r, made(r, alg, header={"jwk": KEYS[alg].export_private(as_dict=True)}), "public key")
    secret = jwk.JWK.generate(kty="oct", size=256).export(as_dict=True)
    refused(r, made(r, alg, header={"jwk": secret}), "public key")


@SETTINGS
@given(requests(), st.sampled_from(["RS256", "PS256"]))
def test_an_rsa_key_under_2048_bits_is_refused(r, alg):
    """A key that can be factored binds nothing: a 1024-bit (even a 512-bit) RSA key once bound tokens."""
    claims = {"jti": "j", "htm": r["method"], "htu": url_of(r), "iat": r["now"]}
    header = {"typ": "dpop+jwt", "alg": alg, "jwk": WEAK_RSA.export_public(as_dict=True)}
    refused(r, signed(header, claims, WEAK_RSA), "2048 to 8192 bits")


def crafted_rsa(n: int, e: int) -> dict:
    """An RSA public JWK of any modulus and exponent, made without generating primes (the check comes first)."""
    def number(i: int) -> str:
        return b64(i.to_bytes((i.bit_length() + 7) // 8, "big"))
    return {"kty": "RSA", "n": number(n), "e": number(e)}


@SETTINGS
@given(requests(), st.sampled_from(["RS256", "PS256"]),
       st.sampled_from([((1 << 8199) | 1, 65537, "2048 to 8192 bits"), ((1 << 16383) | 1, 3, "2048 to 8192 bits"),
                        ((1 << 2047) | 1, 2**32 + 1, "exponent must be at most 2**32")]))
def test_an_rsa_key_that_costs_many_checks_is_refused(r, alg, unfit):
    """A modulus over 8192 bits or an exponent over 2**32 makes each check cost ten to twenty usual ones."""
    n, e, words = unfit
    refused(r, made(r, alg, header={"jwk": crafted_rsa(n, e)}), words)


@SETTINGS
@given(requests(), st.one_of(st.none(), st.text(max_size=10), st.lists(st.integers(), max_size=2),
                             st.fixed_dictionaries({"kty": st.sampled_from(["EC", "RSA", "OKP", "x"])}),
                             st.dictionaries(st.sampled_from(["crv", "x", "y", "n", "e", "kid"]), st.text(max_size=8),
                                             max_size=3)))
@example(r={"scheme": "https", "host": "as.example", "port": None, "path": "/token", "method": "POST",
            "now": 1_700_000_000}, value={})
def test_a_missing_or_broken_jwk_is_refused(r, value):
    """A jwk without kty made jwcrypto an empty key, whose has_private raised KeyError: a 500 once."""
    refused(r, made(r, "ES256", header={"jwk": value}), "jwk")


@SETTINGS
@given(requests(), st.integers(60, 3600), st.integers(0, 3))
def test_a_nonce_of_the_current_or_previous_window_only(r, window, back):
    policy = DpopPolicy(use_nonce=True, nonce_lifetime=window)
    secret = b"s" * 32
    compact = made(r, "ES256", nonce=nonce_for(secret, r["now"], window, back))
    if back < 2:
        check(r, compact, policy=policy, secret=secret)
    else:
        with pytest.raises(UseDpopNonce) as caught:
            check(r, compact, policy=policy, secret=secret)
        assert caught.value.nonce == nonce_for(secret, r["now"], window)
