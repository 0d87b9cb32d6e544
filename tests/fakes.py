"""
Stand-ins for the public site's collaborators where a test needs only what
the site itself does: discovery, JWKS, health and the input limits.
"""

from __future__ import annotations

from twisted.cred.checkers import ICredentialsChecker
from twisted.cred.credentials import IUsernamePassword
from twisted.internet.defer import fail, succeed
from zope.interface import implementer


class FakeKeystore:
    algorithms = ("RS256", "ES256")

    def __init__(self):
        self.jwks = b'{"keys":[{"kty":"RSA","kid":"one"}]}'

    def jwks_bytes(self):
        return self.jwks

    def reload(self):
        return succeed(False)


@implementer(ICredentialsChecker)
class FakeIdentity:
    credentialInterfaces = (IUsernamePassword,)
    backends = ()
    names = ()


class FakeStore:
    def __init__(self):
        self.answer = lambda: succeed(None)

    def ping(self):
        return self.answer()


def no_password_hashes(password: str):
    """The account page's hashing on a site whose users have no password to change (no writable backend)."""
    return fail(AssertionError("this site hashes no passwords"))
