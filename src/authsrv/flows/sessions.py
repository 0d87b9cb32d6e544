"""
Browser sessions at the service: an opaque random cookie value, stored only
as its hash, and a check of the user's standing on every use so that a ban
or a disabled account ends the session at once (docs/design.md, Bans).
"""

from __future__ import annotations

import attrs

from authsrv import events
from authsrv.flows.standing import standing
from authsrv.records import ACR_PWD, PASSWORD_AMR, BrowserSession
from authsrv.tokens import new_token, token_hash


LAST_SEEN_STEP = 60
"""A session's last use is recorded to this many seconds: a store write at most once a minute."""
USER_AGENT_MAX = 300


def new_session(limits, sub: str, now: int, amr: tuple[str, ...] = PASSWORD_AMR, acr: str = ACR_PWD, *,
                address: str | None = None, user_agent: str | None = None) -> tuple[str, BrowserSession]:
    """
    A new session authenticated now by C{amr} at C{acr}, from the browser
    C{user_agent} at C{address} (for the account page): (cookie value,
    session), for the caller to store with what it writes beside it.
    """
    value = new_token()
    session = BrowserSession(
        session_hash=token_hash(value),
        sid=new_token(16),
        sub=sub,
        auth_time=now,
        created_at=now,
        expires_at=now + limits.session_ttl,
        amr=amr,
        acr=acr,
        user_agent=user_agent[:USER_AGENT_MAX] if user_agent else None,
        address=address,
        last_seen=now,
    )
    return value, session


async def step_up_session(store, session: BrowserSession, amr: tuple[str, ...], acr: str,
                          now: int) -> tuple[str, BrowserSession] | None:
    """
    The same session (its sid, so its clients' logout still names it)
    authenticated again now by C{amr} at C{acr}, under a new cookie value:
    a raised session never keeps the cookie it had before. None when the
    session ended since it was read (signed out elsewhere): it stays ended.
    The raised session is stored before the old one ends, so an operator
    ending the user's sessions between the two steps ends it too, or the
    old one first, which this finds gone, and it then ends the raised one.
    """
    value = new_token()
    raised = attrs.evolve(session, session_hash=token_hash(value), auth_time=now, amr=amr, acr=acr)
    await store.create_session(raised)
    if await store.end_session(session.session_hash) is None:
        await store.end_session(raised.session_hash)
        return None
    return value, raised


async def end_browser_session(store, cookie_value: str | None, reason: str,
                              address: str | None) -> BrowserSession | None:
    """End the session a cookie names, if any, at a request from C{address}; fires with the ended session."""
    if not cookie_value:
        return None
    session = await store.end_session(token_hash(cookie_value))
    if session is not None:
        events.session_ended(sub=session.sub, session_id=session.sid, reason=reason, address=address)
    return session


async def live_session(store, identity, cookie_value: str | None, now: int,
                       sessions: SessionEnder) -> BrowserSession | None:
    """
    The unexpired session a cookie names, if its user may still use the
    service; a banned, disabled or vanished user's session is ended here,
    by C{sessions}, so that its clients hear of it by back-channel logout
    as of a ban: a user disabled in the identity backend is seen to be only
    when next looked at.
    """
    if not cookie_value:
        return None
    session = await store.get_session(token_hash(cookie_value), now)
    if session is None:
        return None
    if not (await standing(identity, store, session.sub, now)).allowed:
        await sessions.end(cookie_value, "user banned, disabled or removed", None)  # the ban's doing
        return None
    if session.last_seen is None or now - session.last_seen >= LAST_SEEN_STEP:
        await store.touch_session(session.session_hash, now)
        session = attrs.evolve(session, last_seen=now)
    return session


class SessionEnder:
    """
    Ends browser sessions and tells the clients they signed in to, by
    back-channel logout, without anyone waiting: C{notify(session)} starts
    the notices (L{authsrv.flows.backchannel.BackchannelNotifier}).
    """

    def __init__(self, *, store, notify):
        self._store = store
        self._notify = notify

    async def end(self, cookie_value: str | None, reason: str, address: str | None) -> BrowserSession | None:
        """
        End the session a cookie names, if any; fires with the ended
        session. C{address}: the browser's whose request ended it, for the
        audit event (None when it ends for a ban).
        """
        session = await end_browser_session(self._store, cookie_value, reason, address)
        if session is not None:
            self._notify(session)
        return session

    async def replace(self, cookie_value: str | None, sub: str, now: int, address: str) -> BrowserSession | None:
        """
        At a new sign-in of C{sub}, end the session the browser's cookie
        names, if any. One of another user (or expired) ends as in L{end},
        its clients told; an unexpired one of C{sub} itself is returned, with
        no notice, for the new session to carry on under its sid: signing in
        again (prompt=login, max_age, the account page's "Sign in again")
        re-authenticates the user, and must not log them out of every other
        client of the session (those hear of its real end, by that sid).
        C{address} is the signing-in browser's.
        """
        if not cookie_value:
            return None
        session = await self._store.end_session(token_hash(cookie_value))
        if session is None:
            return None
        if session.sub == sub and session.expires_at > now:
            return session
        events.session_ended(sub=session.sub, session_id=session.sid, reason="logged in again", address=address)
        self._notify(session)
        return None

    async def end_session(self, session: BrowserSession, reason: str, address: str) -> bool:
        """
        End a session known by its record (one the account page listed) at
        a request from C{address}; False when it had ended.
        """
        ended = await self._store.end_session(session.session_hash)
        if ended is None:
            return False
        events.session_ended(sub=ended.sub, session_id=ended.sid, reason=reason, address=address)
        self._notify(ended)
        return True
