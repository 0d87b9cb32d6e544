"""
What the browser-facing flows answer, as values: the web layer renders each
one (a redirect, a form, a notice) and sets the cookies it names, and
decides nothing itself. Refusals are L{authsrv.protocol.errors.PageError}.
"""

from __future__ import annotations

from attrs import frozen


@frozen
class Browser:
    """The service's cookies a browser sent: the session and the device secret."""

    session: str | None = None
    device: str | None = None


@frozen
class CookieChanges:
    """
    Cookies to set with the answer: a new session cookie value (or
    C{end_session} to clear it) and a new device secret.
    """

    session: str | None = None
    end_session: bool = False
    device: str | None = None


@frozen
class Redirect:
    location: str
    status: int = 302
    cookies: CookieChanges = CookieChanges()


@frozen
class LoginForm:
    """
    The sign-in form; C{message} says why it is shown again, C{retry_after}
    when throttled; C{client_origin} is where a successful sign-in may lead.
    """

    status: int
    client_name: str
    interaction_id: str
    csrf: str
    client_origin: str
    username: str = ""
    message: str | None = None
    retry_after: int | None = None


@frozen
class ConsentForm:
    """C{client_origin} is where the answer sends the browser: the page's forms may lead there."""

    client_name: str
    user_label: str
    scope: tuple[str, ...]
    interaction_id: str
    csrf: str
    client_origin: str


@frozen
class Notice:
    """A page that tells the user something and offers nothing to do."""

    status: int
    title: str
    message: str
    cookies: CookieChanges = CookieChanges()


@frozen
class LogoutConfirmation:
    """
    Ask before ending a session the request's ID token does not name: a
    form posting C{fields} back with C{csrf}; C{client_origin} is where the
    answer may send the browser.
    """

    client_name: str
    fields: tuple[tuple[str, str], ...]
    csrf: str
    client_origin: str | None
