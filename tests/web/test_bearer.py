"""
The shared-secret bearer check of the internal and admin APIs
(L{authsrv.web.bearer.BearerSecret}): the scheme in any case, the secret
exactly, and nothing else.
"""

from __future__ import annotations

import pytest
from twisted.web.test.requesthelper import DummyRequest

from authsrv.web.bearer import BearerSecret

SECRET = "internal-secret-0123456789abcdef"


def request_with(authorization: bytes | None) -> DummyRequest:
    request = DummyRequest([b""])
    if authorization is not None:
        request.requestHeaders.setRawHeaders(b"authorization", [authorization])
    return request


@pytest.mark.parametrize("authorization", [
    b"Bearer " + SECRET.encode(),
    b"bearer " + SECRET.encode(),
    b"BEARER " + SECRET.encode() + b"  ",
])
def test_the_secret_as_a_bearer_token_passes(authorization):
    assert BearerSecret(SECRET).presented_by(request_with(authorization))


@pytest.mark.parametrize("authorization", [
    None,
    b"",
    b"Bearer",
    b"Bearer ",
    b"Bearer " + SECRET[:-1].encode(),
    b"Bearer " + SECRET.encode() + b"x",
    b"Basic " + SECRET.encode(),
    SECRET.encode(),
    b"Bearer\t" + SECRET.encode(),
])
def test_anything_else_is_refused(authorization):
    assert not BearerSecret(SECRET).presented_by(request_with(authorization))
