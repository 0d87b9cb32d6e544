"""
OpenID Provider metadata (OIDC Discovery 1.0) and OAuth 2.0 authorization
server metadata (RFC 8414): what the server truthfully supports, built once
at start from the issuer and the keystore's algorithms.
"""

from __future__ import annotations

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


def authorization_server_metadata(
    issuer: str, algorithms: tuple[str, ...], grant_types: tuple[str, ...], dpop_algs: tuple[str, ...] = (),
) -> dict:
    """
    RFC 8414 metadata; the OIDC document extends it. C{grant_types} are the
    token endpoint's; C{dpop_algs} the DPoP proof algorithms, when DPoP is offered.
    """
    metadata = {
        "issuer": issuer,
        **endpoints(issuer),
        "scopes_supported": list(SCOPES),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": list(grant_types),
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": [*CLIENT_AUTH_METHODS, "none"],
        "revocation_endpoint_auth_methods_supported": [*CLIENT_AUTH_METHODS, "none"],
        "introspection_endpoint_auth_methods_supported": list(CLIENT_AUTH_METHODS),
        "authorization_response_iss_parameter_supported": True,
        "id_token_signing_alg_values_supported": list(algorithms),
    }
    if dpop_algs:
        metadata["dpop_signing_alg_values_supported"] = list(dpop_algs)
    return metadata


def openid_configuration(
    issuer: str, algorithms: tuple[str, ...], grant_types: tuple[str, ...], dpop_algs: tuple[str, ...] = (),
) -> dict:
    """The OIDC discovery document."""
    return {
        **authorization_server_metadata(issuer, algorithms, grant_types, dpop_algs),
        "subject_types_supported": ["public"],
        "claims_supported": list(CLAIMS),
        "prompt_values_supported": ["none", "login", "consent"],
        "acr_values_supported": list(ACR_VALUES),
        "claims_parameter_supported": True,
        "request_parameter_supported": False,
        "request_uri_parameter_supported": False,
        "backchannel_logout_supported": True,
        "backchannel_logout_session_supported": True,
    }
