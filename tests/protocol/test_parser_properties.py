"""
Property tests of every parser that reads what a stranger sends or an
operator writes: form bodies as Twisted parses them, the Basic authorization
header, scope strings, redirect URIs, tokens handed to introspection and
end-session, client assertions, and the TOML config. Each answers with a value or its own
documented refusal, never another exception (a 500, or a traceback at start).
Every case that once failed stays as an C{@example}.
"""

from __future__ import annotations

import base64
import json
import re
import string
from urllib.parse import quote_plus, urlencode, urlsplit

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jwcrypto.jwa import JWA
from jwcrypto.jwk import JWK
from jwcrypto.jws import JWS
from twisted.web.http import parse_qs

from authsrv.config import Config, ConfigFileError, load_config, parse_config
from authsrv.configsection import ConfigError, Section
from authsrv.protocol.client_assertion import assertion_kid, public_keyset, unverified_client_id, verified_claims
from authsrv.protocol.clientauth import ClientCredentials, client_credentials
from authsrv.protocol.clients import redirect_uri_problem
from authsrv.protocol.errors import InvalidClient, InvalidRequest, InvalidScope, PageError
from authsrv.protocol.logout import hint_claims
from authsrv.protocol.params import MAX_PARAM_LENGTH, single_params
from authsrv.protocol.scope import parse_scope, scope_text
from authsrv.protocol.urls import csp_source, origin
from authsrv.tokens import token_hash

ISSUER = "http://127.0.0.1:8080/api/auth"
B64URL = string.ascii_letters + string.digits + "-_"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# Form bodies -----------------------------------------------------------------

FORM_BYTES = st.binary(max_size=200) | st.lists(
    st.sampled_from([b"a", b"=", b"&", b";", b"%", b"%00", b"%ff", b"%zz", b"+", b"client_id", b"\xc3", b"\x00"]),
    max_size=30,
).map(b"".join)


@given(FORM_BYTES)
@example(b"a=%00")
@example(b"a=1&a=2")
@example(b"%ff=1")
@example(b"a=" + b"x" * (MAX_PARAM_LENGTH + 1))
def test_a_form_body_gives_text_parameters_or_invalid_request(body):
    try:
        params = single_params(parse_qs(body, keep_blank_values=True))
    except InvalidRequest:
        return
    for name, value in params.items():
        assert isinstance(name, str) and isinstance(value, str)
        assert value and "\x00" not in value and len(value) <= MAX_PARAM_LENGTH


@given(st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40), max_size=6))
def test_a_form_body_round_trips(fields):
    """What a client encodes is what the server reads; empty values count as omitted (RFC 6749 3.1)."""
    body = urlencode(fields).encode()
    expected = {k: v for k, v in fields.items() if v}
    if any("\x00" in v for v in expected.values()):
        with pytest.raises(InvalidRequest):
            single_params(parse_qs(body, keep_blank_values=True))
    else:
        assert single_params(parse_qs(body, keep_blank_values=True)) == expected


# The Basic authorization header ------------------------------------------------

HEADERS = st.binary(max_size=80) | st.builds(
    lambda scheme, raw: scheme + base64.b64encode(raw),
    st.sampled_from([b"Basic ", b"basic ", b"BASIC  ", b"Bearer "]),
    st.binary(max_size=60),
)
PARAMS = st.dictionaries(st.sampled_from(["client_id", "client_secret", "grant_type"]), st.text(min_size=1, max_size=10))


@given(HEADERS | st.none(), PARAMS)
@example(b"Basic !!!", {})
@example(b"Basic " + base64.b64encode(b"\xff:x"), {})
@example(b"Basic " + base64.b64encode(b"no-colon"), {})
@example(b"Basic " + base64.b64encode(b":secret"), {})
def test_any_authorization_header_gives_credentials_or_an_oauth_error(authorization, params):
    try:
        credentials = client_credentials(authorization, params)
    except (InvalidClient, InvalidRequest):
        return
    assert isinstance(credentials, ClientCredentials) and credentials.client_id


@given(st.text(min_size=1, max_size=30), st.text(max_size=30))
@example("id:with:colons", "secret:with:colons")
@example("a+b", "%")
def test_basic_credentials_are_form_encoded_before_base64(client_id, secret):
    """RFC 6749 section 2.3.1: a colon or plus in either part survives the round trip."""
    raw = f"{quote_plus(client_id)}:{quote_plus(secret)}".encode()
    credentials = client_credentials(b"Basic " + base64.b64encode(raw), {})
    assert (credentials.client_id, credentials.secret, credentials.method) == (client_id, secret, "client_secret_basic")


# Scope strings -----------------------------------------------------------------

SCOPE_TOKEN = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\'), min_size=1)


@given(st.text(max_size=60) | st.lists(SCOPE_TOKEN | st.sampled_from(["", " ", "\t", '"', "\\", "é"])).map(" ".join))
@example("openid\tprofile")
@example("openid  profile ")
def test_a_scope_string_gives_its_tokens_or_invalid_scope(text):
    try:
        scope = parse_scope(text)
    except InvalidScope:
        assert any(c not in string.printable or c in '"\\\t\n\r\x0b\x0c' for c in text)
        return
    assert scope == frozenset(t for t in text.split(" ") if t)
    assert parse_scope(scope_text(scope)) == scope


# Redirect URIs -------------------------------------------------------------------

URIS = st.text(max_size=60) | st.builds(
    "{}://{}{}{}".format,
    st.sampled_from(["https", "http", "com.example.app", "javascript", "", "HTTPS"]),
    st.sampled_from(["127.0.0.1", "localhost", "[::1]", "example.com", "", "[::1", "host:99999", "host:x", "a@b"]),
    st.sampled_from(["", "/", "/cb", "/cb?x=1"]),
    st.sampled_from(["", "#", "#frag"]),
)


@given(URIS)
@example("https://[::1")
@example("https://host:99999/cb")
@example("http://[::1%25lo]/cb")
def test_a_redirect_uri_is_accepted_or_told_what_is_wrong(uri):
    problem = redirect_uri_problem(uri)
    if problem is not None:
        assert isinstance(problem, str) and problem
        return
    parts = urlsplit(uri)
    assert parts.scheme and not parts.fragment and "#" not in uri
    assert parts.scheme != "https" or parts.hostname
    assert parts.scheme not in ("http", "https") or parts.hostname


# Tokens handed to introspection and end-session ----------------------------------

JWT_SHAPED = st.lists(st.text(B64URL, max_size=40), min_size=1, max_size=5).map(".".join)


@given(st.text() | JWT_SHAPED)
def test_any_presented_token_has_a_hash(token):
    """Introspection, revocation and the token endpoint look every token up by this hash."""
    assert re.fullmatch(r"[0-9a-f]{64}", token_hash(token))


class _Keystore:
    """The verifying side of a keystore with one EdDSA key, and that key to sign with."""

    def __init__(self):
        self.key = JWK.generate(kty="OKP", crv="Ed25519", kid="k1", alg="EdDSA")
        self._public = JWK.from_json(self.key.export_public())

    def hint_key(self, kid):
        return self._public if kid == "k1" else None

    def sign(self, header: dict, payload: bytes) -> str:
        token = JWS(payload)
        token.add_signature(self.key, None, json.dumps({"alg": "EdDSA", "kid": "k1", **header}))
        return token.serialize(compact=True)


KEYSTORE = _Keystore()
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
CLAIMS = JSON | st.fixed_dictionaries(
    {"iss": st.just(ISSUER) | JSON, "sub": st.text(max_size=8) | JSON},
    optional={"aud": JSON, "sid": JSON, "exp": JSON, "iat": JSON},
)


@settings(deadline=None)
@given(st.text(max_size=80) | JWT_SHAPED)
def test_an_arbitrary_hint_is_refused(hint):
    with pytest.raises(PageError):
        hint_claims(hint, KEYSTORE.hint_key, ISSUER)


@settings(deadline=None)
@given(typ=st.none() | st.sampled_from(["JWT", "jwt", "at+jwt", "application/jwt"]) | JSON,
       payload=CLAIMS.map(lambda claims: json.dumps(claims).encode()) | st.binary(max_size=40))
def test_a_hint_we_signed_gives_claims_or_a_refusal(typ, payload):
    """Signed by our key, so only the claims checks decide: whatever they hold, no other exception."""
    hint = KEYSTORE.sign({} if typ is None else {"typ": typ}, payload)
    try:
        claims = hint_claims(hint, KEYSTORE.hint_key, ISSUER)
    except PageError:
        return
    assert claims["iss"] == ISSUER and isinstance(claims["sub"], str)


# Client assertions ---------------------------------------------------------------

ASSERTION_KEY = JWK.generate(kty="EC", crv="P-256", kid="k1")
ASSERTION_KEYS = public_keyset({"keys": [ASSERTION_KEY.export_public(as_dict=True)]})
NOW = 1_800_000_000
ASSERTION_HEADERS = JSON | st.fixed_dictionaries(
    {"alg": st.sampled_from(["ES256", "RS256", "HS256", "none"]) | JSON, "kid": st.just("k1") | JSON},
    optional={name: JSON for name in ("crit", "b64", "typ", "jwk", "jku", "x5u")},
)
ASSERTION_CLAIMS = JSON | st.fixed_dictionaries(
    {"iss": st.just("job") | JSON, "sub": st.just("job") | JSON, "aud": st.just(ISSUER) | JSON,
     "exp": st.just(NOW + 60) | JSON, "jti": st.just("j") | JSON},
    optional={"iat": JSON, "nbf": JSON},
)


@settings(deadline=None)
@given(header=ASSERTION_HEADERS, claims=ASSERTION_CLAIMS)
@example(header={"alg": "ES256", "crit": 5}, claims={"iss": "job"})
@example(header={"alg": "ES256", "kid": "k1", "crit": [[]]}, claims={"iss": "job"})
def test_an_assertion_authenticates_or_is_invalid_client(header, claims):
    """
    Signed with the client's key whatever its header says, so that every
    header and claims check is reached: each ends in claims or
    invalid_client, never another exception (a crit that is no array of
    names once raised jwcrypto's TypeError, a 500).
    """
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}".encode()
    assertion = f"{signing_input.decode()}.{b64url(JWA.signing_alg('ES256').sign(ASSERTION_KEY, signing_input))}"
    kid = assertion_kid(assertion)
    assert kid is None or isinstance(kid, str)
    try:
        unverified_client_id(assertion)
        verified = verified_claims(assertion, "job", ASSERTION_KEYS, (ISSUER,), NOW)
    except InvalidClient:
        return
    assert verified["iss"] == verified["sub"] == "job"


# The TOML config -------------------------------------------------------------------

TEXT_VALUES = st.sampled_from([
    "", " ", "\x00", "~", "~no-such-user-here/x", "15m", "0s", "1h30m", "99999999999999999999d", "-1",
    "http://127.0.0.1:8080", "https://auth.example.com", "http://example.com", "https://[::1", "https://h:99999",
    "tcp:8080", "sqlite", "static", "jwk-file", "pem", "no-such-plugin", "secret", "AUTHSRV_NO_SUCH_VARIABLE",
    "https://app.example.com/callback", "com.example.app:/cb", "a b", "x" * 300, ".", "/", "/dev/null",
]) | st.text(max_size=12)
TOML_SCALARS = TEXT_VALUES | st.integers() | st.booleans() | st.floats() | st.datetimes()
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
SECTION_KEYS = {
    "server": ["public_url", "listen", "access_log"],
    "internal": ["secret_env", "secret_file", "secret", "listen", "serve_on_main"],
    "limits": ["code_ttl", "access_token_ttl", "id_token_ttl", "refresh_token_idle_ttl",
               "refresh_token_absolute_ttl", "refresh_grace", "session_ttl", "pending_request_ttl",
               "max_body_bytes"],
    "store": ["plugin", "path", "synchronous"],
    "keystore": ["plugin", "path", "algorithms", "rotate_every"],
    "identity": ["plugin", "path"],
    "clients": ["client_id", "name", "secret_env", "secret_file", "redirect_uris", "post_logout_redirect_uris",
                "end_session_enabled", "first_party", "resources", "introspect_any", "backchannel_logout_uri"],
    "chat": ["encryption_key_env", "encryption_key_file", "client_id", "client_secret_env", "client_secret_file",
             "authorize_url", "token_url", "user_url", "scopes", "pkce", "refresh_margin", "timeout", "lock_ttl",
             "provider"],
}
ARRAYS_OF_TABLES = ("identity", "clients")


def _section(name: str):
    keys = st.sampled_from(SECTION_KEYS[name]) | st.text(max_size=8)
    table = st.dictionaries(keys, TOML_VALUES | TEXT_VALUES, max_size=6)
    if name in ARRAYS_OF_TABLES:
        return st.lists(table, max_size=2) | TOML_VALUES
    return table | TOML_VALUES


DOCUMENTS = st.fixed_dictionaries({}, optional={name: _section(name) for name in SECTION_KEYS}) | st.dictionaries(
    st.text(max_size=8), TOML_VALUES, max_size=3
)


@settings(max_examples=300, deadline=None)
@given(DOCUMENTS)
@example({"internal": {"secret_env": "\x00"}})
@example({"internal": {"secret_file": "\x00"}})
@example({"internal": {"secret_file": "~no-such-user-here/x"}})
@example({"internal": {"secret_file": "."}})
@example({"limits": {"max_body_bytes": 2**70}})
@example({"server": {"public_url": "https://h:99999"}})
def test_any_config_document_gives_a_config_or_a_config_error(tmp_path_factory, document):
    path = tmp_path_factory.getbasetemp() / "authsrv.toml"
    try:
        config = parse_config(document, path)
    except ConfigError as e:
        assert str(e)
        return
    assert isinstance(config, Config)


@given(TEXT_VALUES | st.text(max_size=30))
@example("\x00")
@example("a\x00b")
@example("~no-such-user-here/x")
def test_a_config_path_resolves_or_gives_a_config_error(tmp_path_factory, value):
    """Every plugin's file setting (store, keystore, users file, CA file) is read through this."""
    section = Section({"path": value}, "store", tmp_path_factory.getbasetemp())
    try:
        path = section.path_("path")
    except ConfigError as e:
        assert e.key == "store.path"
        return
    assert path.is_absolute()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120) | st.lists(st.sampled_from(
    ["[server]\n", "[[clients]]\n", "[limits]\n", 'public_url = "', "code_ttl = ", "1", '"', "\n", "=", "[", "]"]
), max_size=20).map("".join))
def test_any_config_file_loads_or_gives_a_one_line_error(tmp_path_factory, text):
    path = tmp_path_factory.getbasetemp() / "loaded.toml"
    path.write_text(text, encoding="utf-8")
    try:
        config = load_config(path)
    except ConfigFileError as e:
        assert str(e) and "\n" not in str(e).strip()
        return
    assert isinstance(config, Config)


@pytest.mark.parametrize("uri", [
    "http://evil.example\\@127.0.0.1/cb",  # a browser goes to evil.example; urlsplit sees 127.0.0.1
    "https://evil.example\\.app.example/cb",
    "http://evil.example@127.0.0.1/cb",
    "https://user:pw@app.example/cb",
    "https://app.example;script-src-elem * 'unsafe-inline'/cb",
    "https://app.example;report-uri=x/cb",
    "https://app.example/c b",
    "https://app.example/cb\u2028",
    "https://bücher.example/cb",
    "https://app.example/cb?x=%zz",
    "com.example.app:/call\\back",
])
def test_a_redirect_uri_holds_only_uri_characters_and_a_plain_host(uri):
    assert redirect_uri_problem(uri)


@pytest.mark.parametrize("uri", [
    "https://app.example/cb?x=%20&y=a+b", "https://xn--bcher-kva.example/cb", "http://127.0.0.1:51234/cb",
    "http://[::1]/cb", "https://192.0.2.7/cb", "com.example.app:/callback", "https://app_1.example./cb",
])
def test_plain_redirect_uris_are_kept(uri):
    assert redirect_uri_problem(uri) is None


@pytest.mark.parametrize("uri, origin_, source", [
    ("https://app.example:8443/cb?x=1", "https://app.example:8443", "https://app.example:8443"),
    ("http://127.0.0.1:9001/cb", "http://127.0.0.1:9001", "http://127.0.0.1:9001"),
    ("http://[::1]:9001/cb", "http://[::1]:9001", "http:"),
    ("com.example.app:/callback", "com.example.app:", "com.example.app:"),
])
def test_where_a_form_may_lead_is_a_source_csp_understands(uri, origin_, source):
    assert origin(uri) == origin_
    assert csp_source(origin_) == source
