"""
The user as ID tokens and UserInfo describe them (docs/design.md, UserInfo
fields): the identity backend's record, with the chat account linked at
this service winning over the one the backend knows.
"""

from __future__ import annotations

from attrs import evolve

from authsrv.chat.tokens import linked_chat_user_id
from authsrv.records import User


class ClaimsSource:
    """C{chat_provider} is the configured chat platform's name, or None when there is none."""

    def __init__(self, store, chat_provider: str | None):
        self._store = store
        self._chat_provider = chat_provider

    async def user(self, user: User) -> User:
        if self._chat_provider is None:
            return user
        return evolve(user, chat_user_id=await linked_chat_user_id(self._store, user, self._chat_provider))
