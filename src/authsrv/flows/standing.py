"""
Whether a user may still use the service: known to the identity backend,
not disabled there, not banned in the store (docs/design.md, Bans). Asked on
login, refresh, UserInfo and introspection, so a ban takes effect at once.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from authsrv.records import Ban, User

_ASK_THE_STORE: Any = object()


@frozen
class Standing:
    user: User | None
    banned: bool
    ban_reason: str | None

    @property
    def allowed(self) -> bool:
        return self.user is not None and not self.banned


async def standing(identity, store, sub: str, now: int, ban: Ban | None = _ASK_THE_STORE) -> Standing:
    """
    The user's record and ban state; a disabled account counts as banned.
    Pass C{ban} when a store lookup already read it (a token's C{user_ban}),
    to save the round trip.
    """
    user = await identity.user_by_id(sub)
    if user is not None and user.disabled:
        return Standing(user, True, user.disabled_reason)
    if ban is _ASK_THE_STORE:
        ban = await store.get_ban(sub, now)
    if ban is not None and ban.in_force(now):
        return Standing(user, True, ban.reason)
    return Standing(user, False, None)
