"""
What an operator does to a user: ban, lift a ban, revoke every grant.

Each function records the change in the store, ends what must end with it,
emits the audit event and returns what happened, so the operator command
and a later admin API share one behaviour and only word the result. The
store plays L{IBanStore}, L{IBrowserSessionStore} and L{IGrantStore}.
C{notify(session)} starts telling the clients an ended browser session
signed in to, by back-channel logout (docs/design.md, Bans): the sessions
end in the store before these functions return, and the deliveries go on
after, bounded by their own retries and timeouts, so that a relying party
that never answers does not hold the operator's answer. Whoever built the
notifier waits for them before closing
(L{authsrv.flows.backchannel.BackchannelNotifier.settle}).
"""

from __future__ import annotations

from attrs import frozen

from authsrv import events
from authsrv.records import Ban


@frozen
class Banned:
    sub: str
    until: int | None
    sessions_ended: int


@frozen
class Revoked:
    sub: str
    grants: int
    sessions_ended: int


async def end_sessions(store, sub: str, notify) -> int:
    """End the user's browser sessions and start telling their clients; how many ended."""
    ended = await store.end_user_sessions(sub)
    for session in ended:
        events.session_ended(sub=sub, session_id=session.sid, reason="operator action", address=None)
        notify(session)
    return len(ended)


async def ban_user(store, sub: str, *, reason: str, until: int | None, now: int, actor: str, notify) -> Banned:
    """Ban C{sub} (until C{until}, or for good) and end their browser sessions at once."""
    await store.ban_user(Ban(sub=sub, reason=reason, created_at=now, until=until))
    events.user_banned(sub=sub, reason=reason, until=until, actor=actor)
    return Banned(sub, until, await end_sessions(store, sub, notify))


async def unban_user(store, sub: str, *, actor: str) -> bool:
    """Lift the ban of C{sub}; False if there was none."""
    if not await store.unban_user(sub):
        return False
    events.user_unbanned(sub=sub, actor=actor)
    return True


async def revoke_user(store, sub: str, *, now: int, actor: str, notify) -> Revoked:
    """Revoke every grant of C{sub} and end their browser sessions."""
    count = await store.revoke_user_grants(sub, now)
    events.user_grants_revoked(sub=sub, count=count, actor=actor)
    return Revoked(sub, count, await end_sessions(store, sub, notify))
