"""
The service's cookies: opaque values, HttpOnly, SameSite=Lax. Under an
https issuer they are Secure, named with the C{__Host-} prefix (which the
browser accepts only with Secure, Path=/ and no Domain, so no other host or
path can plant or shadow them) and so scoped to the whole host; under plain
http (loopback) they keep their bare names, scoped to the issuer's path.
"""

from __future__ import annotations

SESSION_COOKIE = b"authsrv_session"
DEVICE_COOKIE = b"authsrv_device"
HOST_PREFIX = b"__Host-"


class Cookies:
    """Reads and writes the service's cookies for one issuer."""

    def __init__(self, *, path: str, secure: bool):
        self._path = b"/" if secure else path.encode()
        self._secure = secure
        self._prefix = HOST_PREFIX if secure else b""

    def get(self, request, name: bytes) -> str | None:
        value = request.getCookie(self._prefix + name)
        if not value:
            return None
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return None

    def set(self, request, name: bytes, value: str, max_age: int) -> None:
        request.addCookie(
            self._prefix + name,
            value.encode("ascii"),
            path=self._path,
            max_age=str(max_age).encode(),
            httpOnly=True,
            secure=self._secure,
            sameSite="lax",
        )

    def clear(self, request, name: bytes) -> None:
        request.addCookie(
            self._prefix + name,
            b"",
            path=self._path,
            max_age=b"0",
            expires=b"Thu, 01 Jan 1970 00:00:00 GMT",
            httpOnly=True,
            secure=self._secure,
            sameSite="lax",
        )
