"""
What the PostgreSQL plugins (store, identity backend, keystore) share: the
connection keys of their config sections, blocking sessions for start-up
work, schema migrations, and a pool of asynchronous txpostgres connections.

Nothing here knows a plugin's own exceptions: the pool raises the neutral
failures below (or the driver's), and each plugin turns them into its own
error at its edge through the C{translate} function it gives the pool.
Nothing here ever logs or raises with the DSN, which may hold a password.
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket

import psycopg2
import psycopg2.errors
import psycopg2.extensions
from attrs import field, frozen
from psycopg2.extras import RealDictCursor
from twisted.internet.defer import CancelledError, Deferred, DeferredSemaphore, ensureDeferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from txpostgres import txpostgres

from authsrv.configsection import ConfigError, Section
from authsrv.migrations import schema_steps

LOOKUP_POOL_NAME, LOOKUP_POOL_SIZE = "postgres-lookups", 2
"""The host name lookups' thread pool, shared by every plugin's pool."""

CLIENT_DEADLINE_MARGIN = 1
"""
Seconds the client waits beyond the server's statement timeout before it
closes a connection: the server's cancellation gives the clearer error and
keeps the connection, so it should come first.
"""

MIGRATION_LOCK_WAIT = "60s"

_KEEPALIVES = {"keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}
"""So that a server that vanished without closing the connection is noticed."""


def advisory_lock_id(name: str) -> int:
    """A stable signed 64-bit advisory lock key for C{name}, clear of other users' small keys."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def first_line(error: BaseException) -> str:
    """An error as one short line for logs and messages: libpq's messages never quote the DSN."""
    if isinstance(error, psycopg2.Error):
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    return " ".join(str(error).split()) or type(error).__name__


# --- connection settings ----------------------------------------------------


@frozen
class ConnectionSettings:
    """
    Where and how to connect. C{key} is the config key the DSN came from,
    named by start-up errors; the DSN itself is never shown.
    """

    dsn: str = field(repr=False)
    key: str
    connect_timeout: int
    statement_timeout: int
    application_name: str

    def parameters(self, target: dict | None = None) -> dict:
        """libpq keyword parameters: the DSN's, with C{target}'s host and address, and keepalives."""
        return {
            "dsn": self.dsn, "fallback_application_name": self.application_name, **_KEEPALIVES, **(target or {}),
        }

    def session_setup(self, *, read_only: bool = False) -> str:
        """
        The statement that sets a new session's statement timeout (and,
        C{read_only}, read-only transactions by default). A statement rather
        than libpq's C{options}, which PgBouncer refuses.
        """
        setup = f"SET statement_timeout = {self.statement_timeout * 1000}"
        return setup + "; SET default_transaction_read_only = on" if read_only else setup

    def connect(self, *, read_only: bool = False):
        """A blocking psycopg2 connection in autocommit mode, for start-up work and the keystore."""
        connection = psycopg2.connect(**self.parameters(), connect_timeout=max(2, self.connect_timeout))
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(self.session_setup(read_only=read_only))
        return connection


def read_settings(section: Section, application_name: str) -> ConnectionSettings:
    """
    The connection keys: C{dsn} (a libpq connection string or URI without a
    password, since config files get copied and committed), or
    C{dsn_env}/C{dsn_file} (one that may hold a password; libpq also finds
    one in C{PGPASSWORD} or C{~/.pgpass}); C{connect_timeout} and
    C{statement_timeout} (durations, at least 1 s, default 5 s).
    """
    given = [name for name in ("dsn", "dsn_env", "dsn_file") if section.has(name)]
    if not given:
        raise section.error("dsn", "is required (or dsn_env, dsn_file when it holds a password)")
    if len(given) > 1:
        raise section.error(given[1], f"give one of dsn, dsn_env, dsn_file, not several ({' and '.join(given)})")
    key = section.key(given[0])
    dsn = section.str("dsn") if given == ["dsn"] else section.secret("dsn")
    try:
        parameters = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        # libpq's message quotes the DSN.
        raise ConfigError(
            key, "is not a PostgreSQL connection string: it is not a libpq connection string or postgresql:// URI"
        ) from None
    if given == ["dsn"] and "password" in parameters:
        raise ConfigError(
            key, "holds a password: put the DSN in dsn_env or dsn_file, or the password in a .pgpass file"
            " or PGPASSWORD, never in the config file",
        )
    timeouts = {}
    for name in ("connect_timeout", "statement_timeout"):
        timeouts[name] = section.duration(name, 5)
        if timeouts[name] < 1:
            raise section.error(name, "must be at least 1s")
    return ConnectionSettings(dsn, key, application_name=application_name, **timeouts)


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


def _needs_lookup(host: str) -> bool:
    """A host name, as opposed to an address or a socket folder."""
    if not host or host.startswith("/"):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


def _addresses(host: str) -> list[str]:
    """Every address of C{host}, in the resolver's order, as libpq itself would try them."""
    found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(address[4][0] for address in found))


# --- schema migrations --------------------------------------------------------


class MigrationError(Exception):
    """The schema cannot be brought to this version (for example, it is newer)."""


def migrations(package: str) -> list[tuple[int, str, str]]:
    """(version, file name, SQL) of every C{schema/postgres/NNN_*.sql} step of C{package}, in order."""
    return schema_steps(package, "postgres")


@frozen
class Ledger:
    """
    Where a schema's applied versions are recorded: a table of its own, or,
    with C{component}, rows of a table several components share. Both
    layouts are in operators' databases, so both stay.
    """

    table: str
    name: str
    component: str | None = None

    def create(self) -> str:
        if self.component is None:
            return (
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " component TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL,"
            " applied_at BIGINT NOT NULL, PRIMARY KEY (component, version))"
        )

    def current(self, cursor) -> int:
        if self.component is None:
            cursor.execute(f"SELECT coalesce(max(version), 0) FROM {self.table}")
        else:
            cursor.execute(
                f"SELECT coalesce(max(version), 0) FROM {self.table} WHERE component = %s", (self.component,)
            )
        return cursor.fetchone()[0]

    def record(self, cursor, version: int, name: str, now: int) -> None:
        if self.component is None:
            cursor.execute(f"INSERT INTO {self.table} (version) VALUES (%s)", (version,))
        else:
            cursor.execute(
                f"INSERT INTO {self.table} (component, version, name, applied_at) VALUES (%s, %s, %s, %s)",
                (self.component, version, name, now),
            )


def migrate(connection, steps: list[tuple[int, str, str]], ledger: Ledger, lock: int, now: int = 0) -> int:
    """
    Bring a schema to the newest of C{steps} on C{connection} (autocommit),
    in one transaction under the advisory lock C{lock}: a second instance
    starting at once waits, then finds nothing left to do. A step may take
    long, so no statement timeout applies; the wait for the lock is
    bounded. Returns the version now in force; L{MigrationError} when the
    database's schema is newer than this code or the lock is not had.
    """
    latest = steps[-1][0] if steps else 0
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_WAIT}'; SET LOCAL statement_timeout = 0")
            try:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            except psycopg2.errors.LockNotAvailable:
                raise MigrationError(
                    f"another instance has been migrating the schema for {MIGRATION_LOCK_WAIT}; try again"
                ) from None
            cursor.execute(ledger.create())
            current = ledger.current(cursor)
            if current > latest:
                raise MigrationError(
                    f"its {ledger.name} schema version {current} is newer than this authsrv knows"
                    f" ({latest}); run a newer authsrv"
                )
            for version, name, script in steps:
                if version > current:
                    cursor.execute(script)
                    ledger.record(cursor, version, name, now)
            cursor.execute("COMMIT")
        except BaseException:
            if not connection.closed:
                cursor.execute("ROLLBACK")
            raise
    return max(current, latest)


# --- the connection pool --------------------------------------------------------


class NoFreeConnection(Exception):
    """Every connection stayed busy for C{seconds}."""

    def __init__(self, seconds: int):
        super().__init__(seconds)
        self.seconds = seconds


class TimedOut(Exception):
    """No answer within C{seconds}; the connection under way was closed."""

    def __init__(self, seconds: int):
        super().__init__(seconds)
        self.seconds = seconds


class ConnectFailed(Exception):
    """No server the DSN names could be connected to; C{cause} is the last attempt's failure."""

    def __init__(self, cause: BaseException):
        super().__init__(cause)
        self.cause = cause


class PoolClosed(Exception):
    """The pool was closed."""


def is_outage(error: BaseException) -> bool:
    """Whether C{error} says the database cannot be reached, rather than that it refused a statement."""
    return isinstance(
        error,
        (
            NoFreeConnection, ConnectFailed, TimedOut, CancelledError, OSError,
            psycopg2.OperationalError, psycopg2.InterfaceError, ConnectionDone, ConnectionLost,
        ),
    )


class _Connection(txpostgres.Connection):
    """
    A txpostgres connection that closes itself when the server drops it
    while idle: txpostgres would raise from C{doRead}, and Twisted log it as
    an unhandled error, on every database restart.
    """

    def doRead(self):
        try:
            super().doRead()
        except psycopg2.Error:
            self.close()


class Pool:
    """
    Up to C{size} txpostgres connections (rows as dicts), each opened when
    first needed, kept while it works and dropped as soon as it fails, with
    a deadline on connecting and on every piece of work.

    Not txpostgres's own ConnectionPool: it opens every connection at start
    (so it cannot start while the database is down), keeps a connection the
    server dropped forever, and its asynchronous connect ignores libpq's
    connect_timeout. A deadline here closes the socket, which ends the wait
    at once, where cancelling a query would block the reactor.

    Asynchronous libpq also has no deadline per server and looks host names
    up on the calling thread, so each address of each server the DSN names
    is tried in turn within C{connect_timeout} (a powered-off primary must
    leave time for the standby named next), names looked up on C{lookups},
    a thread pool.

    C{translate(error, label)} gives the plugin's exception for a failure
    and whether it is an outage. An outage is logged when it starts and
    when it ends, not once per request, as "C{what} unavailable (...);
    C{consequence} until it is back".
    """

    def __init__(
        self, reactor, settings: ConnectionSettings, *, size: int, lookups, translate, what: str,
        consequence: str, read_only: bool = False,
    ):
        self._reactor = reactor
        self._settings = settings
        self._setup = settings.session_setup(read_only=read_only)
        self._targets = targets(settings.dsn)
        self._lookups = lookups
        self._translate = translate
        self._what = what
        self._consequence = consequence
        self._slots = DeferredSemaphore(size)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False
        self._reachable = True
        self._log = Logger(namespace=f"{__name__}.{what}")

    def run(self, work, label: str = "") -> Deferred:
        """
        Fires with the result of C{work(connection)} (a coroutine or a
        L{Deferred}) on one connection of the pool, or fails with the
        plugin's exception for C{translate}, which gets C{label}.
        """
        return Deferred.fromCoroutine(self._run(work, label))

    async def _run(self, work, label: str):
        try:
            return await self._attempt(work)
        except BaseException as e:
            error, outage = self._translate(e, label)
            if outage and self._reachable:
                self._reachable = False
                self._log.warn(
                    "{what} unavailable ({error}); {consequence} until it is back",
                    what=self._what, error=str(error), consequence=self._consequence,
                )
            raise error from None

    async def _attempt(self, work):
        timeout = self._settings.connect_timeout
        slot = self._slots.acquire()
        try:
            if not slot.called:
                await slot.addTimeout(timeout, self._reactor)
        except DeferredTimeout:
            raise NoFreeConnection(timeout) from None
        try:
            if self._closed:
                raise PoolClosed()
            connection = self._idle_connection() or await self._connect()
            if not self._reachable:
                self._reachable = True
                self._log.info("{what} reachable again", what=self._what)
            try:
                deadline = self._settings.statement_timeout + CLIENT_DEADLINE_MARGIN
                return await self._within(deadline, ensureDeferred(work(connection)), connection)
            finally:
                self._checkin(connection)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Close every connection now; work under way fails."""
        self._closed = True
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
            self._open.discard(connection)
        return None

    async def _connect(self) -> _Connection:
        """A new connection to the first address of the first server the DSN names that answers in time."""
        failure = None
        for target in self._targets:
            try:
                for candidate in await self._candidates(target):
                    try:
                        return await self._connect_to(candidate)
                    except Exception as e:
                        failure = e
            except Exception as e:
                failure = e
        raise ConnectFailed(failure)

    async def _candidates(self, target: dict) -> list[dict]:
        """
        The parameters of each address of one server the DSN names
        (C{target}: its host, port, hostaddr), its name looked up off the
        reactor's thread.
        """
        if "hostaddr" in target or not _needs_lookup(target.get("host", "")):
            return [target]
        lookup = deferToThreadPool(self._reactor, self._lookups, _addresses, target["host"])
        addresses = await self._within(self._settings.connect_timeout, lookup)
        return [target | {"hostaddr": address} for address in addresses]

    async def _connect_to(self, target: dict) -> _Connection:
        timeout = self._settings.connect_timeout
        connection = _Connection(self._reactor)
        self._open.add(connection)
        try:
            parameters = self._settings.parameters(target)
            await self._within(timeout, connection.connect(cursor_factory=RealDictCursor, **parameters), connection)
            await self._within(timeout, connection.runOperation(self._setup), connection)
        except BaseException:
            self._drop(connection)
            raise
        return connection

    def _checkin(self, connection: _Connection) -> None:
        """Keep a connection that is open and outside any transaction; drop any other."""
        if (
            not self._closed
            and not connection.closed
            and connection.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE
        ):
            self._idle.append(connection)
        else:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        self._open.discard(connection)
        if connection.pollable() is not None:
            connection.close()

    def _within(self, seconds: int, work: Deferred, connection: _Connection | None = None) -> Deferred:
        """
        C{work}'s result, or L{TimedOut} after C{seconds}: then, or when the
        caller cancels, C{connection} is closed, which also ends C{work}
        (txpostgres cannot cancel a query on a silent server).
        """

        def abandon(_=None):
            if connection is not None:
                self._drop(connection)

        result = Deferred(abandon)

        def expire():
            # Failing first: closing the connection fails the work too, less clearly.
            if not result.called:
                result.errback(TimedOut(seconds))
            abandon()

        timer = self._reactor.callLater(seconds, expire)

        def finish(outcome):
            if timer.active():
                timer.cancel()
            if not result.called:
                if isinstance(outcome, Failure):
                    result.errback(outcome)
                else:
                    result.callback(outcome)

        work.addBoth(finish)
        return result


# --- queries ------------------------------------------------------------------


async def fetch(db, sql: str, params=None) -> list[dict]:
    cursor = db.cursor()
    await cursor.execute(sql, params)
    return cursor.fetchall()


async def first(db, sql: str, params=None) -> dict | None:
    rows = await fetch(db, sql, params)
    return rows[0] if rows else None


async def rowcount(db, sql: str, params=None) -> int:
    """Run one statement; how many rows it changed."""
    cursor = db.cursor()
    await cursor.execute(sql, params)
    return cursor.rowcount
