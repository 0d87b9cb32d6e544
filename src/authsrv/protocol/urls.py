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
    """The scheme, host and port of an absolute URI (RFC 6454), as CSP source lists name them."""
    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
