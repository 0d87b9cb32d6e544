"""Building the URLs the server sends browsers to."""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit, urlunsplit


def with_query(uri: str, params: dict[str, str]) -> str:
    """
    C{uri} with C{params} appended, keeping the query it already has: a
    registered redirect URI may carry one (RFC 6749 section 3.1.2).
    """
    if not params:
        return uri
    parts = urlsplit(uri)
    extra = urlencode(params)
    return urlunsplit(parts._replace(query=f"{parts.query}&{extra}" if parts.query else extra))


def origin(uri: str) -> str:
    """
    The scheme, host and port of an http(s) URI (RFC 6454); of a native
    app's private-use scheme (RFC 8252 section 7.1), the scheme alone.
    """
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return f"{parts.scheme}:"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def csp_source(origin: str) -> str:
    """
    C{origin} as a CSP source expression: a host source cannot name an IPv6
    literal (CSP3 section 2.3.1; Chromium drops it, and the redirect to
    C{http://[::1]:port} would be blocked), so that one is allowed by its scheme.
    """
    scheme, _, host = origin.partition("://")
    return f"{scheme}:" if host.startswith("[") else origin
