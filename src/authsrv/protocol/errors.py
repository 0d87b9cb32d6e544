"""
OAuth and OpenID Connect errors as one class tree (RFC 6749 sections 4.1.2.1
and 5.2, RFC 6750 section 3.1, OIDC Core 3.1.2.6), each knowing its wire code
and HTTP status, so that routes render every failure the same way.
"""

from __future__ import annotations


class OAuthError(Exception):
    """
    An error answered to a client. C{description} is for a developer reading
    it: say what was wrong and how to fix it, never echo a secret.
    """

    error = "invalid_request"
    status = 400

    def __init__(self, description: str):
        super().__init__(description)
        self.description = description

    def body(self) -> dict:
        return {"error": self.error, "error_description": self.description}


class InvalidRequest(OAuthError):
    error = "invalid_request"


class InvalidClient(OAuthError):
    """401 with a WWW-Authenticate challenge (RFC 6749 section 5.2)."""

    error = "invalid_client"
    status = 401


class InvalidGrant(OAuthError):
    error = "invalid_grant"


class UnauthorizedClient(OAuthError):
    error = "unauthorized_client"


class UnsupportedGrantType(OAuthError):
    error = "unsupported_grant_type"


class UnsupportedResponseType(OAuthError):
    error = "unsupported_response_type"


class InvalidScope(OAuthError):
    error = "invalid_scope"


class InvalidTarget(OAuthError):
    """RFC 8707: a resource the client may not request."""

    error = "invalid_target"


class AccessDenied(OAuthError):
    error = "access_denied"
    status = 403


class AuthorizationPending(OAuthError):
    """RFC 8628 section 3.5: the user has not yet approved or denied the device; poll again."""

    error = "authorization_pending"


class SlowDown(OAuthError):
    """RFC 8628 section 3.5: polled too fast; the interval is 5 s longer from now on."""

    error = "slow_down"


class ExpiredToken(OAuthError):
    """RFC 8628 section 3.5: the device code expired; start a new device authorization."""

    error = "expired_token"


class DeviceAccessDenied(OAuthError):
    """RFC 8628 section 3.5: the user denied the device, answered by the token endpoint (400)."""

    error = "access_denied"


class LoginRequired(OAuthError):
    error = "login_required"


class ConsentRequired(OAuthError):
    error = "consent_required"


class RequestNotSupported(OAuthError):
    error = "request_not_supported"


class RequestUriNotSupported(OAuthError):
    error = "request_uri_not_supported"


class TemporarilyUnavailable(OAuthError):
    error = "temporarily_unavailable"
    status = 503


class ServerError(OAuthError):
    """A failure of the server's own, which the client can only retry (RFC 6749 section 4.1.2.1)."""

    error = "server_error"
    status = 500


class InvalidToken(OAuthError):
    """RFC 6750: a missing, unknown, expired or revoked bearer token."""

    error = "invalid_token"
    status = 401


class InvalidBearerRequest(InvalidRequest):
    """
    RFC 6750 section 3.1: a request to a protected resource whose access
    token is sent where it may not be, or more than once. It names no usable
    credential, so it carries a Bearer challenge too (section 3).
    """


class InvalidRedirectURI(OAuthError):
    """RFC 7591 section 3.2.2: a redirect URI a client may not register."""

    error = "invalid_redirect_uri"


class InvalidClientMetadata(OAuthError):
    """RFC 7591 section 3.2.2: a metadata field that is malformed or not allowed."""

    error = "invalid_client_metadata"


class InsufficientScope(OAuthError):
    """
    RFC 6750: the token lacks a scope the resource requires; C{scope}, that
    scope, which section 3 has the challenge name.
    """

    error = "insufficient_scope"
    status = 403

    def __init__(self, description: str, scope: str):
        super().__init__(description)
        self.scope = scope


class PageError(Exception):
    """
    A refusal shown to the person in the browser as a page, never sent to a
    client: an unknown client or redirect URI, an expired form, a forged
    logout hint. C{title} heads the page, C{message} says what to do;
    C{retry_after}, in seconds, is sent as Retry-After.
    """

    def __init__(self, status: int, title: str, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message
        self.retry_after = retry_after


class InvalidDpopProof(OAuthError):
    """RFC 9449 section 5: a DPoP proof that is missing, malformed or does not fit the request."""

    error = "invalid_dpop_proof"


class UseDpopNonce(OAuthError):
    """RFC 9449 section 8: the proof must carry the server's nonce, sent in C{nonce} (the DPoP-Nonce header)."""

    error = "use_dpop_nonce"

    def __init__(self, description: str, nonce: str):
        super().__init__(description)
        self.nonce = nonce


class DpopChallenge(OAuthError):
    """
    A resource's refusal of a DPoP-bound request (RFC 9449 section 7.1):
    C{status} (401 unless said) with a C{WWW-Authenticate: DPoP} challenge
    carrying C{error}, and C{scope} when one is lacking (and C{nonce} as
    DPoP-Nonce when one is asked for).
    """

    status = 401

    def __init__(self, error: str, description: str, nonce: str | None = None, *, status: int = 401,
                 scope: str | None = None):
        super().__init__(description)
        self.error = error
        self.nonce = nonce
        self.status = status
        self.scope = scope

    @classmethod
    def instead_of(cls, error: InvalidToken | InsufficientScope) -> DpopChallenge:
        """C{error}, a bearer refusal, as a DPoP-bound request gets it: the same status, code and scope."""
        return cls(error.error, error.description, status=error.status, scope=getattr(error, "scope", None))
