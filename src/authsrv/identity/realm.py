"""
The twisted.cred realm that turns a checked sub into the user's record.

Callers log in with
C{Portal(UserRealm(backend), [backend]).login(UsernamePassword(login,
password), None, IUser)} and get C{(IUser, user, logout)}, where C{user} is
the L{authsrv.records.User} as the backend knows it at that moment.
"""

from __future__ import annotations

from twisted.cred.portal import IRealm
from twisted.internet.defer import Deferred, maybeDeferred
from zope.interface import implementer

from authsrv.identity.errors import UnknownUser
from authsrv.interfaces import IUser
from authsrv.records import User


def _logout() -> None:
    """Nothing to release: the avatar is a frozen record."""


@implementer(IRealm)
class UserRealm:
    """Avatars are L{User} records read from an L{IIdentityBackend}."""

    def __init__(self, backend):
        self._backend = backend

    # Twisted annotates avatar ids as bytes; this portal's checkers give str subjects.
    def requestAvatar(self, avatarId: str, mind, *interfaces) -> Deferred:  # type: ignore[override]
        if IUser not in interfaces:
            raise NotImplementedError("UserRealm only provides IUser avatars")

        def found(user: User | None):
            if user is None:
                # Removed between the password check and this lookup.
                raise UnknownUser("user no longer exists")
            return (IUser, user, _logout)

        return maybeDeferred(self._backend.user_by_id, avatarId).addCallback(found)
