"""
The PostgreSQL identity backend: users, password hashes, disabled flags,
profile claims and linked chat accounts read from tables.

Three modes. C{own}: the project's table C{identity_users}, created and
migrated at start under an advisory lock and managed with C{authsrv-admin
user ...}. C{mapped}: an operator's existing tables, read through SQL
queries from the config, checked at start and run in read-only
transactions, so an existing user base moves over without copying it.
C{better-auth}: a Better Auth database read in place (docs/
migrating-from-better-auth.md), so both servers can run side by side: login
by email, the scrypt hashes of its C{credential} accounts (never upgraded, as
Better Auth must still verify them), its admin plugin's bans and its Discord
accounts, whose tokens chat-token serves and refreshes (L{IChatLinkSource}).

Lookups run on txpostgres connections (asynchronous psycopg2, no thread);
password checks on the bounded L{PasswordVerifier} pool. Start-up work
(migrations, checking the mapped queries) is a blocking psycopg2 session, as
the server builds its plugins before the reactor runs. Any database failure
is L{BackendUnavailable}, never a wrong password.
"""

from __future__ import annotations

import unicodedata
from contextlib import closing

import bcrypt
import psycopg2
import psycopg2.extensions
from attrs import frozen
from twisted.cred.credentials import IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from zope.interface import implementer

from authsrv.configsection import ConfigError, Section, Unreachable
from authsrv.identity.credentials import credential_text
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.identity.passwords import (
    _COSTLY,
    _MALFORMED,
    _MATCH,
    _MISMATCH,
    PasswordVerifier,
    is_argon2id_hash,
    is_better_auth_hash,
)
from authsrv.identity.static import login_key
from authsrv.interfaces import IChatLinkSource, IIdentityBackend, IUserManagement
from authsrv.migrations import Ledger, MigrationError, PostgresMigration, advisory_lock_id, migrate, schema_steps
from authsrv.pg.pool import (
    ConnectFailed,
    NoFreeConnection,
    Pool,
    PoolClosed,
    ServerCancelled,
    TimedOut,
    fetch,
    first_line,
    host_lookups,
    is_outage,
)
from authsrv.pg.settings import ConnectionSettings, read_settings
from authsrv.records import SourceChatLink, User

log = Logger()

MODES = ("own", "mapped", "better-auth")

BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")

BCRYPT_MAX_PASSWORD = 72
"""
bcrypt only ever hashed a password's first 72 bytes; the bcrypt package now
refuses longer input, so a check truncates as the hash's maker did.
"""

BCRYPT_MAX_COST = 15
"""
The highest bcrypt cost checked (2^15 rounds, two seconds or more); a stored
hash asking for more (cost 31 takes days) is refused unchecked, as
L{authsrv.identity.passwords.MAX_ARGON2} does for argon2.
"""

COLUMNS = (
    "sub", "login", "password_hash", "name", "picture", "email", "email_verified",
    "disabled", "disabled_reason", "chat_user_id",
)
"""What the lookup queries may return, named so (C{... AS name})."""

_BOOLEAN_COLUMNS = frozenset({"email_verified", "disabled"})
_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "name", "citext"})

_OWN_COLUMNS = ", ".join(COLUMNS)


SCHEMA_LOCK = advisory_lock_id("authsrv identity schema")
LEDGER = Ledger("identity_schema_version", "identity")


def connection_pool(reactor, settings: ConnectionSettings, size: int, lookups, *, read_only: bool = False):
    """A L{Pool} whose every failure is L{BackendUnavailable}."""
    return Pool(
        reactor, settings, size=size, lookups=lookups, translate=_translate, what="identity database",
        consequence="logins and user lookups fail", read_only=read_only,
    )


def _translate(error: BaseException, label: str) -> tuple[BackendUnavailable, bool]:
    """
    The pool's failure as L{BackendUnavailable} naming C{label}, and whether
    it is an outage; a query the database refuses (a broken mapping) is
    logged every time.
    """
    if isinstance(error, PoolClosed):
        return BackendUnavailable(f"{label}: the connection pool is closed"), False
    if isinstance(error, NoFreeConnection):
        reason = f"no connection free within {error.seconds} s"
    elif isinstance(error, ConnectFailed):
        reason = f"cannot connect: {_reason(error.cause)}"
    else:
        reason = _reason(error)
    outage = is_outage(error)
    if not outage:
        log.error("identity query {label} failed: {reason}", label=label, reason=reason)
    return BackendUnavailable(f"{label}: {reason}"), outage


def _reason(error: BaseException) -> str:
    if isinstance(error, TimedOut):
        return f"no answer within {error.seconds} s"
    if isinstance(error, ServerCancelled):
        return "cancelled by the server (statement_timeout)"
    return first_line(error)


async def _write(connection, query: str, parameters: dict) -> int:
    """One write in a read-write transaction (mapped mode's sessions default to read-only)."""
    cursor = connection.cursor()
    await cursor.execute("BEGIN READ WRITE")
    await cursor.execute(query, parameters)
    count = cursor.rowcount
    await cursor.execute("COMMIT")
    return count


# --- passwords --------------------------------------------------------------


def is_bcrypt_hash(value: str | None) -> bool:
    return value is not None and value.startswith(BCRYPT_PREFIXES)


class MigratingVerifier(PasswordVerifier):
    """
    L{PasswordVerifier} that also accepts bcrypt hashes, so operators can
    bring an existing user table; after a successful login the backend
    replaces a bcrypt hash, a Better Auth scrypt hash or an argon2id hash of
    other parameters by one of the configured argon2id (L{needs_rehash},
    L{PasswordVerifier.rehash}).
    """

    def needs_rehash(self, stored_hash: str) -> bool:
        return is_bcrypt_hash(stored_hash) or super().needs_rehash(stored_hash)

    def _compare(self, password, stored_hash):
        if not is_bcrypt_hash(stored_hash):
            return super()._compare(password, stored_hash)
        cost = stored_hash[4:6]
        if not (cost.isascii() and cost.isdigit()):
            return _MALFORMED
        if int(cost) > BCRYPT_MAX_COST:
            return _COSTLY
        try:
            matched = bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD], stored_hash.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            return _MALFORMED
        return _MATCH if matched else _MISMATCH


class BetterAuthVerifier(MigratingVerifier):
    """
    The verifier of mode "better-auth", whose users' hashes all stay Better
    Auth scrypt hashes: an unknown login is checked against a scrypt dummy,
    so it costs what a known user's wrong password costs.
    """

    DUMMY = "0" * 32 + ":" + "0" * 128
    """A well-formed Better Auth hash no password matches (its key would be scrypt's output)."""

    def _compare(self, password, stored_hash):
        return super()._compare(password, self.DUMMY if stored_hash is None else stored_hash)


# --- queries ----------------------------------------------------------------


@frozen
class Queries:
    """
    The SQL of each lookup, with named parameters: C{user_by_login} gets
    C{login} (as typed, in NFC: a decomposed C{ë} is the one a table holds)
    and C{login_key} (NFC, case-folded), C{user_by_id}
    gets C{sub}, and C{update_password_hash} (optional) gets C{sub},
    C{password_hash} (the new argon2id hash) and C{old_password_hash}, which
    it must compare, so that a login never writes over a hash changed since
    it read it (another login's upgrade, a password reset).
    """

    user_by_login: str
    user_by_id: str
    update_password_hash: str | None


OWN_QUERIES = Queries(
    user_by_login=f"SELECT {_OWN_COLUMNS} FROM identity_users WHERE login_key = %(login_key)s",
    user_by_id=f"SELECT {_OWN_COLUMNS} FROM identity_users WHERE sub = %(sub)s",
    update_password_hash=(
        "UPDATE identity_users SET password_hash = %(password_hash)s, updated_at = now()"
        " WHERE sub = %(sub)s AND password_hash = %(old_password_hash)s"
    ),
)

_PARAMETERS = {
    "user_by_login": ("login", "login_key"),
    "user_by_id": ("sub",),
    "update_password_hash": ("sub", "password_hash", "old_password_hash"),
}

_REQUIRED_PARAMETERS = {
    "user_by_login": (),
    "user_by_id": ("sub",),
    "update_password_hash": ("sub", "password_hash", "old_password_hash"),
}

_WHY_REQUIRED = {
    "old_password_hash": (
        " (... AND pw = %(old_password_hash)s), so that a password changed while a login"
        " upgrades its hash is not set back"
    ),
}

_CHECK_PARAMETERS = {
    "login": "authsrv config check",
    "login_key": "authsrv config check",
    "sub": "authsrv-config-check",
    "password_hash": "$argon2id$v=19$m=8,t=1,p=1$Y2hlY2s$Y2hlY2s",
    "old_password_hash": "$argon2id$v=19$m=8,t=1,p=1$Y2hlY2s$Y2hlY2s",
}


_BETTER_AUTH_USER = """
SELECT u.id AS sub, u.email AS login, c.password AS password_hash, u.name, u.image AS picture,
       u.email, u."emailVerified" AS email_verified,
       coalesce(u.banned, false) AND (u."banExpires" IS NULL OR u."banExpires" > now()) AS disabled,
       CASE WHEN coalesce(u.banned, false) AND (u."banExpires" IS NULL OR u."banExpires" > now())
            THEN coalesce(u."banReason", 'banned') END AS disabled_reason,
       d."accountId" AS chat_user_id
FROM "user" u
LEFT JOIN LATERAL (SELECT password FROM account WHERE "userId" = u.id AND "providerId" = 'credential'
                   ORDER BY "updatedAt" DESC LIMIT 1) c ON true
LEFT JOIN LATERAL (SELECT "accountId" FROM account WHERE "userId" = u.id AND "providerId" = %(provider)s
                   ORDER BY "updatedAt" DESC LIMIT 1) d ON true
"""

BETTER_AUTH_PROVIDER = "discord"
"""The chat platform whose C{account} rows name a user's C{chat_user_id} when the config has no C{[chat]}."""

BETTER_AUTH_QUERIES = Queries(
    # Better Auth stores emails lower-cased (its sign-up lower-cases them), so
    # the unique index on email serves the lookup.
    user_by_login=_BETTER_AUTH_USER + "WHERE u.email = lower(%(login)s)",
    user_by_id=_BETTER_AUTH_USER + "WHERE u.id = %(sub)s",
    update_password_hash=None,
)
"""
A Better Auth ban (admin plugin) whose C{banExpires} has passed is no ban,
as Better Auth itself treats it; a ban without a reason reads "banned".
C{chat_user_id} is the C{accountId} of the user's C{account} row of
C{%(provider)s}, the platform chat-token serves, so the two agree.
"""

_VERSION = """(extract(epoch FROM "updatedAt") * 1000000)::bigint"""

_CHAT_LINK = f"""
SELECT id, "accountId" AS provider_user_id, "accessToken" AS access_token, "refreshToken" AS refresh_token,
       coalesce(scope, '') AS scope,
       coalesce(extract(epoch FROM "accessTokenExpiresAt")::bigint, 0) AS expires_at,
       {_VERSION} AS version
FROM account WHERE "userId" = %(sub)s AND "providerId" = %(provider)s AND "accessToken" IS NOT NULL
ORDER BY "updatedAt" DESC LIMIT 1
"""

_SAVE_CHAT_TOKENS = f"""
UPDATE account SET "accessToken" = %(access)s, "refreshToken" = coalesce(%(refresh)s, "refreshToken"),
       scope = %(scope)s, "accessTokenExpiresAt" = to_timestamp(%(expires_at)s),
       "updatedAt" = greatest(now(), "updatedAt" + interval '1 microsecond')
WHERE id = %(id)s AND {_VERSION} = %(version)s
"""


def _read_queries(section: Section) -> Queries:
    return Queries(
        user_by_login=section.str("user_by_login"),
        user_by_id=section.str("user_by_id"),
        update_password_hash=section.str("update_password_hash", None),
    )


def check_queries(connection, section: Section, queries: Queries) -> None:
    """
    Run each mapped query once with made-up parameters in a read-only
    session (the update only through EXPLAIN, which writes nothing): a
    query that does not parse, uses a parameter it does not get, or returns
    columns the backend cannot use is a one-line L{ConfigError} naming it.
    """
    for name in ("user_by_login", "user_by_id", "update_password_hash"):
        query = getattr(queries, name)
        if query is None:
            continue
        expected = _PARAMETERS[name]
        if name == "user_by_login" and not any(f"%({p})s" in query for p in expected):
            raise section.error(name, "must use %(login)s or %(login_key)s")
        for parameter in _REQUIRED_PARAMETERS[name]:
            if f"%({parameter})s" not in query:
                raise section.error(name, f"must use %({parameter})s{_WHY_REQUIRED.get(parameter, '')}")
        parameters = {p: _CHECK_PARAMETERS[p] for p in expected}
        statement = f"EXPLAIN {query}" if name == "update_password_hash" else query
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, parameters)
                if name != "update_password_hash":
                    _check_columns(connection, section, name, cursor.description)
        except KeyError as e:
            raise section.error(
                name,
                f"uses %({e.args[0]})s, which it does not get; its parameters are "
                + ", ".join(f"%({p})s" for p in expected),
            ) from None
        except (TypeError, ValueError, IndexError):
            raise section.error(
                name, "cannot take its parameters: write them %(name)s, and a literal % as %%"
            ) from None
        except psycopg2.extensions.QueryCanceledError:
            raise section.error(name, "did not finish within statement_timeout") from None
        except psycopg2.OperationalError:
            raise
        except psycopg2.Error as e:
            raise section.error(name, f"does not run: {first_line(e)}") from None


def _check_columns(connection, section: Section, name: str, description) -> None:
    if description is None:
        raise section.error(name, "returns no rows: it must be a SELECT")
    names = [column.name for column in description]
    for column in names:
        if column not in COLUMNS:
            raise section.error(
                name, f"returns a column {column!r}; name each one of: {', '.join(COLUMNS)}"
            )
        if names.count(column) > 1:
            raise section.error(name, f"returns the column {column!r} twice")
    required = ("sub", "login", "password_hash") if name == "user_by_login" else ("sub", "login")
    for column in required:
        if column not in names:
            raise section.error(name, f"must return a column named {column} (... AS {column})")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT oid, typname FROM pg_type WHERE oid = ANY(%s)",
            ([column.type_code for column in description],),
        )
        types = dict(cursor.fetchall())
    for column in description:
        kind = types.get(column.type_code)
        if column.name in _BOOLEAN_COLUMNS and kind != "bool":
            raise section.error(name, f"column {column.name} must be a boolean, not {kind}")
        if column.name not in _BOOLEAN_COLUMNS and kind not in _TEXT_TYPES:
            raise section.error(
                name, f"column {column.name} must be text, not {kind} (cast it: ...::text AS {column.name})"
            )


# --- the backend ------------------------------------------------------------


def _db_text(value: str | bytes) -> str | None:
    """
    C{value} as text PostgreSQL can take, or None for what no user can
    have: bytes that are not UTF-8, lone surrogates, NUL characters (which
    PostgreSQL text cannot hold, and psycopg2 refuses).
    """
    text = credential_text(value)
    return None if text is None or "\x00" in text else text


def is_subject(sub) -> bool:
    """Whether C{sub} may be a user's C{sub} claim: 1 to 255 printable ASCII characters (OIDC Core 2)."""
    return isinstance(sub, str) and 0 < len(sub) <= 255 and sub.isascii() and sub.isprintable()


@frozen
class _Account:
    user: User
    password_hash: str | None


def _account(row: dict) -> _Account | None:
    if not row.get("sub") or not row.get("login"):
        return None
    return _Account(
        User(
            sub=row["sub"],
            login=row["login"],
            name=row.get("name"),
            picture=row.get("picture"),
            email=row.get("email"),
            email_verified=bool(row.get("email_verified")),
            disabled=bool(row.get("disabled")),
            disabled_reason=row.get("disabled_reason"),
            chat_user_id=row.get("chat_user_id"),
        ),
        row.get("password_hash"),
    )


@implementer(IIdentityBackend)
class PostgresIdentityBackend:
    """
    Users from PostgreSQL through C{queries}, in C{mode} "own" (our table:
    see L{OwnPostgresIdentityBackend}) or "mapped" (the operator's, which
    authsrv never writes but for upgrading an older password hash).
    C{shared} are parameters every lookup gets besides its own.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, pool: Pool, verifier: MigratingVerifier, queries: Queries, mode: str,
                 shared: dict | None = None):
        self._pool = pool
        self._verifier = verifier
        self._queries = queries
        self.mode = mode
        self._shared = shared or {}

    def _one(self, label: str, query: str, own: dict) -> Deferred:
        parameters = self._shared | own

        def pick(rows: list[dict]) -> _Account | None:
            if len(rows) > 1:
                log.error(
                    "{query} found {count} users for one {what}: it must find at most one",
                    query=label, count=len(rows), what="login" if "login" in parameters else "sub",
                )
                raise BackendUnavailable(f"{label} is ambiguous")
            account = _account(rows[0]) if rows else None
            if rows and account is None:
                log.error("{query} found a user without sub or login", query=label)
            elif account is not None and not is_subject(account.user.sub):
                log.error("{query} found the user {login!r}, whose sub is not 1 to 255 printable ASCII characters"
                          " (OIDC Core 2): no one can sign in as it", query=label, login=account.user.login)
                return None
            return account

        return self._pool.run(lambda c: fetch(c, query, parameters), label, idempotent=True).addCallback(pick)

    def _by_login(self, login: str | bytes) -> Deferred:
        text = _db_text(login)
        if text is None:
            return succeed(None)
        parameters = {"login": unicodedata.normalize("NFC", text), "login_key": login_key(text)}
        return self._one("user_by_login", self._queries.user_by_login, parameters)

    def user_by_login(self, login: str | bytes) -> Deferred:
        return self._by_login(login).addCallback(lambda a: a.user if a else None)

    def user_by_id(self, sub: str) -> Deferred:
        if not is_subject(sub):
            return succeed(None)
        d = self._one("user_by_id", self._queries.user_by_id, {"sub": sub})
        return d.addCallback(lambda a: a.user if a else None)

    def requestAvatarId(self, credentials) -> Deferred:
        """
        Fires with the user's sub, or fails with L{UnknownUser},
        L{UnauthorizedLogin} or L{BackendUnavailable}. An unknown login takes
        the same steps as a wrong password: one query, one check on the
        verifier's pool (against its dummy hash), the same decision; only a
        success may add a round trip, to upgrade the hash.
        """
        return Deferred.fromCoroutine(self._check(credentials.username, credentials.password))

    async def _check(self, login, password) -> str:
        account = await self._by_login(login)
        stored = account.password_hash if account else None
        matched = await self._verifier.verify(account.user.login if account else "", password, stored)
        if account is None:
            raise UnknownUser("unknown login")
        if not matched:
            raise UnauthorizedLogin("wrong password")
        query = self._queries.update_password_hash
        if query and account.password_hash is not None and self._verifier.needs_rehash(account.password_hash):
            await self._upgrade(account, password, query)
        return account.user.sub

    async def _upgrade(self, account: _Account, password, query: str) -> None:
        """Replace an older hash by argon2id; a failure only leaves the old hash in place."""
        new_hash = await self._verifier.rehash(password)
        parameters = {
            "sub": account.user.sub,
            "password_hash": new_hash,
            "old_password_hash": account.password_hash,
        }
        try:
            written = await self._pool.run(lambda c: _write(c, query, parameters), "update_password_hash")
        except BackendUnavailable:
            return
        if written:
            log.info("password hash of {login!r} upgraded to the configured argon2id parameters",
                     login=account.user.login)

    def close(self) -> Deferred:
        self._pool.close()
        return succeed(None)


@implementer(IChatLinkSource)
class BetterAuthIdentityBackend(PostgresIdentityBackend):
    """
    The backend in mode "better-auth": a Better Auth database read in place,
    whose Discord C{account} rows are also chat links. Better Auth keeps
    scopes comma-separated, authsrv space-separated; tokens are as Better
    Auth stores them (plain, its default).
    """

    async def chat_link(self, sub: str, provider: str) -> SourceChatLink | None:
        text = _db_text(sub)
        if text is None:
            return None
        rows = await self._pool.run(
            lambda c: fetch(c, _CHAT_LINK, {"sub": text, "provider": provider}), "chat_link", idempotent=True
        )
        if not rows:
            return None
        row = rows[0]
        return SourceChatLink(
            link_id=row["id"], provider_user_id=row["provider_user_id"], access_token=row["access_token"],
            refresh_token=row["refresh_token"], scope=" ".join(row["scope"].replace(",", " ").split()),
            expires_at=int(row["expires_at"]), version=int(row["version"]),
        )

    async def save_chat_tokens(self, link_id, version, access_token, refresh_token, scope, expires_at) -> bool:
        parameters = {
            "id": link_id, "version": version, "access": access_token, "refresh": refresh_token,
            "scope": ",".join(scope.split()), "expires_at": expires_at,
        }
        return bool(await self._pool.run(lambda c: _write(c, _SAVE_CHAT_TOKENS, parameters), "save_chat_tokens"))


@implementer(IUserManagement)
class OwnPostgresIdentityBackend(PostgresIdentityBackend):
    """
    The backend in mode "own": its table C{identity_users} is ours, so it
    also manages the users (L{IUserManagement}), which a mapped backend
    leaves to the operator's own tools.
    """

    users_location = "the PostgreSQL identity backend"

    async def add_user(self, user: User, password_hash: str) -> User:
        """
        Insert a user into C{identity_users}; L{ValueError} for a bad field
        or a login or sub already taken.
        """
        if not is_subject(user.sub):
            raise ValueError("sub must be 1 to 255 printable ASCII characters (OIDC Core 2)")
        if _db_text(user.login) is None or not user.login.strip():
            raise ValueError("login must be non-empty text without NUL characters")
        if not (is_argon2id_hash(password_hash) or is_better_auth_hash(password_hash)):
            raise ValueError("password_hash must be an argon2id hash (or a Better Auth one, being imported)")
        row = {name: getattr(user, name) for name in COLUMNS if name != "password_hash"}
        row |= {"password_hash": password_hash, "login_key": login_key(user.login)}
        names = ", ".join(row)
        values = ", ".join(f"%({name})s" for name in row)
        query = f"INSERT INTO identity_users ({names}) VALUES ({values}) ON CONFLICT DO NOTHING"
        if await self._pool.run(lambda c: _write(c, query, row), "add_user"):
            return user
        taken = await self.user_by_login(user.login)
        if taken is not None:
            raise ValueError(f"login {taken.login!r} is already taken by user {taken.sub!r}")
        raise ValueError(f"sub {user.sub!r} is already taken")

    async def _write_one(self, label: str, login: str, query: str, parameters: dict) -> None:
        """Run C{query} on the user of C{login} (C{%(login_key)s}); L{ValueError} if there is none."""
        text = _db_text(login)
        if text is None:
            raise ValueError(f"no user with login {login!r}")
        parameters = parameters | {"login_key": login_key(text)}
        if not await self._pool.run(lambda c: _write(c, query, parameters), label):
            raise ValueError(f"no user with login {login!r}")

    async def _update(self, label: str, login: str, assignments: str, parameters: dict) -> None:
        query = f"UPDATE identity_users SET {assignments}, updated_at = now() WHERE login_key = %(login_key)s"
        await self._write_one(label, login, query, parameters)

    async def set_password_hash(self, login: str, password_hash: str) -> None:
        """Replace a user's password hash; L{ValueError} for an unknown login."""
        if not is_argon2id_hash(password_hash):
            raise ValueError("password_hash must be an argon2id hash")
        await self._update("set_password_hash", login, "password_hash = %(hash)s", {"hash": password_hash})

    async def set_disabled(self, login: str, disabled: bool, reason: str | None = None) -> None:
        """Disable (with a reason, reported as the ban reason) or enable a user."""
        await self._update(
            "set_disabled", login, "disabled = %(disabled)s, disabled_reason = %(reason)s",
            {"disabled": disabled, "reason": reason if disabled else None},
        )

    async def remove_user(self, login: str) -> None:
        await self._write_one("remove_user", login, "DELETE FROM identity_users WHERE login_key = %(login_key)s", {})

    async def list_users(self) -> list[User]:
        query = f"SELECT {_OWN_COLUMNS} FROM identity_users ORDER BY login_key"
        rows = await self._pool.run(lambda c: fetch(c, query, {}), "list_users", idempotent=True)
        return [account.user for row in rows if (account := _account(row)) is not None]


# --- building from config ---------------------------------------------------


def from_config(section: Section, context) -> PostgresIdentityBackend | None:
    """
    Keys: the connection keys of L{read_settings}; C{mode} ("own", the
    default, "mapped" or "better-auth"); C{pool_size} (default 4); in mapped
    mode the queries C{user_by_login}, C{user_by_id} and optionally
    C{update_password_hash} (see L{Queries}).
    """
    return build(section, context)


def build(section: Section, context, hasher=None) -> PostgresIdentityBackend | None:
    """
    L{from_config} with the password hasher as a parameter (tests use a
    cheap one). Checking a config (C{context.check_only}) runs the mapped
    queries, which read only, and leaves an own-mode database alone.
    """
    settings = read_settings(section, "authsrv-identity")
    mode = section.str("mode", "own", choices=MODES)
    pool_size = section.int("pool_size", 4, minimum=1)
    if mode == "mapped":
        queries = _read_queries(section)
    else:
        for name in _PARAMETERS:
            if section.has(name):
                raise section.error(name, f'is for mode = "mapped"; mode "{mode}" knows its tables')
        queries = BETTER_AUTH_QUERIES if mode == "better-auth" else OWN_QUERIES
    section.done()
    read_only = mode != "own"
    if context.check_only and not read_only:
        return None
    shared = {"provider": context.link_provider or BETTER_AUTH_PROVIDER} if mode == "better-auth" else {}
    try:
        with closing(settings.connect(read_only=read_only)) as connection:
            if mode == "better-auth":
                _check_better_auth(connection, settings.key, shared)
            elif read_only:
                check_queries(connection, section, queries)
            else:
                steps = schema_steps("authsrv.identity", "postgres")
                migrate(connection, PostgresMigration(SCHEMA_LOCK), steps, LEDGER)
    except psycopg2.OperationalError as e:
        raise Unreachable(settings.key, f"cannot use the database: {first_line(e)}") from None
    except MigrationError as e:
        raise ConfigError(settings.key, str(e)) from None
    if context.check_only:
        return None
    verifier = (BetterAuthVerifier if mode == "better-auth" else MigratingVerifier).for_context(context, hasher)
    pool = connection_pool(context.reactor, settings, pool_size, host_lookups(context, pool_size), read_only=read_only)
    kinds = {"own": OwnPostgresIdentityBackend, "mapped": PostgresIdentityBackend,
             "better-auth": BetterAuthIdentityBackend}
    backend = kinds[mode](pool, verifier, queries, mode, shared)
    log.info("PostgreSQL identity backend ready ({mode} mode)", mode=mode)
    return backend


def _check_better_auth(connection, key: str, shared: dict) -> None:
    """Run the lookups once: a database without Better Auth's tables is a one-line L{ConfigError}."""
    try:
        with connection.cursor() as cursor:
            for query in (BETTER_AUTH_QUERIES.user_by_id, _CHAT_LINK):
                cursor.execute(query, shared | {"sub": "authsrv-config-check"})
    except psycopg2.OperationalError:
        raise
    except psycopg2.Error as e:
        raise ConfigError(
            key, f"is not a Better Auth database (with its admin plugin): {first_line(e)}"
        ) from None
