"""
Security profiles a client can be held to (its C{profile}); so far the FAPI
2.0 Security Profile (docs/fapi2.md). A profile is a set of demands on the
client's settings, checked wherever a client is made or changed (config
file, admin API, operator command), plus what the flows enforce at run time
for such a client: pushed requests only (L{authsrv.protocol.pushed.must_push}),
a code lifetime of at most L{FAPI2_CODE_TTL} and client assertions signed
with one of L{FAPI2_ASSERTION_ALGORITHMS}, naming the issuer alone as their
audience.

Some demands name settings that other features bring (key-based client
authentication, DPoP, per-client signing algorithms). A setting this build
does not have is a capability the server lacks, so the profile is refused
with that said, never silently weakened.

Pure: records in, problems out.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import attrs

from authsrv.protocol.client_assertion import ASSERTION_ALGS
from authsrv.protocol.clients import is_loopback_host
from authsrv.records import Client

FAPI2 = "fapi2"
"""The FAPI 2.0 Security Profile."""
PROFILES = (FAPI2,)
FAPI2_CODE_TTL = 60
"""FAPI 2.0 section 5.3.2.1: authorization codes live at most 60 seconds."""
FAPI2_ALGORITHMS = ("ES256", "PS256")
"""The signing algorithms a FAPI 2.0 client's tokens may use here."""
FAPI2_ASSERTION_ALGORITHMS = ("PS256", "ES256", "EdDSA")
"""FAPI 2.0 section 5.4.1: what a client's private_key_jwt assertion may be signed with (never RS256)."""

_FAPI2_SETTINGS: tuple[tuple[str, tuple, str], ...] = (
    ("token_endpoint_auth_method", ("private_key_jwt",),
     "must be private_key_jwt: FAPI 2.0 clients authenticate with a key (mTLS is not offered)"),
    ("dpop_bound_access_tokens", (True,),
     "must be true: FAPI 2.0 access tokens are sender-constrained (DPoP; mTLS is not offered)"),
    ("id_token_signed_response_alg", FAPI2_ALGORITHMS, "must be ES256 or PS256 under FAPI 2.0"),
    ("access_token_signed_response_alg", FAPI2_ALGORITHMS, "must be ES256 or PS256 under FAPI 2.0"),
    ("userinfo_signed_response_alg", (None, *FAPI2_ALGORITHMS), "must be unset, ES256 or PS256 under FAPI 2.0"),
)
"""(setting, values allowed, problem): the client settings FAPI 2.0 decides."""


def profile_problems(client: Client) -> list[tuple[str, str]]:
    """(setting, problem) for each way the client falls short of its profile; empty when it meets it."""
    if client.profile != FAPI2:
        return []
    problems = []
    if client.is_public:
        problems.append(("public", "must be false: FAPI 2.0 allows confidential clients only (this one has no secret)"))
    if any(_plain_http(uri) for uri in client.redirect_uris):
        problems.append(("redirect_uris", "must use https under FAPI 2.0 (plain http only on the loopback interface)"))
    have = attrs.fields_dict(type(client))
    for setting, allowed, problem in _FAPI2_SETTINGS:
        if setting not in have:
            problems.append((setting, "is needed by FAPI 2.0 but this server has no such client setting"))
        elif getattr(client, setting) not in allowed:
            problems.append((setting, problem))
    return problems


def _plain_http(uri: str) -> bool:
    """FAPI 2.0 section 5.3.2.2: no authorization response over plain http, except to a loopback address."""
    parts = urlsplit(uri)
    return parts.scheme == "http" and not is_loopback_host(parts.hostname or "")


def code_ttl_for(client: Client, code_ttl: int) -> int:
    """The lifetime of the client's authorization codes: the server's, capped by its profile."""
    return min(code_ttl, FAPI2_CODE_TTL) if client.profile == FAPI2 else code_ttl


def assertion_algorithms(client: Client) -> tuple[str, ...]:
    """The algorithms the client's private_key_jwt assertions may use: fewer under its profile."""
    return FAPI2_ASSERTION_ALGORITHMS if client.profile == FAPI2 else ASSERTION_ALGS


def issuer_audience_only(client: Client) -> bool:
    """
    Whether the client's assertions must name the issuer alone, as one
    string (FAPI 2.0 section 5.3.2.1), never an endpoint's URL or a list:
    another server a client also talks to can get it to sign an assertion
    for a URL of ours it claims as its own (audience injection).
    """
    return client.profile == FAPI2
