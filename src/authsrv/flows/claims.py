"""
The user as ID tokens and UserInfo describe them (docs/design.md, UserInfo
fields): the identity backend's record, with the chat account linked at
this service winning over the one the backend knows (the user may have
relinked).
"""

from __future__ import annotations

from attrs import evolve

from authsrv.records import NOT_READ, NotRead, User


class ClaimsSource:
    """
    C{link_provider} is the configured chat platform's name, or None when
    there is none: the flows pass it to their token lookups, which then read
    the user's link in the same round trip.
    """

    def __init__(self, store, link_provider: str | None):
        self._store = store
        self.link_provider = link_provider

    async def user(self, user: User, link: str | None | NotRead = NOT_READ) -> User:
        """
        C{link} is the C{linked_user_id} a lookup read for L{link_provider};
        the store is asked only when it was not read. Never cached, so an
        unlink or relink shows at once.
        """
        if self.link_provider is None:
            return user
        if link is NOT_READ:
            account = await self._store.get_linked_account(user.sub, self.link_provider)
            link = None if account is None else account.provider_user_id
        if link is None or link == user.chat_user_id:
            return user
        return evolve(user, chat_user_id=link)
