"""
Pushed authorization requests (RFC 9126): a client sends its authorization
request to the server first, over its authenticated back channel, and the
browser then brings only C{client_id} and the C{request_uri} it got back.
The request is validated when pushed exactly as the authorization endpoint
validates a query (L{authsrv.protocol.authorize.parse_request}), and again
when it is used, so a client changed in between is judged as it is then.

Pure: request arguments and records in, values or errors out.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

from authsrv.protocol.authorize import AuthorizeError, parse_request, unsafe
from authsrv.protocol.errors import InvalidRequest, PageError
from authsrv.protocol.params import single_params
from authsrv.protocol.profiles import FAPI2
from authsrv.records import Client

REQUEST_URI_PREFIX = "urn:ietf:params:oauth:request_uri:"
"""RFC 9126 section 2.2's recommended form of the reference handed out."""
REQUEST_URI_TTL = 60
"""Seconds a pushed request waits to be used (RFC 9126 section 2.2: short; FAPI 2.0: under 600)."""
CREDENTIAL_PARAMS = frozenset({b"client_secret", b"client_assertion", b"client_assertion_type"})
"""Client authentication fields of the push: checked, never kept with the request."""
UNUSABLE = (
    "The sign-in request the application sent expired or was used already (invalid_request_uri);"
    " start again from the application."
)


def must_push(client: Client, everyone: bool) -> bool:
    """Whether the client's authorization requests must arrive pushed (RFC 9126 section 5)."""
    return everyone or client.require_pushed_authorization_requests or client.profile == FAPI2


def unoffered_push(client: Client, offered: bool) -> tuple[str, str] | None:
    """
    (setting, problem) when the client is held to pushed requests on a
    server that offers none, so it could never sign anyone in; else None.
    """
    if offered or not (client.profile is not None or client.require_pushed_authorization_requests):
        return None
    field = "profile" if client.profile is not None else "require_pushed_authorization_requests"
    return field, "needs pushed authorization requests, which this server does not offer ([par] enabled = true)"


def push_params(args: dict[bytes, list[bytes]]) -> dict[str, str]:
    """
    A push's fields other than C{resource} (which may repeat, RFC 8707),
    for client authentication; raises L{InvalidRequest} for any other
    repeated field.
    """
    return single_params({name: values for name, values in args.items() if name != b"resource"})


def pushed_query(client: Client, args: dict[bytes, list[bytes]]) -> str:
    """
    The pushed request of an authenticated C{client}, validated as the
    authorization endpoint would, form-encoded for the store without its
    credentials and with the client's id; raises L{InvalidRequest} (or the
    request's own OAuth error) for a request the endpoint would refuse.
    """
    if b"request_uri" in args:
        raise InvalidRequest("request_uri cannot be pushed (RFC 9126 section 2.1)")
    kept = {name: values for name, values in args.items() if name not in CREDENTIAL_PARAMS}
    kept[b"client_id"] = [client.client_id.encode()]
    try:
        parse_request(client, kept)
    except PageError as e:
        raise InvalidRequest(e.message) from None
    except AuthorizeError as e:
        raise e.error from None
    return urlencode([(name, value) for name, values in kept.items() for value in values])


def request_uri_of(args: dict[bytes, list[bytes]]) -> str:
    """The one C{request_uri} of an authorization request, or L{PageError}: there is nowhere safe to redirect to."""
    values = args.get(b"request_uri", [])
    if len(values) != 1:
        raise unsafe(UNUSABLE)
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise unsafe(UNUSABLE) from None


def pushed_args(query: str) -> dict[bytes, list[bytes]]:
    """A stored pushed request as the arguments of an authorization request."""
    return {
        name.encode(): [value.encode() for value in values]
        for name, values in parse_qs(query, keep_blank_values=True).items()
    }
