"""
What an operator does to users: look one up by id or login, ban and lift a
ban, list and revoke grants, sessions and consents (done by
L{authsrv.flows.moderation} where it already does them), and, for the
identity backends that can write users (L{IUserManagement}), create, set a
password, disable, enable and delete.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from datetime import datetime
from typing import Any, Awaitable, Callable

from attrs import frozen

from authsrv import events
from authsrv.flows import moderation
from authsrv.flows.mfa import reset_factors
from authsrv.identity.credentials import look_alike_key, width_mapped
from authsrv.identity.static import login_key
from authsrv.interfaces import IUserManagement
from authsrv.operations.clientspec import has_controls
from authsrv.operations.errors import Conflict, InvalidInput, NotFound
from authsrv.operations.paging import Page, page, refused_cursor
from authsrv.protocol.password_policy import MIN_LENGTH, password_problem
from authsrv.records import Ban, Consent, LinkedAccount, User

REASON_MAX = 500
NO_WRITABLE_BACKEND = (
    "no [[identity]] backend in the config can write users (a static users file, or PostgreSQL"
    ' in mode "own"): users live elsewhere, manage them there'
)
PROFILE = ("login", "sub", "name", "email", "email_verified", "picture", "chat_user_id", "password")
PICTURE_MAX = 2048
"""The longest picture URL: it goes into every ID token and UserInfo answer of its user."""
TEXT_MAX = 256
"""
The longest login, name, email or chat id: each goes into the users file,
ID tokens, UserInfo and pages (a login as long as the login form's hint).
"""


def picture_problem(picture: str) -> str | None:
    """
    Why C{picture} cannot be a user's picture claim, or None: only a short
    http(s) URL, never a C{data:} URL of megabytes carried by every token.
    """
    if not picture.startswith(("https://", "http://")):
        return "is not an http(s) URL"
    if len(picture) > PICTURE_MAX:
        return f"is over {PICTURE_MAX} characters"
    return None


LATEST_UNTIL = 253402300799
"""9999-12-31T23:59:59Z: later ends fit no date type, nor a store's 64-bit column for long."""


def parse_until(value: Any, now: int, field: str = "until") -> int | None:
    """The end of a ban: null (until lifted), seconds since the epoch or an ISO 8601 time with a zone."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        until = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(f"{field} {value!r} is not an ISO 8601 time such as 2030-01-31T12:00:00Z", field) from None
        if moment.tzinfo is None:
            raise InvalidInput(f"{field} needs a time zone, e.g. 2030-01-31T12:00:00Z", field)
        until = int(moment.timestamp())
    else:
        raise InvalidInput(f"{field} must be an ISO 8601 time, seconds since the epoch, or null", field)
    if until <= now:
        raise InvalidInput(f"{field} is in the past", field)
    if until > LATEST_UNTIL:
        raise InvalidInput(f"{field} is too far ahead: at most 9999-12-31T23:59:59Z (or null, until lifted)", field)
    return until


def path_segment_problem(value: str) -> str | None:
    """
    Why C{value} cannot name a new user (as sub or login), or None: the
    admin API names a user in one path segment (a '/' sent as C{%2F}), and
    a '.' or '..' segment is one that clients and proxies remove from a
    path, so such a user could not be managed there.
    """
    if value in (".", ".."):
        return "must not be '.' or '..': the admin API names a user in its path"
    return None


def _text_problem(value: str) -> str | None:
    """Why C{value} cannot be a user's login, name, email or chat id, or None."""
    if len(value) > TEXT_MAX:
        return f"must be at most {TEXT_MAX} characters (it has {len(value):,})"
    if has_controls(value):
        return "must not hold control characters (such as NUL, a line break or a bidi override)"
    return None


def _check_compatibility(login: str) -> None:
    """
    Refuse a new login holding compatibility forms, which would make it a
    look-alike of another: full-width and half-width ones, which sign-in
    reads as their plain forms (L{width_mapped}), and the others (ligatures,
    font, circled or superscript forms), which a PRECIS username may not
    hold at all (RFC 8264 IdentifierClass, RFC 8265 section 3).
    """
    if (mapped := width_mapped(login)) != login:
        raise InvalidInput(f"login {login!r} holds full-width or half-width forms, which sign-in reads as"
                           f" {mapped!r} (RFC 8265 width mapping): give it as {mapped!r}", "login")
    if (plain := unicodedata.normalize("NFKC", login)) != unicodedata.normalize("NFC", login):
        raise InvalidInput(f"login {login!r} holds compatibility characters (such as a ligature, or a font,"
                           f" circled or superscript form) that a username may not have (RFC 8265): give it as"
                           f" {plain!r}", "login")


def created_after(key: str | None) -> tuple[int, str] | None:
    """
    The (created_at, id) a grants or sessions cursor's key names: the time,
    a space, then the grant id or sid (which may hold spaces itself).
    """
    if key is None:
        return None
    at, space, row_id = key.partition(" ")
    if not space or not re.fullmatch(r"-?[0-9]{1,19}", at) or not -(2**63) <= int(at) < 2**63:
        raise refused_cursor()
    return int(at), row_id


def _reason(value: Any, field: str = "reason") -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > REASON_MAX:
        raise InvalidInput(f"{field} must be a non-empty string of at most {REASON_MAX} characters", field)
    if has_controls(value):
        raise InvalidInput(f"{field} must not hold control characters (such as NUL or a line break)", field)
    return value


def check_password(value: Any, field: str = "password") -> str:
    """A password given as text; its length and strength are the policy's (L{UserOperations._policy})."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{field} must be a non-empty string", field)
    return value


@frozen
class UserDetails:
    """A user with their ban in force, if any."""

    user: User
    ban: Ban | None


class UserOperations:
    """
    Built with the store, the identity chain (whose C{backends} are asked for
    one providing L{IUserManagement}), C{notify(session)} (back-channel logout
    of an ended session), the clock and C{hash_password(password)}, which
    fires with an argon2id hash made off the reactor thread. Every new
    password meets L{authsrv.protocol.password_policy} (C{min_length}).
    C{link_provider} names the chat platform whose links the store keeps
    (None: no C{[chat]} section); C{revoke_link(linked)} starts revoking a
    removed user's link's tokens at that platform without waiting for it
    (None: no provider client to revoke them with).
    """

    def __init__(self, *, store, identity, notify, clock, hash_password: Callable[[str], Awaitable[str]],
                 min_length: int = MIN_LENGTH, link_provider: str | None = None,
                 revoke_link: Callable[[LinkedAccount], object] | None = None):
        self._min_length = min_length
        self._link_provider = link_provider
        self._revoke_link = revoke_link
        self._store = store
        self._identity = identity
        self._notify = notify
        self._clock = clock
        self._hash = hash_password

    def _now(self) -> int:
        return int(self._clock.seconds())

    async def find(self, user_id: str) -> User:
        """The user whose id (sub) or, failing that, login is C{user_id}."""
        if not isinstance(user_id, str) or not user_id:
            raise InvalidInput("user_id must be a non-empty string", "user_id")
        user = await self._identity.user_by_id(user_id) or await self._identity.user_by_login(user_id)
        if user is None:
            raise NotFound(f"no user {user_id!r} (by id or login)", "user_id")
        return user

    async def details(self, user_id: str) -> UserDetails:
        user = await self.find(user_id)
        return UserDetails(user, await self._store.get_ban(user.sub, self._now()))

    async def ban(self, user_id: str, *, reason: Any, until: Any, actor: str) -> moderation.Banned:
        """Ban the user (until C{until}, see L{parse_until}) and end their browser sessions."""
        reason = _reason(reason)
        now = self._now()
        until = parse_until(until, now)
        user = await self.find(user_id)
        return await moderation.ban_user(
            self._store, user.sub, reason=reason, until=until, now=now, actor=actor, notify=self._notify
        )

    async def unban(self, user_id: str, *, actor: str) -> str:
        """Lift the user's ban; L{NotFound} when there is none. Fires with the sub."""
        user = await self.find(user_id)
        if not await moderation.unban_user(self._store, user.sub, actor=actor):
            raise NotFound(f"{user.sub} is not banned", "user_id")
        return user.sub

    async def bans(self, limit: int | None = None, cursor: str | None = None) -> Page:
        """The bans in force, ordered by sub, at most C{limit} (up to 100) after C{cursor}."""
        return await page(lambda after, n: self._store.list_bans(self._now(), after, n), lambda b: b.sub, limit, cursor)

    async def grants(self, user_id: str, limit: int | None = None, cursor: str | None = None) -> tuple[str, Page]:
        """The user's live grants, oldest first, at most C{limit} (up to 100) after C{cursor}."""
        user = await self.find(user_id)

        def read(after: str | None, n: int):
            return self._store.list_user_grants(user.sub, self._now(), created_after(after), n)

        return user.sub, await page(read, lambda g: f"{g.created_at} {g.grant_id}", limit, cursor)

    async def revoke_grants(self, user_id: str, *, actor: str) -> moderation.Revoked:
        """Revoke every grant of the user and end their browser sessions."""
        user = await self.find(user_id)
        return await moderation.revoke_user(self._store, user.sub, now=self._now(), actor=actor, notify=self._notify)

    async def sessions(self, user_id: str, limit: int | None = None, cursor: str | None = None) -> tuple[str, Page]:
        """
        The user's live browser sessions, oldest first, at most C{limit} (up
        to 100) after C{cursor}, which names the last one's public sid.
        """
        user = await self.find(user_id)

        def read(after: str | None, n: int):
            return self._store.list_user_sessions(user.sub, self._now(), created_after(after), n)

        return user.sub, await page(read, lambda s: f"{s.created_at} {s.sid}", limit, cursor)

    async def end_sessions(self, user_id: str, *, actor: str) -> tuple[str, int]:
        """End the user's browser sessions, telling their clients by back-channel logout; (sub, how many)."""
        user = await self.find(user_id)
        count = await moderation.end_sessions(self._store, user.sub, self._notify)
        events.user_sessions_ended(sub=user.sub, count=count, actor=actor)
        return user.sub, count

    async def consents(self, user_id: str) -> tuple[str, list[Consent]]:
        user = await self.find(user_id)
        return user.sub, await self._store.list_user_consents(user.sub)

    async def revoke_consents(self, user_id: str, *, actor: str) -> tuple[str, int]:
        """Forget the user's consents (each client asks again at the next sign-in); (sub, how many)."""
        user = await self.find(user_id)
        return user.sub, await self._forget_consents(user.sub, actor)

    async def _forget_consents(self, sub: str, actor: str) -> int:
        count = 0
        for consent in await self._store.list_user_consents(sub):
            count += await self._store.revoke_consent(sub, consent.client_id)
        events.user_consents_revoked(sub=sub, count=count, actor=actor)
        return count

    async def reset_factors(self, user_id: str, *, actor: str) -> tuple[str, bool]:
        """Remove the user's second factors (a lost phone); audited. (sub, whether there were any)."""
        user = await self.find(user_id)
        return user.sub, await reset_factors(self._store, user.sub, actor=actor)

    # --- backends that write users ------------------------------------------

    def _writer(self):
        for backend in getattr(self._identity, "backends", (self._identity,)):
            if IUserManagement.providedBy(backend):
                return backend
        raise Conflict(NO_WRITABLE_BACKEND)

    @property
    def users_location(self) -> str:
        return self._writer().users_location

    async def list_written(self) -> list[User]:
        """Every user of the writable backend, ordered by login."""
        return list(await self._writer().list_users())

    async def login_free(self, login: str) -> None:
        """
        L{Conflict} when the writable backend has a user of that login, or
        L{InvalidInput} for one with compatibility forms (asked before a password is typed).
        """
        await self._no_look_alike(login)
        _check_compatibility(login)
        writer = self._writer()
        existing = await writer.user_by_login(login)
        if existing is not None:
            raise Conflict(f"login {existing.login!r} is already taken in {writer.users_location}", "login")

    def _policy(self, password: str, login: str | None, email: str | None) -> str:
        problem = password_problem(password, login=login, email=email, min_length=self._min_length)
        if problem:
            raise InvalidInput(problem, "password")
        return password

    async def _written_user(self, user_id: str) -> tuple[Any, User]:
        """The writable backend and the user, who must be one of its own."""
        writer = self._writer()
        user = await self.find(user_id)
        if await writer.user_by_login(user.login) is None:
            raise Conflict(f"user {user.login!r} is not kept by {writer.users_location}", "user_id")
        return writer, user

    async def create(self, data: Any, *, actor: str) -> User:
        """A new user of the writable backend from C{data} (C{login}, C{password}, optional profile)."""
        if not isinstance(data, dict):
            raise InvalidInput("the body must be a JSON object")
        for field in data:
            if field not in PROFILE:
                raise InvalidInput(f"{field} is not a user field that can be set here", field)
        login = data.get("login")
        if not isinstance(login, str) or not login.strip():
            raise InvalidInput("login must be a non-empty string", "login")
        password = check_password(data.get("password"))
        for field in ("sub", "name", "picture", "chat_user_id", "email"):
            if data.get(field) is not None and (not isinstance(data[field], str) or not data[field]):
                raise InvalidInput(f"{field} must be a non-empty string or null", field)
        for field in ("login", "name", "email", "chat_user_id"):
            if data.get(field) is not None and (problem := _text_problem(data[field])):
                raise InvalidInput(f"{field} {problem}", field)
        for field in ("login", "sub"):
            if data.get(field) is not None and (problem := path_segment_problem(data[field])):
                raise InvalidInput(f"{field} {problem}", field)
        await self._no_look_alike(login)
        _check_compatibility(login)
        if data.get("email") and "@" not in data["email"]:
            raise InvalidInput(f"email {data['email']!r} is not an email address", "email")
        if data.get("picture") and (problem := picture_problem(data["picture"])):
            raise InvalidInput(f"picture {problem}", "picture")
        email_verified = data.get("email_verified", False)
        if not isinstance(email_verified, bool):
            raise InvalidInput("email_verified must be true or false", "email_verified")
        self._policy(password, login, data.get("email"))
        writer = self._writer()
        await self._names_free(login, data.get("sub"))
        await self._chat_account_free(data.get("chat_user_id"))
        user = User(
            sub=data.get("sub") or str(uuid.uuid4()), login=login, name=data.get("name"), email=data.get("email"),
            email_verified=email_verified, picture=data.get("picture"), chat_user_id=data.get("chat_user_id"),
        )
        try:
            added = await writer.add_user(user, await self._hash(password))
        except ValueError as e:
            raise (Conflict if "taken" in str(e) else InvalidInput)(str(e)) from None
        events.user_created(sub=added.sub, login=added.login, actor=actor)
        return added

    async def _no_look_alike(self, login: str) -> None:
        """
        L{Conflict} when a user of any identity backend has a login that
        looks like the new one: the same once NFKC case-folded
        (L{look_alike_key}; docs/design.md, Logins), as C{ａｌｉｃｅ} is
        C{alice}. A user could not tell them apart on a page or in a token's
        claims, and an operator could ban one for the other. The backends
        find the existing login by that form, as they compare logins case-
        folded.
        """
        other = await self._identity.user_by_login(look_alike_key(login))
        if other is None:
            return
        if login_key(other.login) == login_key(login):
            raise Conflict(f"login {other.login!r} is already taken by user {other.sub!r}", "login")
        raise Conflict(f"login {login!r} looks like {other.login!r}, the login of user {other.sub}: two logins"
                       " that are the same once NFKC case-folded (RFC 8265) may not both exist; choose another",
                       "login")

    async def _names_free(self, login: str, sub: str | None) -> None:
        """
        L{Conflict} when a new user's C{sub} is another user's login, or its
        C{login} another's sub: L{find} looks a user up by id first, then by
        login, so the newcomer would take the other's place, or never be found.
        """
        if sub is not None and (other := await self._identity.user_by_login(sub)) is not None:
            raise Conflict(f"sub {sub!r} is the login of user {other.sub}: a lookup by id or login could not tell"
                           " them apart", "sub")
        if (other := await self._identity.user_by_id(login)) is not None:
            raise Conflict(f"login {login!r} is the sub of user {other.login!r}: a lookup by id or login could not"
                           " tell them apart", "login")

    async def _chat_account_free(self, chat_user_id: str | None) -> None:
        """
        One chat account names one user (docs/design.md, Linked chat
        accounts): a new user may not claim one linked to a user here.
        """
        if chat_user_id is None or self._link_provider is None:
            return
        holder = await self._store.linked_sub(self._link_provider, chat_user_id)
        if holder is not None:
            raise Conflict(f"chat account {chat_user_id} is already linked to user {holder}; unlink it there first",
                           "chat_user_id")

    async def _write(self, writer, user: User, user_id: str, write: Callable[[], Awaitable[Any]]) -> None:
        """
        C{write()}, a writable backend's change to C{user}, which fails with
        L{ValueError} for an unknown login: L{NotFound} when the user was
        removed since it was looked up (another operator's delete beside this).
        """
        try:
            await write()
        except ValueError:
            if await writer.user_by_login(user.login) is None:
                raise NotFound(f"no user {user_id!r}: removed meanwhile", "user_id") from None
            raise

    async def set_password(self, user_id: str, password: Any, *, actor: str) -> User:
        """
        Set a user's password and end their browser sessions, telling their
        clients by back-channel logout: a password set for them replaces a
        forgotten or stolen one, and no session signed in with that one
        outlives it (the account page's change ends the user's other ones).
        """
        password = check_password(password)
        writer, user = await self._written_user(user_id)
        self._policy(password, user.login, user.email)
        hashed = await self._hash(password)
        await self._write(writer, user, user_id, lambda: writer.set_password_hash(user.login, hashed))
        events.user_password_set(sub=user.sub, actor=actor)
        await moderation.end_sessions(self._store, user.sub, self._notify)
        return user

    async def set_disabled(self, user_id: str, disabled: bool, *, reason: Any = None,
                           actor: str) -> tuple[User, int]:
        """
        Disable (C{reason} is reported as the ban reason) or enable a user of
        the writable backend; (the user, how many browser sessions ended). A
        disabled user counts as banned (docs/design.md, Bans), so disabling
        ends their sessions at once and tells their clients by back-channel
        logout, as a ban does.
        """
        if disabled:
            reason = _reason(reason)
        writer, user = await self._written_user(user_id)
        await self._write(writer, user, user_id,
                          lambda: writer.set_disabled(user.login, disabled, reason if disabled else None))
        if not disabled:
            events.user_enabled(sub=user.sub, actor=actor)
            return user, 0
        events.user_disabled(sub=user.sub, reason=reason, actor=actor)
        return user, await moderation.end_sessions(self._store, user.sub, self._notify)

    async def delete(self, user_id: str, *, actor: str) -> User:
        """
        Remove the user from the writable backend; their grants are revoked
        and sessions ended first, and their chat link goes with them: no one
        could unlink it any more, and the chat account would stay refused to
        every other user (one chat account links one user); its tokens are
        revoked at the platform as at unlinking, after the answer and best
        effort (C{revoke_link}). Their consents
        and second factors go too, so a user made again under the same sub
        (the API lets the operator choose it) inherits neither the removed
        one's approvals nor their passkeys and authenticator.
        """
        writer, user = await self._written_user(user_id)
        await moderation.revoke_user(self._store, user.sub, now=self._now(), actor=actor, notify=self._notify)
        await self._write(writer, user, user_id, lambda: writer.remove_user(user.login))
        if self._link_provider is not None:
            removed = await self._store.unlink_account(user.sub, self._link_provider)
            if removed is not None and self._revoke_link is not None:
                self._revoke_link(removed)
        await self._forget_consents(user.sub, actor)
        await reset_factors(self._store, user.sub, actor=actor)
        events.user_deleted(sub=user.sub, login=user.login, actor=actor)
        return user
