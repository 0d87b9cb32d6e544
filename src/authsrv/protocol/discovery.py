"""
OpenID Provider metadata (OIDC Discovery 1.0) and OAuth 2.0 authorization
server metadata (RFC 8414): what the server truthfully supports, built once
at start from the issuer and the keystore's algorithms.
"""

from __future__ import annotations

from authsrv.protocol.client_assertion import ASSERTION_ALGS, HMAC_ALGS
from authsrv.protocol.clientauth import CLIENT_SECRET_JWT, PRIVATE_KEY_JWT
from authsrv.protocol.device import DEVICE_CODE_GRANT
from authsrv.protocol.oidc import ACR_VALUES

SCOPES = ("openid", "profile", "email", "offline_access")

CLAIMS = (
    "sub", "iss", "aud", "exp", "iat", "auth_time", "nonce", "at_hash", "sid", "amr", "acr",
    "name", "picture", "email", "email_verified", "chat_user_id",
)

CLIENT_AUTH_METHODS = ("client_secret_basic", "client_secret_post")


def endpoints(issuer: str) -> dict[str, str]:
    """Every endpoint of the contract, by its metadata name."""
    return {
        "authorization_endpoint": f"{issuer}/oauth2/authorize",
        "token_endpoint": f"{issuer}/oauth2/token",
        "userinfo_endpoint": f"{issuer}/oauth2/userinfo",
        "jwks_uri": f"{issuer}/jwks",
        "end_session_endpoint": f"{issuer}/oauth2/end-session",
        "revocation_endpoint": f"{issuer}/oauth2/revoke",
        "introspection_endpoint": f"{issuer}/oauth2/introspect",
    }


def pushed_request_endpoint(issuer: str) -> str:
    """The pushed authorization request endpoint (RFC 9126 section 2): also an aud its client assertions may name."""
    return f"{issuer}/oauth2/par"


def pushed_request_metadata(issuer: str, offered: bool, required: bool) -> dict:
    """RFC 9126 section 5, only when pushed requests are offered."""
    if not offered:
        return {}
    return {
        "pushed_authorization_request_endpoint": pushed_request_endpoint(issuer),
        "require_pushed_authorization_requests": required,
    }


def advertised_assertion_algs(used: frozenset[str], sealing: bool, registrable: bool) -> tuple[str, ...]:
    """
    What discovery lists for client assertions (and so which assertion
    methods): the asymmetric algorithms while some client uses
    private_key_jwt; the HMAC ones only when the server can seal secrets
    (C{sealing}) and some client uses client_secret_jwt or may register with
    it (C{registrable}): without the key no such client can authenticate.
    """
    hmac_offered = sealing and (registrable or CLIENT_SECRET_JWT in used)
    return (ASSERTION_ALGS if PRIVATE_KEY_JWT in used else ()) + (HMAC_ALGS if hmac_offered else ())


def authorization_server_metadata(
    issuer: str, algorithms: tuple[str, ...], grant_types: tuple[str, ...], pushed: dict | None = None,
    assertion_algs: tuple[str, ...] = (), dpop_algs: tuple[str, ...] = (),
) -> dict:
    """
    RFC 8414 metadata; the OIDC document extends it. C{grant_types} are the
    token endpoint's (the device authorization endpoint is listed with its
    grant); C{pushed} is L{pushed_request_metadata}'s; C{assertion_algs},
    what a client assertion may be signed with (L{advertised_assertion_algs}),
    which also decides the assertion methods listed; C{dpop_algs} the DPoP
    proof algorithms, when DPoP is offered.
    """
    offered = endpoints(issuer)
    if DEVICE_CODE_GRANT in grant_types:
        offered["device_authorization_endpoint"] = f"{issuer}/oauth2/device-authorization"
    methods = [
        *CLIENT_AUTH_METHODS,
        *([PRIVATE_KEY_JWT] if any(alg not in HMAC_ALGS for alg in assertion_algs) else []),
        *([CLIENT_SECRET_JWT] if any(alg in HMAC_ALGS for alg in assertion_algs) else []),
    ]
    metadata = {
        **(pushed or {}),
        "issuer": issuer,
        **offered,
        "scopes_supported": list(SCOPES),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": list(grant_types),
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": [*methods, "none"],
        "revocation_endpoint_auth_methods_supported": [*methods, "none"],
        "introspection_endpoint_auth_methods_supported": methods,
        "authorization_response_iss_parameter_supported": True,
        "id_token_signing_alg_values_supported": list(algorithms),
    }
    if assertion_algs:
        for endpoint in ("token_endpoint", "revocation_endpoint", "introspection_endpoint"):
            metadata[f"{endpoint}_auth_signing_alg_values_supported"] = list(assertion_algs)
    if dpop_algs:
        metadata["dpop_signing_alg_values_supported"] = list(dpop_algs)
    return metadata


def openid_configuration(
    issuer: str, algorithms: tuple[str, ...], grant_types: tuple[str, ...], pushed: dict | None = None,
    assertion_algs: tuple[str, ...] = (), dpop_algs: tuple[str, ...] = (), *, signed_userinfo: bool = False,
) -> dict:
    """
    The OIDC discovery document; C{userinfo_signing_alg_values_supported}
    only when C{signed_userinfo}, since UserInfo answers plain JSON otherwise.
    """
    signing = {"userinfo_signing_alg_values_supported": list(algorithms)} if signed_userinfo else {}
    return {
        **authorization_server_metadata(issuer, algorithms, grant_types, pushed, assertion_algs, dpop_algs),
        "subject_types_supported": ["public"],
        "claims_supported": list(CLAIMS),
        "prompt_values_supported": ["none", "login", "consent"],
        "acr_values_supported": list(ACR_VALUES),
        "claims_parameter_supported": True,
        "request_parameter_supported": False,
        "request_uri_parameter_supported": False,
        "backchannel_logout_supported": True,
        "backchannel_logout_session_supported": True,
        **signing,
    }


def registration_metadata(issuer: str, registration: bool, metadata_documents: bool) -> dict:
    """
    What discovery says of clients that register themselves, only when
    offered: RFC 7591's endpoint, and client ID metadata documents.
    """
    offered: dict = {}
    if registration:
        offered["registration_endpoint"] = f"{issuer}/oauth2/register"
    if metadata_documents:
        offered["client_id_metadata_document_supported"] = True
    return offered
