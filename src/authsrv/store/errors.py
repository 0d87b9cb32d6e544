"""Errors a store raises."""

from __future__ import annotations

from twisted.internet.defer import FirstError
from twisted.python.failure import Failure


class AlreadyExists(Exception):
    """A record with that key exists already."""


class AlreadyLinked(AlreadyExists):
    """
    The chat-platform account is linked to another user: one provider
    account names one user, or two users' C{chat_user_id} would be the same.
    """

    @classmethod
    def of(cls, provider: str, provider_user_id: str) -> AlreadyLinked:
        return cls(f"{provider} account {provider_user_id!r} is linked to another user")


class StoreUnavailable(Exception):
    """The store cannot be reached or answered with an error."""


def outage_of(failure: Failure) -> StoreUnavailable | None:
    """The store's outage behind C{failure}, that of one of several gathered calls included; None for anything else."""
    error = failure.value.subFailure.value if failure.check(FirstError) else failure.value
    return error if isinstance(error, StoreUnavailable) else None
