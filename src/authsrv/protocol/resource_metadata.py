"""
OAuth 2.0 Protected Resource Metadata (RFC 9728) for resource servers that
sit behind authsrv (an MCP server, an API): the document that names authsrv
as the authorization server, where it is published, and the challenge that
points a client at it (docs/resource-servers.md). authsrv serves none of
this itself: each resource server publishes its own.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

WELL_KNOWN = "/.well-known/oauth-protected-resource"


def protected_resource_metadata(
    resource: str, issuer: str, *, scopes: list[str] | None = None, resource_name: str | None = None,
    documentation: str | None = None,
) -> dict:
    """
    The metadata document of C{resource} (its https URL, the value clients
    send as C{resource} and find in the token's C{aud}) protected by the
    authsrv at C{issuer}; bearer tokens in the Authorization header only.
    """
    parts = urlsplit(resource)
    if parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{resource!r} must be an https URL without query or fragment (RFC 9728 section 1.2)")
    document: dict = {
        "resource": resource,
        "authorization_servers": [issuer],
        "bearer_methods_supported": ["header"],
    }
    if scopes is not None:
        document["scopes_supported"] = list(scopes)
    if resource_name is not None:
        document["resource_name"] = resource_name
    if documentation is not None:
        document["resource_documentation"] = documentation
    return document


def metadata_url(resource: str) -> str:
    """Where C{resource} publishes its metadata: the well-known path before the resource's own (section 3.1)."""
    parts = urlsplit(resource)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN + path, "", ""))


def bearer_challenge(resource: str, error: str | None = None) -> str:
    """
    The C{WWW-Authenticate} value of a 401 from C{resource}: a Bearer
    challenge whose C{resource_metadata} tells the client where to start
    (section 5.1), as MCP clients expect.
    """
    challenge = f'Bearer resource_metadata="{metadata_url(resource)}"'
    return challenge + (f', error="{error}"' if error else "")
