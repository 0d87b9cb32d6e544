"""
Property tests of the request parsers and the pure protocol pieces: whatever
a client sends, they answer with a value or a documented OAuth error, never
another exception (which would be a 500).
"""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from authsrv.protocol import pkce
from authsrv.protocol.authorize import registered_redirect
from authsrv.protocol.bearer import BEARER, DPOP, FORM, access_credential
from authsrv.protocol.clientauth import ClientCredentials, client_credentials
from authsrv.protocol.errors import InvalidRequest, InvalidScope, InvalidToken
from authsrv.protocol.jwt_access import audience_claim
from authsrv.protocol.oidc import at_hash
from authsrv.protocol.params import MAX_PARAM_LENGTH, single_param, single_params
from authsrv.protocol.replay import seal, unseal
from authsrv.protocol.scope import parse_scope, scope_text
from authsrv.records import Client

UNRESERVED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
SCOPE_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters='"\\')

raw_args = st.dictionaries(
    st.binary(max_size=20), st.lists(st.binary(max_size=40), max_size=3), max_size=6
)


@given(raw_args)
def test_single_params_gives_text_or_invalid_request(args):
    try:
        params = single_params(args)
    except InvalidRequest:
        return
    for name, value in params.items():
        assert isinstance(name, str) and isinstance(value, str)
        assert value and "\x00" not in value and len(value) <= MAX_PARAM_LENGTH
        assert [v for v in args[name.encode()] if v] == [value.encode()]


@given(st.lists(st.binary(max_size=40), max_size=3))
def test_single_param_gives_its_one_value_or_why_not_whatever_else_is_sent(values):
    value, problem = single_param({b"client_id": values, b"other\xff": [b"\xff", b"\xff"]}, b"client_id")
    sent = [v for v in values if v]
    if value is not None:
        assert problem == "" and sent == [value.encode()]
    elif not sent:
        assert problem == "is missing"
    else:
        assert problem in ("is repeated", "is not UTF-8 text", "is too long", "holds a NUL character")


@given(st.dictionaries(st.text(min_size=1, max_size=10), st.text(min_size=1, max_size=30).filter(lambda v: "\x00" not in v)))
def test_single_params_keeps_every_single_value(params):
    raw = {k.encode(): [v.encode()] for k, v in params.items()}
    assert single_params(raw) == params


@given(st.text(min_size=1, max_size=20), st.lists(st.text(max_size=5).map(str.encode), min_size=2, max_size=4))
def test_repeated_parameter_is_refused(name, values):
    values = [v or b"x" for v in values]
    try:
        single_params({name.encode(): values})
    except InvalidRequest as e:
        assert "repeated" in e.description
    else:
        raise AssertionError("a repeated parameter was accepted")


@given(st.text(min_size=1, max_size=30), st.text(max_size=30))
def test_basic_credentials_round_trip(client_id, secret):
    """RFC 6749 2.3.1: both parts form-urlencoded, then Base64 of id:secret."""
    encoded = f"{quote(client_id, safe='')}:{quote(secret, safe='')}".encode()
    header = b"Basic " + base64.b64encode(encoded)
    assert client_credentials(header, {}) == ClientCredentials(client_id, secret, "client_secret_basic")
    assert client_credentials(b"bAsIc " + base64.b64encode(encoded), {"client_id": client_id}).secret == secret


@given(st.text(alphabet=UNRESERVED, min_size=43, max_size=128))
def test_pkce_verifier_matches_its_challenge(verifier):
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert pkce.valid_verifier(verifier) and pkce.valid_challenge(challenge)
    assert pkce.s256(verifier) == challenge
    assert pkce.verify(verifier, challenge)
    assert not pkce.verify(verifier, challenge[:-1] + ("A" if challenge[-1] != "A" else "B"))


@given(st.text(max_size=200), st.text(max_size=60))
def test_pkce_never_raises(verifier, challenge):
    assert pkce.verify(verifier, challenge) in (True, False)
    pkce.valid_challenge(challenge)


@given(st.text(max_size=42, alphabet=UNRESERVED) | st.text(min_size=129, max_size=200, alphabet=UNRESERVED))
def test_pkce_refuses_verifiers_of_the_wrong_length(verifier):
    assert not pkce.verify(verifier, pkce.s256(verifier))


def test_pkce_refuses_a_final_newline():
    """RFC 7636 section 4.1: unreserved characters only; a pattern's C{$} also matches before a final newline."""
    verifier = "A" * 43 + "\n"
    assert not pkce.valid_verifier(verifier) and not pkce.verify(verifier, pkce.s256(verifier))
    assert not pkce.valid_challenge(pkce.s256("A" * 43) + "\n")


@given(st.text(max_size=100))
def test_parse_scope_gives_a_set_or_invalid_scope(text):
    try:
        scope = parse_scope(text)
    except InvalidScope:
        return
    assert all(token and " " not in token for token in scope)
    assert parse_scope(scope_text(scope)) == scope


@given(st.frozensets(st.text(SCOPE_CHARS, min_size=1, max_size=15), max_size=6))
def test_scope_round_trip(scope):
    assert parse_scope(scope_text(scope)) == scope
    assert parse_scope("  " + "   ".join(scope) + " ") == scope


@given(st.one_of(st.none(), st.binary(max_size=80)), st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_bearer_token_gives_a_token_or_an_oauth_error(authorization, form_token):
    try:
        scheme, token = access_credential(authorization, form_token)
    except (InvalidToken, InvalidRequest):
        return
    assert token and (scheme, token) == (FORM, form_token) or scheme in (BEARER, DPOP) and token.encode() in authorization


@given(st.text(alphabet=UNRESERVED + "+/", min_size=1, max_size=60))
def test_bearer_header_round_trip(token):
    assert access_credential(b"Bearer " + token.encode(), None) == (BEARER, token)
    assert access_credential(b"BEARER " + token.encode() + b"==", None) == (BEARER, token + "==")
    assert access_credential(b"DPoP " + token.encode(), None) == (DPOP, token)
    assert access_credential(b"dpop  " + token.encode(), None) == (DPOP, token)


@given(st.dictionaries(st.text(max_size=10), st.text(max_size=30) | st.integers()), st.text(min_size=1, max_size=50))
def test_replay_opens_only_with_the_presented_token(response, token):
    blob = seal(response, token)
    assert unseal(blob, token) == response
    assert unseal(blob, token + "x") is None
    assert unseal(blob[:-1], token) is None
    assert unseal(blob[:5], token) is None
    assert seal(response, token) != blob


@given(st.text(alphabet=UNRESERVED, min_size=1, max_size=80))
def test_at_hash_is_the_left_half_of_sha256(token):
    digest = hashlib.sha256(token.encode()).digest()[:16]
    assert at_hash(token) == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert len(at_hash(token, "EdDSA")) == 43


@given(st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=4))
def test_audience_claim(audience):
    claim = audience_claim(tuple(audience))
    assert claim == (audience[0] if len(audience) == 1 else audience)



NATIVE = Client("native", None, ["http://127.0.0.1/cb", "http://[::1]:8000/cb?x=1", "https://app.example/cb",
                                 "http://localhost/cb", "com.example.app:/callback"])


@pytest.mark.parametrize("uri", [
    "http://127.0.0.1/cb", "http://127.0.0.1:51234/cb", "http://[::1]:9/cb?x=1", "http://[::1]/cb?x=1",
    "https://app.example/cb", "com.example.app:/callback",
])
def test_a_loopback_ip_redirect_uri_matches_on_any_port(uri):
    """RFC 8252 section 7.3: a native app listens on the port the system gives it at the time of the request."""
    assert registered_redirect(NATIVE, uri)


@pytest.mark.parametrize("uri", [
    "http://127.0.0.1:5/cb2", "http://[::1]:9/cb?x=2", "https://app.example:444/cb", "http://localhost:5/cb",
    "http://user@127.0.0.1:5/cb", "http://127.0.0.1:99999/cb", "http://127.0.0.1:5/cb#x", "https://127.0.0.1:5/cb",
    "http://127.0.0.2:5/cb", "http://[::1]:9/cb", "com.example.app:/callback2",
    "http://[::1]evil.example/cb", "http://[::1]\\evil.example/cb", "http://[::1] evil.example/cb",
])
def test_any_other_difference_from_a_registered_redirect_uri_is_refused(uri):
    assert not registered_redirect(NATIVE, uri)


def test_a_redirect_uri_the_rules_refuse_is_never_registered():
    """One stored before the rules, or by an import, is refused when a request names it."""
    held = Client("old", None, ["http://evil.example\\@127.0.0.1/cb", "https://app.example/cb"])
    assert not registered_redirect(held, "http://evil.example\\@127.0.0.1/cb")
    assert registered_redirect(held, "https://app.example/cb")
