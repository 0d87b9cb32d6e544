"""
The distinct ways a password check can fail (ARCHITECTURE.md 3.2): a wrong
password stops, an unknown user lets a chain try the next backend, and an
outage is never reported to the user as a wrong password.
"""

from twisted.cred.error import UnauthorizedLogin


class UnknownUser(UnauthorizedLogin):
    """No user has that login name in this backend."""


class BackendUnavailable(Exception):
    """The backend could not answer (directory or database down)."""
