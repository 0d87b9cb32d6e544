"""
The first-party user-access check (SERVICE-INTERFACE.md, User access status):
allowed exactly while the user is not banned and still holds an active grant.
"""

from __future__ import annotations

from authsrv.flows.standing import standing


async def user_access(identity, store, sub: str, now: int) -> dict | None:
    """The status payload, or None when the identity backend has no such user."""
    state = await standing(identity, store, sub, now)
    if state.user is None:
        return None
    has_grant = await store.has_active_grant(sub, now)
    return {
        "allowed": not state.banned and has_grant,
        "banned": state.banned,
        "banReason": state.ban_reason,
        "hasActiveGrant": has_grant,
    }
