"""
The service's cookies: opaque values, HttpOnly, SameSite=Lax, Secure when
the issuer is https, scoped to the issuer's path.
"""

from __future__ import annotations

SESSION_COOKIE = b"authsrv_session"
DEVICE_COOKIE = b"authsrv_device"


class Cookies:
    """Reads and writes the service's cookies for one issuer."""

    def __init__(self, *, path: str, secure: bool):
        self._path = path.encode()
        self._secure = secure

    def get(self, request, name: bytes) -> str | None:
        value = request.getCookie(name)
        if not value:
            return None
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return None

    def set(self, request, name: bytes, value: str, max_age: int) -> None:
        request.addCookie(
            name,
            value.encode("ascii"),
            path=self._path,
            max_age=str(max_age).encode(),
            httpOnly=True,
            secure=self._secure,
            sameSite="lax",
        )

    def clear(self, request, name: bytes) -> None:
        request.addCookie(
            name,
            b"",
            path=self._path,
            max_age=b"0",
            expires=b"Thu, 01 Jan 1970 00:00:00 GMT",
            httpOnly=True,
            secure=self._secure,
            sameSite="lax",
        )
