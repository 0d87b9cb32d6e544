"""
The first-party user-access check (SERVICE-INTERFACE.md, User access status):
allowed exactly while the user is not banned and still holds an active grant.
"""

from __future__ import annotations

from authsrv.flows.standing import standing


async def user_access(identity, store, sub: str, now: int) -> dict | None:
    """The status payload, or None when the identity backend has no such user."""
    state = await store.access_state(sub, now)
    user = await standing(identity, store, sub, now, ban=state.ban)
    if user.user is None:
        return None
    return {
        "allowed": not user.banned and state.has_active_grant,
        "banned": user.banned,
        "banReason": user.ban_reason,
        "hasActiveGrant": state.has_active_grant,
    }
