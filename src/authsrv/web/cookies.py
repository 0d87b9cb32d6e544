"""
The service's cookies: opaque values, HttpOnly, SameSite=Lax. Under an
https issuer they are Secure, named with the C{__Host-} prefix (which the
browser accepts only with Secure, Path=/ and no Domain, so no other host or
path can plant or shadow them) and so scoped to the whole host; under plain
http (loopback) they keep their bare names, scoped to the issuer's path.
"""

from __future__ import annotations

from authsrv.flows.outcomes import Browser, CookieChanges

SESSION_COOKIE = b"authsrv_session"
DEVICE_COOKIE = b"authsrv_device"
DEVICE_COOKIE_TTL = 400 * 86400
"""The longest cookie life browsers keep; the device cookie only binds forms to this browser."""
ENROLMENT_COOKIE = b"authsrv_enrolment"
"""
The new authenticator a page showed, sealed, so that a reload shows the same
key and recovery codes; cleared once confirmed, so that after a reset of the
user's factors (a lost phone) no page shows that key again.
"""
RECOVERY_COOKIE = b"authsrv_recovery"
"""New recovery codes, sealed, on their way to the one page that shows them."""
TAB_COOKIE = b"authsrv_tab_"
"""The prefix of a first request's copy of a new device secret (L{authsrv.flows.outcomes.TabSecret})."""
HOST_PREFIX = b"__Host-"


class Cookies:
    """Reads and writes the service's cookies for one issuer."""

    def __init__(self, *, path: str, secure: bool, session_ttl: int = 0):
        self._path = b"/" if secure else path.encode()
        self._secure = secure
        self._prefix = HOST_PREFIX if secure else b""
        self._session_ttl = session_ttl

    def browser(self, request) -> Browser:
        """The service's cookies this request carries."""
        agent = request.getHeader(b"user-agent")
        return Browser(session=self.get(request, SESSION_COOKIE), device=self.get(request, DEVICE_COOKIE),
                       tabs=self._tabs(request), user_agent=agent.decode("utf-8", "replace") if agent else None)

    def _tabs(self, request) -> dict[str, str]:
        """The first requests' device secrets this request carries, by their requests' keys."""
        prefix = self._prefix + TAB_COOKIE
        tabs = {}
        for name in request.received_cookies:
            if name.startswith(prefix) and (value := self.get(request, name[len(self._prefix):])):
                tabs[name[len(prefix):].decode("ascii", "replace")] = value
        return tabs

    def apply(self, request, changes: CookieChanges) -> None:
        """
        Set what a flow's answer asks for. Signing out also drops the sealed
        second-factor secrets (an enrolment's key, new recovery codes), so a
        shared computer keeps nothing of the last user's second factor.
        """
        if changes.end_session:
            self.clear(request, SESSION_COOKIE)
            self.clear(request, RECOVERY_COOKIE)
        if changes.session is not None:
            self.set(request, SESSION_COOKIE, changes.session, self._session_ttl)
        if changes.device is not None:
            self.set(request, DEVICE_COOKIE, changes.device, DEVICE_COOKIE_TTL)
        if changes.tab is not None:
            self.set(request, TAB_COOKIE + changes.tab.key.encode("ascii"), changes.tab.secret, changes.tab.ttl)
        if changes.end_enrolment or changes.end_session:
            self.clear(request, ENROLMENT_COOKIE)

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
