"""
The production store: PostgreSQL, shared by any number of server instances.

Nothing that matters lives in one process: sessions, pending requests, codes,
grants, the grace-window replay of a rotated refresh token and the chat-link
refresh lease are rows, so any instance can serve any step of a user's flow.

Every racing step is one statement that decides it (C{UPDATE ... WHERE ...
RETURNING}, an upsert with a condition, or a data-modifying C{WITH}), run in
autocommit at PostgreSQL's default READ COMMITTED: a statement that waited
for another's row lock re-checks its condition on the committed row, so
exactly one of two racing instances wins and the other sees what the winner
did. SERIALIZABLE would instead fail one of them and need a retry loop.

Queries run on txpostgres connections (asynchronous psycopg2, no threads),
opened on demand up to C{pool_size}. An outage never hangs a request: a
connection is waited for at most C{connect_timeout}, a statement runs at
most C{statement_timeout} (the server cancels it; a client-side deadline a
second later closes a connection whose server went silent), and every such
failure is L{StoreUnavailable}, which the web layer answers with 503. Broken
connections are dropped and new ones opened by later requests, so the
server recovers by itself when the database is back. Two things libpq does
not do in asynchronous mode are done here: host names are looked up on a
thread, and each server a DSN names gets its own connect deadline.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from importlib import resources

import attrs
import psycopg2
import psycopg2.errorcodes
import psycopg2.errors
import psycopg2.extensions
from psycopg2.extras import RealDictCursor
from twisted.internet.defer import (
    CancelledError,
    Deferred,
    DeferredSemaphore,
    TimeoutError as DeferredTimeout,
    succeed,
)
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from txpostgres import txpostgres
from zope.interface import implementer

from authsrv.interfaces import IStore
from authsrv.records import (
    AccessState,
    AccessToken,
    AuthorizationCode,
    Ban,
    BrowserSession,
    Client,
    CodeConsumed,
    CodeNotFound,
    CodeReused,
    Grant,
    LinkedAccount,
    NotRevoked,
    PendingAuthorization,
    RefreshNotFound,
    RefreshToken,
    Replayed,
    Reused,
    RevokedAccess,
    RevokedRefresh,
    Rotated,
)
from authsrv.store.errors import AlreadyExists, StoreUnavailable

COMPONENT = "store"
"""This schema's name in C{schema_version}, which other components may share."""

MIGRATION_LOCK = 0x6175_7468_7372_7601
"""
The advisory lock key every instance takes while it migrates, so that two
instances starting at once never both migrate.
"""

MIGRATION_LOCK_WAIT = "60s"
_MIGRATION_NAME = re.compile(r"(\d{3})_\w+\.sql")
_CLIENT_DEADLINE_MARGIN = 1


# --- configuration -----------------------------------------------------------


def from_config(section, context) -> "PostgresStore | None":
    """
    Check the section, then connect and migrate the schema now, at start-up,
    so that an unreachable database or a too-new schema stops the server with
    one line naming the DSN's key (never the DSN: it may hold a password).
    """
    dsn, dsn_key = _dsn(section)
    pool_size = section.int("pool_size", 8, minimum=1)
    statement_timeout = _timeout(section, "statement_timeout")
    connect_timeout = _timeout(section, "connect_timeout")
    section.done()
    if context.check_only:
        return None
    try:
        migrate(dsn, connect_timeout, int(context.reactor.seconds()))
    except (psycopg2.Error, MigrationError) as e:
        raise section.error(dsn_key, f"cannot use the database: {_first_line(e)}") from None
    return PostgresStore(
        context.reactor, dsn, pool_size=pool_size, statement_timeout=statement_timeout,
        connect_timeout=connect_timeout, lookups=context.threadpool("postgres-lookups", 2),
    )


def _dsn(section) -> tuple[str, str]:
    """
    The DSN and the key it came from. A plain C{dsn} may not hold a
    password, since config files get copied and committed: such a DSN comes
    from C{dsn_env} or C{dsn_file}, or libpq finds the password itself
    (C{PGPASSWORD}, C{~/.pgpass}).
    """
    if section.has("dsn"):
        for other in ("dsn_env", "dsn_file"):
            if section.has(other):
                raise section.error(other, "give either dsn, dsn_env or dsn_file, not several")
        key, dsn = "dsn", section.str("dsn")
        if "password" in _parsed(section, key, dsn):
            raise section.error(
                key, "holds a password; give the DSN in dsn_file or dsn_env, or the password"
                " in a .pgpass file or PGPASSWORD, so that the config file holds no secret",
            )
        return dsn, key
    if not (section.has("dsn_env") or section.has("dsn_file")):
        raise section.error("dsn", "is required (or dsn_env, or dsn_file when it holds a password)")
    key = "dsn_env" if section.has("dsn_env") else "dsn_file"
    dsn = section.secret("dsn")
    _parsed(section, key, dsn)
    return dsn, key


def _parsed(section, key: str, dsn: str) -> dict:
    try:
        return psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        # libpq's message quotes the DSN, which may hold a password.
        raise section.error(
            key, "is not a PostgreSQL connection string (key=value pairs or a postgresql:// URI)"
        ) from None


def _timeout(section, name: str) -> int:
    seconds = section.duration(name, 5)
    if seconds < 1:
        raise section.error(name, "must be at least 1s")
    return seconds


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _needs_lookup(host: str) -> bool:
    """A host name, as opposed to an address or a socket folder."""
    if not host or host.startswith("/"):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def targets(dsn: str) -> list[dict]:
    """
    The libpq parameters that pick each server the DSN names, in order.
    The pool tries them one by one, each within C{connect_timeout}: in
    asynchronous mode libpq has no deadline per host, so a first host that
    is powered off would use up the whole attempt and the next never be
    tried (a primary and its standbys with C{target_session_attrs}).
    """
    params = psycopg2.extensions.parse_dsn(dsn)
    if not params.get("host"):
        return [{}]
    hosts = params["host"].split(",")
    ports = params.get("port", "").split(",")
    addresses = params.get("hostaddr", "").split(",")
    return [
        {
            "host": host,
            **({"port": ports[index if len(ports) > 1 else 0]} if params.get("port") else {}),
            **({"hostaddr": addresses[index]} if params.get("hostaddr") else {}),
        }
        for index, host in enumerate(hosts)
    ]


# --- schema -------------------------------------------------------------------


class MigrationError(Exception):
    """The schema cannot be brought to this version (for example, it is newer)."""


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every shipped schema step, in order."""
    folder = resources.files("authsrv.store").joinpath("schema", "postgres")
    steps = []
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.fullmatch(entry.name)
        if match:
            steps.append((int(match[1]), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(steps)


def migrate(dsn: str, connect_timeout: int, now: int, steps=None) -> int:
    """
    Bring the schema to the newest of C{steps} (the shipped ones by
    default) in one transaction under an advisory lock: a second instance
    starting at once waits, then finds nothing left to do. Returns the
    version now in force.
    """
    steps = migrations() if steps is None else steps
    latest = steps[-1][0]
    connection = psycopg2.connect(dsn, connect_timeout=max(2, connect_timeout), fallback_application_name="authsrv")
    try:
        with connection, connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_WAIT}'")
            try:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            except psycopg2.errors.LockNotAvailable:
                raise MigrationError(
                    f"another instance has been migrating the schema for {MIGRATION_LOCK_WAIT}; try again"
                ) from None
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS schema_version ("
                " component TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL,"
                " applied_at BIGINT NOT NULL, PRIMARY KEY (component, version))"
            )
            cursor.execute(
                "SELECT COALESCE(MAX(version), 0) FROM schema_version WHERE component = %s", (COMPONENT,)
            )
            current = cursor.fetchone()[0]
            if current > latest:
                raise MigrationError(
                    f"its {COMPONENT} schema version {current} is newer than this authsrv knows"
                    f" ({latest}); run a newer authsrv"
                )
            for version, name, script in steps:
                if version > current:
                    cursor.execute(script)
                    cursor.execute(
                        "INSERT INTO schema_version (component, version, name, applied_at)"
                        " VALUES (%s, %s, %s, %s)",
                        (COMPONENT, version, name, now),
                    )
        return max(current, latest)
    finally:
        connection.close()


# --- connections --------------------------------------------------------------


class _Connection(txpostgres.Connection):
    """
    txpostgres's connection, for one change: when the server closes an idle
    connection (a restart, an administrator), txpostgres lets psycopg2's
    error escape from C{doRead} and the reactor logs it as an unhandled
    error. Here the connection just closes; the pool drops it before use.
    """

    def doRead(self):
        try:
            super().doRead()
        except psycopg2.Error:
            self.close()


_UNAVAILABLE_CLASSES = ("08", "25", "40", "53", "57", "58")
"""
SQLSTATE classes that say "not now" rather than "wrong": connection
exceptions, read-only transaction (a standby after failover), rollbacks
(deadlock), insufficient resources, operator intervention (shutdown), system
errors.
"""


def _store_error(error: BaseException) -> BaseException:
    """The store's own exception for a driver one, or C{error} itself."""
    if isinstance(error, (StoreUnavailable, AlreadyExists)):
        return error
    if isinstance(error, psycopg2.IntegrityError) and error.pgcode == psycopg2.errorcodes.UNIQUE_VIOLATION:
        return AlreadyExists(_first_line(error))
    if isinstance(error, CancelledError):
        return StoreUnavailable("PostgreSQL cancelled the statement (statement_timeout)")
    if isinstance(error, (ConnectionDone, ConnectionLost)):
        return StoreUnavailable("the connection to PostgreSQL was lost")
    if isinstance(error, socket.gaierror):
        return StoreUnavailable(f"cannot look up the PostgreSQL host: {error.strerror}")
    if isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError)) or (
        isinstance(error, psycopg2.Error) and (error.pgcode or "")[:2] in _UNAVAILABLE_CLASSES
    ):
        return StoreUnavailable(f"PostgreSQL: {_first_line(error)}")
    return error


class Pool:
    """
    Up to C{size} txpostgres connections, opened when needed and kept while
    they work. Each L{run} holds one connection to itself, so statements of
    different requests never wait on one connection's lock.
    """

    log = Logger()

    def __init__(self, reactor, dsn: str, *, size: int, connect_timeout: int, statement_timeout: int, lookups):
        self._reactor = reactor
        self._dsn = dsn
        self._targets = targets(dsn)
        self._lookups = lookups
        self._slots = DeferredSemaphore(size)
        self._idle: list[_Connection] = []
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._closed = False
        self._reachable = True

    async def run(self, work):
        """
        Fire with C{await work(connection)}, or fail with
        L{StoreUnavailable} when no connection can be had or the database
        does not answer in time.
        """
        slot = self._slots.acquire()
        try:
            if not slot.called:
                await slot.addTimeout(self._connect_timeout, self._reactor)
        except DeferredTimeout:
            raise StoreUnavailable(
                f"no PostgreSQL connection became free within {self._connect_timeout}s"
            ) from None
        try:
            if self._closed:
                raise StoreUnavailable("the store is closed")
            connection = self._idle_connection() or await self._connect()
            try:
                result = await self._bounded(
                    Deferred.fromCoroutine(work(connection)),
                    self._statement_timeout + _CLIENT_DEADLINE_MARGIN, connection,
                )
            except BaseException as e:
                error = _store_error(e)
                if isinstance(error, StoreUnavailable):
                    self._unreachable(error)
                self._put_back(connection)
                raise error from None
            self._put_back(connection)
            self._reached()
            return result
        finally:
            self._slots.release()

    def close(self) -> None:
        """Close idle connections now and busy ones when their work ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            _abandon(connection)

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        return None

    def _put_back(self, connection: _Connection) -> None:
        """Keep a connection that is open and outside any transaction; close any other."""
        usable = (
            not self._closed
            and not connection.closed
            and connection.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
        )
        if usable:
            self._idle.append(connection)
        else:
            _abandon(connection)

    async def _connect(self) -> _Connection:
        """A new connection to the first server the DSN names that answers in time."""
        for target in self._targets[:-1]:
            try:
                return await self._connect_to(target)
            except StoreUnavailable:
                pass
        try:
            return await self._connect_to(self._targets[-1])
        except StoreUnavailable as e:
            self._unreachable(e)
            raise

    async def _connect_to(self, target: dict) -> _Connection:
        connection = _Connection(self._reactor)
        try:
            options = {"cursor_factory": RealDictCursor, "fallback_application_name": "authsrv", **target}
            if "hostaddr" not in target and _needs_lookup(target.get("host", "")):
                # libpq would look the name up on the reactor's thread.
                options["hostaddr"] = await self._bounded(
                    deferToThreadPool(self._reactor, self._lookups, _address, target["host"]),
                    self._connect_timeout, connection,
                )
            await self._bounded(connection.connect(self._dsn, **options), self._connect_timeout, connection)
            await self._bounded(
                Deferred.fromCoroutine(
                    _rowcount(connection, "SET statement_timeout = %s", (self._statement_timeout * 1000,))
                ),
                self._connect_timeout, connection,
            )
        except BaseException as e:
            _abandon(connection)
            raise _store_error(e) from None
        return connection

    def _reached(self) -> None:
        if not self._reachable:
            self._reachable = True
            self.log.info("PostgreSQL is reachable again")

    def _unreachable(self, error: StoreUnavailable) -> None:
        """Log the start of an outage once, not once per request."""
        if self._reachable:
            self._reachable = False
            self.log.warn(
                "PostgreSQL unavailable ({error}); requests that need the store are answered 503"
                " until it is back", error=str(error),
            )

    def _bounded(self, work: Deferred, seconds: int, connection: _Connection) -> Deferred:
        """
        C{work}'s result, or L{StoreUnavailable} after C{seconds}: then, or
        when the caller cancels, the connection is closed, which also ends
        C{work} (txpostgres cannot cancel a query on a silent server).
        """
        result = Deferred(lambda _: _abandon(connection))

        def expire():
            _abandon(connection)
            if not result.called:
                result.errback(StoreUnavailable(f"PostgreSQL did not answer within {seconds}s"))

        timer = self._reactor.callLater(seconds, expire)

        def finish(outcome):
            if timer.active():
                timer.cancel()
            if result.called:
                return None
            if isinstance(outcome, Failure):
                result.errback(outcome)
            else:
                result.callback(outcome)
            return None

        work.addBoth(finish)
        return result


def _address(host: str) -> str:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]


def _abandon(connection: _Connection) -> None:
    if connection.pollable() is not None:
        connection.close()


async def _fetch(db, sql: str, params=None) -> list:
    cursor = db.cursor()
    await cursor.execute(sql, params)
    return cursor.fetchall()


async def _first(db, sql: str, params=None):
    rows = await _fetch(db, sql, params)
    return rows[0] if rows else None


async def _rowcount(db, sql: str, params=None) -> int:
    cursor = db.cursor()
    await cursor.execute(sql, params)
    return cursor.rowcount


def _holds_nul(params: dict) -> bool:
    """
    PostgreSQL text cannot hold U+0000, so no stored key does: a lookup by
    such a key (a user id from a JSON body) matches nothing, rather than
    failing in the driver.
    """
    return any(isinstance(value, str) and "\x00" in value for value in params.values())


# --- records <-> rows -----------------------------------------------------------
# A codec is an (encode, decode) pair between a record field and its column.

_PLAIN = (lambda value: value, lambda value: value)


def _scope_text(scope) -> str:
    """Scope tokens never hold spaces (RFC 6749 section 3.3); sorted, equal sets are equal strings."""
    return " ".join(sorted(scope))


_SCOPE = (_scope_text, str.split)
_ARRAY = (list, tuple)
_MAP = (lambda mapping: json.dumps(dict(mapping), sort_keys=True), json.loads)
_BYTES = (lambda value: value, lambda value: None if value is None else bytes(value))


class _Rows:
    """
    How one record type maps onto the table columns of the same names;
    C{derived} fields come from a query (a join), never from a column.
    """

    def __init__(self, record: type, table: str, key: str, derived: tuple[str, ...] = (), **codecs):
        self.record = record
        self.fields = [f.name for f in attrs.fields(record)]
        self.codecs = codecs
        self.written = [name for name in self.fields if name not in derived]
        self.table = table
        self.insert = self.insert_as("")
        self.upsert = self.insert + f" ON CONFLICT ({key}) DO UPDATE SET " + ", ".join(
            f"{name} = EXCLUDED.{name}" for name in self.written if name not in key.split(", ")
        )

    def insert_as(self, prefix: str, source: str = "") -> str:
        """
        The INSERT of one record whose parameters are named C{prefix} + field;
        with C{source}, a row is inserted for each row of that query.
        """
        columns = ", ".join(self.written)
        values = ", ".join(f"%({prefix}{name})s" for name in self.written)
        if source:
            return f"INSERT INTO {self.table} ({columns}) SELECT {values} FROM {source}"
        return f"INSERT INTO {self.table} ({columns}) VALUES ({values})"

    def params(self, value, prefix: str = "") -> dict:
        return {
            prefix + name: self.codecs.get(name, _PLAIN)[0](getattr(value, name)) for name in self.written
        }

    def load(self, row, user_ban: bool = False):
        if row is None:
            return None
        values = {name: self.codecs.get(name, _PLAIN)[1](row[name]) for name in self.fields if name in row}
        if user_ban:
            values["user_ban"] = _ban_of(row, row["sub"])
        return self.record(**values)


_CLIENTS = _Rows(
    Client, "clients", "client_id",
    redirect_uris=_ARRAY, post_logout_redirect_uris=_ARRAY, resources=_ARRAY,
)
_SESSIONS = _Rows(BrowserSession, "browser_sessions", "session_hash")
_PENDING = _Rows(PendingAuthorization, "pending_authorizations", "request_id", params=_MAP)
_GRANTS = _Rows(Grant, "grants", "grant_id", scope=_SCOPE, resource=_ARRAY)
_CODES = _Rows(AuthorizationCode, "authorization_codes", "code_hash", scope=_SCOPE, resource=_ARRAY)
_ACCESS = _Rows(AccessToken, "access_tokens", "token_hash", derived=("user_ban",), scope=_SCOPE, audience=_ARRAY)
_REFRESH = _Rows(
    RefreshToken, "refresh_tokens", "token_hash", derived=("revoked", "user_ban"), scope=_SCOPE, replay=_BYTES,
)
_BANS = _Rows(Ban, "bans", "sub")
_LINKED = _Rows(
    LinkedAccount, "linked_accounts", "sub, provider", access_token_enc=_BYTES, refresh_token_enc=_BYTES,
)

# A token lookup also reads its user's ban, so one round trip tells both.
_WITH_BAN = ", b.reason AS ban_reason, b.created_at AS ban_created_at, b.until AS ban_until"


def _ban_of(row, sub: str) -> Ban | None:
    if row["ban_created_at"] is None:
        return None
    return Ban(sub=sub, reason=row["ban_reason"], created_at=row["ban_created_at"], until=row["ban_until"])


# --- the store ------------------------------------------------------------------


@implementer(IStore)
class PostgresStore:
    """L{IStore} on a L{Pool} of connections to one PostgreSQL database."""

    def __init__(
        self, reactor, dsn: str, *, pool_size: int, statement_timeout: int, connect_timeout: int, lookups,
    ):
        """C{lookups} is a thread pool for host name lookups."""
        self._pool = Pool(
            reactor, dsn, size=pool_size, connect_timeout=connect_timeout, statement_timeout=statement_timeout,
            lookups=lookups,
        )

    def _run(self, work, *args) -> Deferred:
        """Fire with C{await work(connection, *args)} on a pooled connection."""
        return Deferred.fromCoroutine(self._pool.run(lambda db: work(db, *args)))

    def _one(self, rows: _Rows | None, sql: str, params: dict, **load) -> Deferred:
        """The record of the first row (the row itself without C{rows}), or None."""
        if _holds_nul(params):
            return succeed(None)

        async def one(db):
            row = await _first(db, sql, params)
            return row if rows is None else rows.load(row, **load)

        return self._run(one)

    def _all(self, rows: _Rows, sql: str, params: dict) -> Deferred:
        if _holds_nul(params):
            return succeed([])

        async def every(db):
            return [rows.load(row) for row in await _fetch(db, sql, params)]

        return self._run(every)

    def _count(self, sql: str, params: dict) -> Deferred:
        """Run one statement; fire with how many rows it changed."""
        if _holds_nul(params):
            return succeed(0)
        return self._run(_rowcount, sql, params)

    def _changed(self, sql: str, params: dict) -> Deferred:
        """Run one statement; fire True when it changed a row."""
        return self._count(sql, params).addCallback(bool)

    def _write(self, sql: str, params: dict) -> Deferred:
        """Run one statement that stores a record; fire with None."""
        return self._run(_rowcount, sql, params).addCallback(lambda _: None)

    # IClientRegistry

    def add_client(self, client):
        return self._write(_CLIENTS.insert, _CLIENTS.params(client))

    def put_client(self, client):
        return self._write(_CLIENTS.upsert, _CLIENTS.params(client))

    def get_client(self, client_id):
        return self._one(_CLIENTS, "SELECT * FROM clients WHERE client_id = %(id)s", {"id": client_id})

    def list_clients(self):
        return self._all(_CLIENTS, 'SELECT * FROM clients ORDER BY client_id COLLATE "C"', {})

    def remove_client(self, client_id):
        return self._changed("DELETE FROM clients WHERE client_id = %(id)s", {"id": client_id})

    # IBrowserSessionStore

    def create_session(self, session):
        return self._write(_SESSIONS.insert, _SESSIONS.params(session))

    def get_session(self, session_hash, now):
        return self._one(
            _SESSIONS,
            "SELECT * FROM browser_sessions WHERE session_hash = %(hash)s AND expires_at > %(now)s",
            {"hash": session_hash, "now": now},
        )

    def end_session(self, session_hash):
        return self._one(
            _SESSIONS, "DELETE FROM browser_sessions WHERE session_hash = %(hash)s RETURNING *",
            {"hash": session_hash},
        )

    def end_user_sessions(self, sub):
        return self._count("DELETE FROM browser_sessions WHERE sub = %(sub)s", {"sub": sub})

    # IAuthorizationRequestStore

    def save_pending(self, pending):
        return self._write(_PENDING.insert, _PENDING.params(pending))

    def get_pending(self, request_id, now):
        return self._one(
            _PENDING,
            "SELECT * FROM pending_authorizations WHERE request_id = %(id)s AND expires_at > %(now)s",
            {"id": request_id, "now": now},
        )

    def delete_pending(self, request_id):
        return self._changed("DELETE FROM pending_authorizations WHERE request_id = %(id)s", {"id": request_id})

    # IAuthorizationCodeStore

    def save_code(self, code, grant):
        # One statement: the code's foreign key is checked at its end, when the grant exists.
        return self._write(
            f"WITH new_grant AS ({_GRANTS.insert_as('g_')}) {_CODES.insert_as('c_')}",
            {**_GRANTS.params(grant, "g_"), **_CODES.params(code, "c_")},
        )

    def consume_code(self, code_hash, now):
        return self._run(_consume_code, code_hash, now)

    # IGrantStore

    def get_grant(self, grant_id):
        return self._one(_GRANTS, "SELECT * FROM grants WHERE grant_id = %(id)s", {"id": grant_id})

    def issue_tokens(self, access, refresh):
        if refresh is None:
            return self._write(_ACCESS.insert, _ACCESS.params(access))
        return self._write(
            f"WITH new_access AS ({_ACCESS.insert_as('a_')}) {_REFRESH.insert_as('r_')}",
            {**_ACCESS.params(access, "a_"), **_REFRESH.params(refresh, "r_")},
        )

    def find_access_token(self, token_hash, now):
        return self._one(
            _ACCESS,
            "SELECT a.*" + _WITH_BAN + " FROM access_tokens a JOIN grants g ON g.grant_id = a.grant_id"
            " LEFT JOIN bans b ON b.sub = a.sub"
            " WHERE a.token_hash = %(hash)s AND a.revoked_at IS NULL AND a.expires_at > %(now)s"
            " AND g.revoked_at IS NULL",
            {"hash": token_hash, "now": now},
            user_ban=True,
        )

    def get_refresh_token(self, token_hash):
        return self._one(
            _REFRESH,
            "SELECT r.*, g.revoked_at IS NOT NULL AS revoked" + _WITH_BAN
            + " FROM refresh_tokens r JOIN grants g ON g.grant_id = r.grant_id"
            " LEFT JOIN bans b ON b.sub = r.sub WHERE r.token_hash = %(hash)s",
            {"hash": token_hash},
            user_ban=True,
        )

    def rotate_refresh(self, old_hash, new_refresh, new_access, replay, grace_until, now):
        return self._run(_rotate_refresh, old_hash, new_refresh, new_access, replay, grace_until, now)

    def revoke_token(self, token_hash, client_id, now):
        return self._run(_revoke_token, token_hash, client_id, now)

    def revoke_grant(self, grant_id, now):
        return self._changed(_REVOKE_GRANT, {"grant_id": grant_id, "now": now})

    def revoke_user_grants(self, sub, now):
        return self._count(
            "UPDATE grants SET revoked_at = %(now)s WHERE sub = %(sub)s AND revoked_at IS NULL",
            {"sub": sub, "now": now},
        )

    def access_state(self, sub, now):
        if _holds_nul({"sub": sub}):
            return succeed(AccessState(ban=None, has_active_grant=False))
        return self._one(
            None,
            "SELECT EXISTS (SELECT 1 FROM grants g WHERE g.sub = %(sub)s AND g.revoked_at IS NULL AND ("
            " EXISTS (SELECT 1 FROM access_tokens a WHERE a.grant_id = g.grant_id"
            "  AND a.revoked_at IS NULL AND a.expires_at > %(now)s)"
            " OR EXISTS (SELECT 1 FROM refresh_tokens r WHERE r.grant_id = g.grant_id"
            "  AND r.consumed_at IS NULL AND r.expires_at > %(now)s))) AS has_grant"
            + _WITH_BAN
            + " FROM (SELECT 1) AS one"
            " LEFT JOIN bans b ON b.sub = %(sub)s AND (b.until IS NULL OR b.until > %(now)s)",
            {"sub": sub, "now": now},
        ).addCallback(lambda row: AccessState(ban=_ban_of(row, sub), has_active_grant=row["has_grant"]))

    def session_clients(self, sid):
        if _holds_nul({"sid": sid}):
            return succeed([])

        async def clients(db):
            rows = await _fetch(
                db, 'SELECT DISTINCT client_id COLLATE "C" AS client_id FROM grants WHERE sid = %(sid)s ORDER BY 1',
                {"sid": sid},
            )
            return [row["client_id"] for row in rows]

        return self._run(clients)

    def save_consent(self, sub, client_id, scope, now):
        return self._write(
            "INSERT INTO consents (sub, client_id, scope, created_at)"
            " VALUES (%(sub)s, %(client_id)s, %(scope)s, %(now)s)"
            " ON CONFLICT (sub, client_id) DO UPDATE SET scope = EXCLUDED.scope, created_at = EXCLUDED.created_at",
            {"sub": sub, "client_id": client_id, "scope": _scope_text(scope), "now": now},
        )

    def get_consent(self, sub, client_id):
        return self._one(
            None, "SELECT scope FROM consents WHERE sub = %(sub)s AND client_id = %(client_id)s",
            {"sub": sub, "client_id": client_id},
        ).addCallback(lambda row: None if row is None else frozenset(row["scope"].split()))

    def revoke_consent(self, sub, client_id):
        return self._changed(
            "DELETE FROM consents WHERE sub = %(sub)s AND client_id = %(client_id)s",
            {"sub": sub, "client_id": client_id},
        )

    # IBanStore

    def ban_user(self, ban):
        return self._write(_BANS.upsert, _BANS.params(ban))

    def unban_user(self, sub):
        return self._changed("DELETE FROM bans WHERE sub = %(sub)s", {"sub": sub})

    def get_ban(self, sub, now):
        return self._one(
            _BANS, "SELECT * FROM bans WHERE sub = %(sub)s AND (until IS NULL OR until > %(now)s)",
            {"sub": sub, "now": now},
        )

    def list_bans(self, now):
        return self._all(
            _BANS, 'SELECT * FROM bans WHERE until IS NULL OR until > %(now)s ORDER BY sub COLLATE "C"',
            {"now": now},
        )

    # ILinkedAccountStore

    def link_account(self, account):
        # Replacing the user's earlier link at that provider is the upsert's conflict.
        return self._write(_LINKED.upsert, _LINKED.params(account))

    def get_linked_account(self, sub, provider):
        return self._one(
            _LINKED, "SELECT * FROM linked_accounts WHERE sub = %(sub)s AND provider = %(provider)s",
            {"sub": sub, "provider": provider},
        )

    def unlink_account(self, sub, provider):
        return self._changed(
            "DELETE FROM linked_accounts WHERE sub = %(sub)s AND provider = %(provider)s",
            {"sub": sub, "provider": provider},
        )

    def update_linked_tokens(
        self, account_id, expected_version, access_token_enc, refresh_token_enc, scope, expires_at, now,
    ):
        return self._one(
            _LINKED,
            "UPDATE linked_accounts SET access_token_enc = %(access)s,"
            " refresh_token_enc = COALESCE(%(refresh)s, refresh_token_enc),"
            " scope = %(scope)s, expires_at = %(expires_at)s, updated_at = %(now)s, version = version + 1"
            " WHERE account_id = %(id)s AND version = %(version)s RETURNING *",
            {
                "access": access_token_enc, "refresh": refresh_token_enc, "scope": scope,
                "expires_at": expires_at, "now": now, "id": account_id, "version": expected_version,
            },
        )

    def acquire_link_lock(self, account_id, holder, now, ttl):
        # Taken when there is no lease, it has run out, or the holder renews it.
        return self._one(
            None,
            "INSERT INTO link_locks (account_id, holder, until) VALUES (%(id)s, %(holder)s, %(until)s)"
            " ON CONFLICT (account_id) DO UPDATE SET holder = EXCLUDED.holder, until = EXCLUDED.until"
            " WHERE link_locks.until <= %(now)s OR link_locks.holder = EXCLUDED.holder"
            " RETURNING holder",
            {"id": account_id, "holder": holder, "until": now + ttl, "now": now},
        ).addCallback(lambda row: row is not None)

    def release_link_lock(self, account_id, holder):
        return self._count(
            "DELETE FROM link_locks WHERE account_id = %(id)s AND holder = %(holder)s",
            {"id": account_id, "holder": holder},
        ).addCallback(lambda _: None)

    # IStore

    def ping(self):
        return self._run(_first, "SELECT 1").addCallback(lambda _: None)

    def gc(self, now, batch_size):
        return self._run(_gc, now, batch_size)

    def close(self):
        self._pool.close()
        return succeed(None)


# --- the atomic steps -----------------------------------------------------------

_REVOKE_GRANT = "UPDATE grants SET revoked_at = %(now)s WHERE grant_id = %(grant_id)s AND revoked_at IS NULL"


async def _consume_code(db, code_hash, now):
    # A redemption that waited for a racing one's row lock re-checks used_at
    # on the committed row and changes nothing; the SELECT then sees it used.
    params = {"hash": code_hash, "now": now}
    row = await _first(
        db,
        "UPDATE authorization_codes SET used_at = %(now)s"
        " WHERE code_hash = %(hash)s AND used_at IS NULL AND expires_at > %(now)s"
        " AND EXISTS (SELECT 1 FROM grants g"
        "  WHERE g.grant_id = authorization_codes.grant_id AND g.revoked_at IS NULL)"
        " RETURNING *",
        params,
    )
    if row is not None:
        return CodeConsumed(_CODES.load(row))
    used = await _first(
        db, "SELECT grant_id FROM authorization_codes WHERE code_hash = %(hash)s AND used_at IS NOT NULL", params
    )
    return CodeNotFound() if used is None else CodeReused(used["grant_id"])


_ROTATE = (
    "WITH rotated AS ("
    " UPDATE refresh_tokens SET consumed_at = %(now)s, grace_until = %(grace_until)s, replay = %(replay)s"
    " WHERE token_hash = %(old_hash)s AND consumed_at IS NULL AND expires_at > %(now)s"
    " AND EXISTS (SELECT 1 FROM grants g"
    "  WHERE g.grant_id = refresh_tokens.grant_id AND g.revoked_at IS NULL)"
    " RETURNING grant_id),"
    f" new_access AS ({_ACCESS.insert_as('a_', 'rotated')}),"
    f" new_refresh AS ({_REFRESH.insert_as('r_', 'rotated')})"
    " SELECT grant_id FROM rotated"
)

# Not rotated just now: why not, decided on one snapshot. A token consumed
# before its grace window closed is reuse, and its grant is revoked by the
# same statement.
_NOT_ROTATED = (
    "WITH old AS ("
    " SELECT r.grant_id, r.expires_at, r.consumed_at, r.grace_until, r.replay, g.revoked_at"
    " FROM refresh_tokens r JOIN grants g ON g.grant_id = r.grant_id WHERE r.token_hash = %(old_hash)s),"
    " reuse AS ("
    " SELECT grant_id FROM old WHERE revoked_at IS NULL AND expires_at > %(now)s AND consumed_at IS NOT NULL"
    "  AND (replay IS NULL OR grace_until <= %(now)s)),"
    " revoked AS ("
    " UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM reuse)"
    "  AND revoked_at IS NULL)"
    " SELECT old.*, EXISTS (SELECT 1 FROM reuse) AS reused FROM old"
)


async def _rotate_refresh(db, old_hash, new_refresh, new_access, replay, grace_until, now):
    params = {"old_hash": old_hash, "now": now}
    rotated = await _first(
        db, _ROTATE,
        {
            **params, "grace_until": grace_until, "replay": replay,
            **_ACCESS.params(new_access, "a_"), **_REFRESH.params(new_refresh, "r_"),
        },
    )
    if rotated is not None:
        return Rotated()
    old = await _first(db, _NOT_ROTATED, params)
    if old is None:
        return RefreshNotFound()
    if old["reused"]:
        return Reused(old["grant_id"])
    if old["revoked_at"] is None and old["expires_at"] > now and old["consumed_at"] is not None:
        return Replayed(bytes(old["replay"]))
    return RefreshNotFound()


_REVOKE_TOKEN = (
    "WITH refresh AS ("
    " SELECT grant_id FROM refresh_tokens WHERE token_hash = %(hash)s AND client_id = %(client_id)s),"
    " family AS ("
    " UPDATE grants SET revoked_at = %(now)s WHERE grant_id IN (SELECT grant_id FROM refresh)"
    "  AND revoked_at IS NULL),"
    " access AS ("
    " UPDATE access_tokens SET revoked_at = COALESCE(revoked_at, %(now)s)"
    " WHERE token_hash = %(hash)s AND client_id = %(client_id)s AND NOT EXISTS (SELECT 1 FROM refresh)"
    " RETURNING grant_id)"
    " SELECT (SELECT grant_id FROM refresh) AS refresh_grant, (SELECT grant_id FROM access) AS access_grant"
)


async def _revoke_token(db, token_hash, client_id, now):
    if _holds_nul({"client_id": client_id}):
        return NotRevoked()
    row = await _first(db, _REVOKE_TOKEN, {"hash": token_hash, "client_id": client_id, "now": now})
    if row["refresh_grant"] is not None:
        return RevokedRefresh(row["refresh_grant"])
    if row["access_grant"] is not None:
        return RevokedAccess(row["access_grant"])
    return NotRevoked()


# Each statement takes up to %(limit)s rows of one kind, skipping rows another
# instance's housekeeping holds. A grant goes once it is revoked or expired
# and none of its codes could still be redeemed (a redemption may still be
# issuing tokens into it); an expired one also waits for its last live token.
# Its codes and tokens go with it (ON DELETE CASCADE).
_NO_LIVE_CODE = (
    "NOT EXISTS (SELECT 1 FROM authorization_codes c WHERE c.grant_id = old.grant_id AND c.expires_at > %(now)s)"
)
_GC = tuple(
    f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} AS old WHERE {expired}"
    " LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    for table, key, expired in (
        ("authorization_codes", "code_hash", "expires_at <= %(now)s"),
        ("pending_authorizations", "request_id", "expires_at <= %(now)s"),
        ("browser_sessions", "session_hash", "expires_at <= %(now)s"),
        ("access_tokens", "token_hash", "expires_at <= %(now)s"),
        ("refresh_tokens", "token_hash", "expires_at <= %(now)s"),
        ("bans", "sub", "until <= %(now)s"),
        ("link_locks", "account_id", "until <= %(now)s"),
        ("grants", "grant_id", f"old.revoked_at IS NOT NULL AND {_NO_LIVE_CODE}"),
        (
            "grants",
            "grant_id",
            f"old.expires_at <= %(now)s AND {_NO_LIVE_CODE}"
            " AND NOT EXISTS (SELECT 1 FROM access_tokens a WHERE a.grant_id = old.grant_id"
            "  AND a.revoked_at IS NULL AND a.expires_at > %(now)s)"
            " AND NOT EXISTS (SELECT 1 FROM refresh_tokens r WHERE r.grant_id = old.grant_id"
            "  AND r.consumed_at IS NULL AND r.expires_at > %(now)s)",
        ),
    )
) + (
    "UPDATE refresh_tokens SET replay = NULL WHERE token_hash IN (SELECT token_hash FROM refresh_tokens AS old"
    " WHERE replay IS NOT NULL AND grace_until <= %(now)s LIMIT %(limit)s FOR UPDATE SKIP LOCKED)",
)


async def _gc(db, now, batch_size):
    """One short statement per kind, so that requests wait little for its locks."""
    count = 0
    for statement in _GC:
        count += await _rowcount(db, statement, {"now": now, "limit": batch_size})
    return count
