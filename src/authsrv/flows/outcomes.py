"""
What the browser-facing flows answer, as values: the web layer renders each
one (a redirect, a form, a notice) and sets the cookies it names, and
decides nothing itself. Refusals are L{authsrv.protocol.errors.PageError}.
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import field, frozen


@frozen
class Browser:
    """
    The service's cookies a browser sent: the session, the device secret,
    and the device secrets of its first requests' tabs (L{TabSecret}), by key.
    """

    session: str | None = None
    device: str | None = None
    tabs: Mapping[str, str] = field(factory=dict)
    user_agent: str | None = None
    """Not a cookie: the User-Agent header, which names the device of a new session."""


@frozen
class TabSecret:
    """
    A device secret made for a browser that sent none, kept as well under a
    name of its own request (C{key}) for that request's life (C{ttl}): two
    tabs' first requests race, each answer sets a new device cookie and the
    last one stays, so the other tab's form is bound by this one instead.
    """

    key: str
    secret: str = field(repr=False)
    ttl: int


@frozen
class CookieChanges:
    """
    Cookies to set with the answer: a new session cookie value (or
    C{end_session} to clear it, and with it the sealed enrolment and
    recovery codes), a new device secret, and C{end_enrolment} to drop the
    authenticator enrolment the browser kept (once confirmed); C{tab}, a new
    device secret's copy for its request's form (L{TabSecret}).
    """

    session: str | None = None
    end_session: bool = False
    device: str | None = None
    end_enrolment: bool = False
    tab: TabSecret | None = None


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
    passkey_options: str | None = None
    """The JSON WebAuthn request options of a passkey sign-in, when passkeys are on."""
    cookies: CookieChanges = CookieChanges()
    """A new device secret, when the form is the authorization request's own answer."""


@frozen
class SecondFactorForm:
    """
    Asks for a TOTP or recovery code after the password, or one of the
    user's passkeys (C{passkey_options}, when they have one); C{message}
    and C{retry_after} as for login; C{code} whether a code may be given.
    """

    status: int
    client_name: str
    interaction_id: str
    csrf: str
    client_origin: str
    message: str | None = None
    retry_after: int | None = None
    passkey_options: str | None = None
    code: bool = True


@frozen
class EnrolmentForm:
    """
    A new authenticator to set up: the secret (as text and as the otpauth
    URI its QR code shows) and the recovery codes, posted back sealed
    (C{sealed}) with C{fields} (the CSRF token, and the sign-in's request
    id) to confirm with a first code. C{grace_until} is set when the user
    may put it off; C{client_origin} when the form ends at a client;
    C{recovery_csrf} when the user has an authenticator already, which this
    one would replace, and may ask for new recovery codes with that token.
    """

    status: int
    user_label: str
    secret: str
    otpauth_uri: str
    recovery_codes: tuple[str, ...]
    sealed: str
    fields: tuple[tuple[str, str], ...]
    client_name: str | None = None
    client_origin: str | None = None
    grace_until: int | None = None
    recovery_csrf: str | None = None
    message: str | None = None


@frozen
class NewRecoveryCodes:
    """
    A new set of recovery codes made, C{sealed} for the page that shows them
    once (Post/Redirect/Get: a reload of that page makes no other set).
    """

    sealed: str


@frozen
class RecoveryCodes:
    """
    New recovery codes, shown this once; none when they were shown already,
    with C{csrf} for the form that asks for another set on purpose.
    """

    codes: tuple[str, ...]
    csrf: str


@frozen
class ConsentForm:
    """
    C{client_origin} is where the answer sends the browser: the page's forms
    may lead there. C{unvetted}: the client registered itself, so its name
    proves nothing and the page says where the answer goes.
    """

    client_name: str
    user_label: str
    scope: tuple[str, ...]
    interaction_id: str
    csrf: str
    client_origin: str
    unvetted: bool = False


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


@frozen
class DeviceCodeForm:
    """The device verification page asking for the code a device shows (RFC 8628 section 3.3)."""

    status: int = 200
    user_code: str = ""
    message: str | None = None
    retry_after: int | None = None


@frozen
class DeviceConsent:
    """
    The device verification page once a signed-in user gave a live code:
    the code to compare with the device's, the client and the scopes, and a
    form posting C{user_code} back with C{csrf} to approve or deny.
    """

    client_name: str
    user_label: str
    scope: tuple[str, ...]
    user_code: str
    csrf: str
