"""
A pool of asynchronous txpostgres connections, its neutral failures and the
query helpers, shared by the PostgreSQL plugins (store, identity backend).

Nothing here knows a plugin's own exceptions: the pool raises the failures
below (or the driver's), and each plugin turns them into its own error at
its edge through the C{translate} function it gives the pool. Nothing here
ever logs or raises with the DSN, which may hold a password.
"""

from __future__ import annotations

import os
import re
import select
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

import psycopg2
import psycopg2.extensions
from attrs import frozen
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.logger import Logger
from twisted.python.failure import Failure
from txpostgres import txpostgres

from authsrv.hostlookup import HostLookups
from authsrv.pg.settings import ConnectionSettings, needs_lookup, targets

LOOKUP_POOL_NAME, LOOKUP_POOL_SIZE = "postgres-lookups", 2
"""The host name lookups' thread pool, shared by every plugin's pool."""


def host_lookups(context, connections: int) -> HostLookups:
    """
    The host name lookups of a pool of C{connections}, on the lookup threads
    every pool shares: at most one per connection waits for a thread, and
    one whose connection attempt gave up is skipped, so that while name
    servers hang in a database outage the reconnect attempts never pile
    lookups up (a refused one fails its attempt as the database being
    unavailable).
    """
    return HostLookups(context.reactor, context.threadpool(LOOKUP_POOL_NAME, LOOKUP_POOL_SIZE), connections)

CLIENT_DEADLINE_MARGIN = 1
"""
Seconds the client waits beyond the server's statement timeout before it
closes a connection: the server's cancellation gives the clearer error and
keeps the connection, so it should come first.
"""


def first_line(error: BaseException) -> str:
    """An error as one short line for logs and messages: libpq's messages never quote the DSN."""
    if isinstance(error, psycopg2.Error):
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    return " ".join(str(error).split()) or type(error).__name__



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


class ServerCancelled(Exception):
    """The server cancelled the statement: its statement_timeout ran out."""


def _ended(error: BaseException) -> bool:
    """
    Whether C{error} says that the session is over, so that its connection
    must not serve again: the client lost it (a driver error without a
    SQLSTATE, a lost socket), or the server ended it (class 57P: a
    shutdown, a crash, C{pg_terminate_backend}; class 08). Not a statement
    the server refused, nor one it cancelled (57014), on a session that goes on.
    """
    if isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return error.pgcode is None or error.pgcode.startswith(("57P", "08"))
    return isinstance(error, (ConnectionDone, ConnectionLost))


def is_outage(error: BaseException) -> bool:
    """Whether C{error} says the database cannot be reached, rather than that it refused a statement."""
    return isinstance(
        error,
        (
            NoFreeConnection, ConnectFailed, TimedOut, ServerCancelled, OSError,
            psycopg2.OperationalError, psycopg2.InterfaceError, ConnectionDone, ConnectionLost,
        ),
    )


class _Cursor(txpostgres.Cursor):
    """
    A txpostgres cursor that fires its result as soon as the reply is read,
    and leaves the socket to its connection (L{_Connection}) meanwhile.

    txpostgres defers the result to the reactor's next turn (a delayed call
    and a loop iteration per query: a quarter of a store lookup's CPU) in
    case the code that runs next starts a query on the same cursor from
    within this one's read; the Deferred is taken off the cursor before it
    fires, so a query started there polls afresh. txpostgres also takes the
    socket from the connection for every query and gives it back after: four
    changes to the reactor's interest set a query, where the connection can
    hand its reads to the cursor under way.
    """

    def execute(self, query, params=None) -> Deferred:
        try:
            self._cursor.execute(query, params)
        except Exception:
            return fail()
        self._connection.cursorRunning(self)
        d: Deferred[_Cursor] = Deferred()
        self._pollingD = d
        d.addBoth(self._finished)
        self.continuePolling()
        return d

    def _finished(self, result):
        self._connection.cursorFinished(self)
        if isinstance(result, Failure) and result.check(psycopg2.extensions.QueryCanceledError):
            return Failure(ServerCancelled())
        return result

    def continuePolling(self, swallowErrors=False):
        try:
            state = self.pollable().poll()
        except Exception:
            if self._pollingD:
                d, self._pollingD = self._pollingD, None
                d.errback(Failure())
            elif not swallowErrors:
                raise
            return
        if state == psycopg2.extensions.POLL_OK:
            if self._pollingD:
                d, self._pollingD = self._pollingD, None
                d.callback(self)
        elif state == psycopg2.extensions.POLL_WRITE:
            self.reactor.addWriter(self._connection)
        elif state != psycopg2.extensions.POLL_READ:
            if self._pollingD:
                d, self._pollingD = self._pollingD, None
                d.errback(txpostgres.UnexpectedPollResult())
            elif not swallowErrors:
                raise txpostgres.UnexpectedPollResult()


class _Connection(txpostgres.Connection):
    """
    A txpostgres connection that stays the reactor's reader of its socket
    for as long as it is open and hands each read to the cursor under way,
    if any (see L{_Cursor}), and that closes itself when the server drops it
    while idle: txpostgres would raise from C{doRead}, and Twisted log it as
    an unhandled error, on every database restart. C{prepared} names the
    L{Prepared} statements this session holds.

    Once connected, the reactor watches a duplicate of libpq's descriptor
    that this connection owns: libpq closes its own the moment it reads
    that the server has gone, while the reactor still holds it (and could
    hold a new socket of the same number); the duplicate is closed only
    after the reactor has let go of it.
    """

    cursorFactory = _Cursor

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prepared: set[str] = set()
        self.timed_out: int | None = None
        self._running: _Cursor | None = None
        self._cursor: _Cursor | None = None
        self._watched: int | None = None

    def connect(self, *args, **kwargs) -> Deferred:
        return super().connect(*args, **kwargs).addCallback(self._watch)

    def cursor(self) -> _Cursor:
        """
        The connection's one cursor: a connection runs one statement at a
        time, and every caller here reads a statement's rows before it
        starts the next, so a cursor made per statement was work for nothing.
        """
        if self._cursor is None:
            self._cursor = super().cursor()
        return self._cursor

    def _watch(self, connected):
        self.reactor.removeReader(self)
        self._watched = os.dup(self._connection.fileno())
        self.reactor.addReader(self)
        return connected

    def fileno(self):
        return super().fileno() if self._watched is None else self._watched

    def close(self):
        super().close()
        if self._watched is not None:
            os.close(self._watched)
            self._watched = None

    def cursorRunning(self, cursor):
        self._cursors.add(cursor)
        self._running = cursor

    def cursorFinished(self, cursor):
        self._cursors.discard(cursor)
        if self._running is cursor:
            self._running = None
        if not self._connection.closed:
            self.checkForNotifies()

    def doRead(self):
        if self._running is not None:
            self._running.continuePolling()
            return
        if self._watched is None:
            # Still connecting: connect()'s poll reads. txpostgres would then watch the socket again, which
            # libpq has closed if the server hung up (a crash, a shutdown): an unhandled error in the log.
            txpostgres._PollingMixin.doRead(self)
            return
        try:
            super().doRead()
        except psycopg2.Error:
            self.close()

    def doWrite(self):
        if self._running is None:
            super().doWrite()
            return
        self.reactor.removeWriter(self)
        self._running.continuePolling()

    def connectionLost(self, reason):
        for cursor in list(self._cursors):
            cursor.connectionLost(reason)
        super().connectionLost(reason)


def _alive(connection: _Connection) -> bool:
    """
    Whether an idle connection is still open: anything waiting on its
    socket (the server's goodbye, which the reactor has not read yet) is
    read now, which closes the connection if the server ended it.
    """
    poller = select.poll()
    poller.register(connection.fileno(), select.POLLIN)
    while not connection.closed and poller.poll(0):
        connection.doRead()
    return not connection.closed


@frozen
class _Waiter:
    """Work that waits for a free slot until C{deadline}; C{result} fires with its outcome."""

    deadline: float
    result: Deferred
    work: Callable
    idempotent: bool
    fresh: bool


class Pool:
    """
    Up to C{size} txpostgres connections, each opened when
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
    leave time for the standby named next), names looked up by C{lookups},
    a L{HostLookups} (L{host_lookups}).

    A connection the server ended (a restart, a failover,
    C{pg_terminate_backend}) whose goodbye the reactor has not read yet
    never fails a request by itself: idempotent work (reads) that fails
    because its idle connection is over (L{_ended}) runs once more, on a
    new connection; other work gets an idle connection only after a look at
    its socket shows nothing waiting (L{_alive}: one non-blocking poll, no
    round trip). A write that may have reached the server is never sent
    again: its caller hears that the database is unavailable. A connection
    found over is dropped with every idle one (the server most likely ended
    them together), so later work connects anew rather than finding them
    over one by one.

    C{translate(error, label)} gives the plugin's exception for a failure
    and whether it is an outage. An outage is logged when it starts and
    when it ends, not once per request, as "C{what} unavailable (...);
    C{consequence} until it is back".
    """

    def __init__(
        self, reactor, settings: ConnectionSettings, *, size: int, lookups: HostLookups, translate, what: str,
        consequence: str, read_only: bool = False,
    ):
        self._reactor = reactor
        self._settings = settings
        self._work_seconds = settings.statement_timeout + CLIENT_DEADLINE_MARGIN
        self._setup = settings.session_setup(read_only=read_only)
        self._targets = targets(settings.dsn)
        self._lookups = lookups
        self._translate = translate
        self._what = what
        self._consequence = consequence
        self._free = size
        self._waiting: deque[_Waiter] = deque()
        self._busy: dict[_Connection, tuple[float, Deferred]] = {}
        self._timer = None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False
        self._reachable = True
        self._log = Logger(namespace=f"{__name__}.{what}")

    def run(self, work, label: str = "", *, idempotent: bool = False) -> Deferred:
        """
        Fires with the result of C{work(connection)} (a coroutine or a
        L{Deferred}) on one connection of the pool, or fails with the
        plugin's exception for C{translate}, which gets C{label}. Work waits
        for a free slot for at most C{connect_timeout} (L{NoFreeConnection})
        and runs for at most the statement timeout and a margin
        (L{TimedOut}: its connection is closed). C{idempotent} work (that
        only reads) may run twice, see the class.
        """
        return self._take(work, idempotent, False).addErrback(self._failed, label)

    def _take(self, work, idempotent: bool, fresh: bool) -> Deferred:
        """C{work} in a free slot, at once or once one is free; C{fresh}: on a new connection."""
        if self._closed:
            return fail(PoolClosed())
        if self._free:
            self._free -= 1
            return self._start(work, idempotent, fresh)
        started: Deferred = Deferred(self._leave_queue)
        deadline = self._reactor.seconds() + self._settings.connect_timeout
        self._waiting.append(_Waiter(deadline, started, work, idempotent, fresh))
        self._watch(deadline)
        return started

    def _failed(self, failure: Failure, label: str) -> Failure:
        if failure.check(CancelledError):
            return failure  # the caller gave up (its client went away): not the database's doing
        error, outage = self._translate(failure.value, label)
        if outage and self._reachable:
            self._reachable = False
            self._log.warn(
                "{what} unavailable ({error}); {consequence} until it is back",
                what=self._what, error=str(error), consequence=self._consequence,
            )
        return Failure(error)

    def _start(self, work, idempotent: bool, fresh: bool) -> Deferred:
        """C{work} on an open connection, or on a new one; the caller holds a slot for it."""
        connection = self._idle_connection(checked=not idempotent) if self._reachable and not fresh else None
        if connection is None:
            return Deferred.fromCoroutine(self._connect_and_run(work, fresh))
        if idempotent:
            return self._on(connection, work).addErrback(self._again, work)
        return self._on(connection, work)

    def _again(self, failure: Failure, work) -> Deferred | Failure:
        """
        Idempotent work whose idle connection turned out over (the server
        ended it, unnoticed so far) runs once more, on a new connection: the
        other idle ones may be over too, their goodbyes still on the way.
        """
        if not _ended(failure.value):
            return failure
        return self._take(work, False, True)

    async def _connect_and_run(self, work, fresh: bool):
        try:
            if self._closed:
                raise PoolClosed()
            connection = (None if fresh else self._idle_connection(checked=True)) or await self._connect()
        except BaseException:
            self._release()
            raise
        if not self._reachable:
            self._reachable = True
            self._log.info("{what} reachable again", what=self._what)
        return await self._on(connection, work)

    def _on(self, connection: _Connection, work) -> Deferred:
        """
        C{work} on C{connection}, under the pool's one watch of deadlines
        (L{_sweep}) instead of a timer of its own; then the connection and
        its slot go back.
        """
        try:
            started = work(connection)
            if not isinstance(started, Deferred):
                started = Deferred.fromCoroutine(started)
        except Exception:
            started = fail()
        if not started.called:
            deadline = self._reactor.seconds() + self._work_seconds
            self._busy[connection] = (deadline, started)
            self._watch(deadline)
        return started.addBoth(self._give_back, connection)

    def _give_back(self, outcome, connection: _Connection):
        self._busy.pop(connection, None)
        timed_out = connection.timed_out
        if timed_out is None and isinstance(outcome, Failure) and _ended(outcome.value):
            self._drop(connection)
            self._drop_idle()
        else:
            self._checkin(connection)
        self._release()
        if timed_out is not None:
            return Failure(TimedOut(timed_out))
        return outcome

    def _release(self) -> None:
        """A slot is free: the longest-waiting work, if any, takes it, unless the pool was closed."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if waiter.result.called:
                continue
            if self._closed:
                waiter.result.errback(PoolClosed())
                continue
            self._start(waiter.work, waiter.idempotent, waiter.fresh).chainDeferred(waiter.result)
            return
        self._free += 1

    def _leave_queue(self, result: Deferred) -> None:
        """The caller gave up on work still waiting for a slot."""
        self._waiting = deque(waiter for waiter in self._waiting if waiter.result is not result)

    def _watch(self, deadline: float) -> None:
        """Have L{_sweep} run by C{deadline}."""
        if self._timer is None:
            self._timer = self._reactor.callLater(max(0.0, deadline - self._reactor.seconds()), self._sweep)
        elif deadline < self._timer.getTime():
            self._timer.reset(max(0.0, deadline - self._reactor.seconds()))

    def _sweep(self) -> None:
        """
        Work past its deadline is cancelled (after its connection is
        closed: txpostgres cannot cancel a query on a silent server), work
        that waited too long for a slot fails. Deadlines are a fixed time
        after each start, so the oldest come first in both queues.
        """
        self._timer = None
        now = self._reactor.seconds()
        for connection, (deadline, started) in list(self._busy.items()):
            if deadline > now:
                break
            connection.timed_out = self._work_seconds
            self._drop(connection)
            started.cancel()
        timeout = self._settings.connect_timeout
        while self._waiting and self._waiting[0].deadline <= now:
            waiter = self._waiting.popleft()
            if not waiter.result.called:
                waiter.result.errback(NoFreeConnection(timeout))
        heads = [deadline for deadline, _ in islice(self._busy.values(), 1)]
        heads += [waiter.deadline for waiter in islice(self._waiting, 1)]
        if heads:
            self._watch(min(heads))

    def close(self) -> None:
        """Close every connection now; work under way fails."""
        self._closed = True
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()
        for connection, (_, started) in list(self._busy.items()):
            started.cancel()
        self._release()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _drop_idle(self) -> None:
        """Drop every idle connection."""
        while self._idle:
            self._drop(self._idle.pop())

    def _idle_connection(self, checked: bool) -> _Connection | None:
        """The most recently used open idle connection, if any; C{checked}: only one found L{_alive}."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and (not checked or _alive(connection)):
                return connection
            self._drop(connection)
        return None

    async def _connect(self) -> _Connection:
        """A new connection to the first address of the first server the DSN names that answers in time."""
        failure: Exception = ConnectionError("the DSN names no address to connect to")
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
        if "hostaddr" in target or not needs_lookup(target.get("host", "")):
            return [target]
        lookup = self._lookups(target["host"])
        try:
            addresses = await self._within(self._settings.connect_timeout, lookup)
        finally:
            lookup.cancel()  # one still waiting for a thread when the attempt ends is skipped
        return [target | {"hostaddr": address} for address in addresses]

    async def _connect_to(self, target: dict) -> _Connection:
        timeout = self._settings.connect_timeout
        connection = _Connection(self._reactor)
        self._open.add(connection)
        try:
            parameters = self._settings.parameters(target)
            await self._within(timeout, connection.connect(**parameters), connection)
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

        result: Deferred[Any] = Deferred(abandon)

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

_NAMED = re.compile(r"%\((\w+)\)s")


class Prepared:
    """
    A hot statement that each connection prepares once (PREPARE) and then
    runs by name (EXECUTE), so that PostgreSQL parses and plans it once per
    session instead of once per request. C{sql} has C{%(name)s} parameters,
    as every other statement here; C{before}, statements sent ahead of it
    in the same query (so in its transaction) each time it runs.
    """

    def __init__(self, name: str, sql: str, before: str = ""):
        order: list[str] = []
        for found in _NAMED.findall(sql):
            if found not in order:
                order.append(found)
        self.name = name
        self.prepare = f"PREPARE {name} AS " + _NAMED.sub(lambda m: f"${order.index(m.group(1)) + 1}", sql)
        self.execute = before + f"EXECUTE {name} (" + ", ".join(f"%({field})s" for field in order) + ")"


async def _prepare_again(db, statement: Prepared, params, failure: Failure):
    """
    A cursor that ran C{statement} after it failed as C{failure}: a session
    that lost it (a pooler between us and the server that discards session
    state), or whose plan a migration made stale (another instance added a
    column: "cached plan must not change result type"), prepares it again,
    once.
    """
    if failure.check(psycopg2.errors.InvalidSqlStatementName):
        db.prepared.discard(statement.name)
    elif failure.check(psycopg2.errors.FeatureNotSupported):
        db.prepared.discard(statement.name)
        await db.cursor().execute(f"DEALLOCATE {statement.name}")
    else:
        failure.raiseException()
    return await _prepare_and_run(db, statement, params)


async def _prepare_and_run(db, statement: Prepared, params):
    try:
        await db.cursor().execute(statement.prepare)
    except psycopg2.errors.DuplicatePreparedStatement:
        pass  # behind a transaction pooler, another client's session prepared it on this server connection
    db.prepared.add(statement.name)
    return await db.cursor().execute(statement.execute, params)


def _execute(db, sql: "str | Prepared", params) -> Deferred:
    """
    Fires with the cursor that ran C{sql}. A statement this session has
    prepared runs by name with plain callbacks, no coroutine around it:
    these are the hot lookups, and the coroutine's machinery cost as much
    as the rest of the client's part.
    """
    if not isinstance(sql, Prepared):
        return db.cursor().execute(sql, params)
    if sql.name not in db.prepared:
        return Deferred.fromCoroutine(_prepare_and_run(db, sql, params))
    return db.cursor().execute(sql.execute, params).addErrback(
        lambda failure: Deferred.fromCoroutine(_prepare_again(db, sql, params, failure)))


def _dicts(cursor) -> list[dict]:
    """
    The rows as dicts by column name. psycopg2's RealDictCursor builds each
    row in Python, a column at a time; zipping the plain tuples with the
    names is done in C (about a tenth of introspection's CPU on PostgreSQL).
    """
    rows = cursor.fetchall()
    if not rows:
        return rows
    names = [column.name for column in cursor.description]
    return [dict(zip(names, row)) for row in rows]


def _first(rows: list[dict]) -> dict | None:
    return rows[0] if rows else None


def _rowcount(cursor) -> int:
    return cursor.rowcount


def fetch(db, sql: "str | Prepared", params=None) -> Deferred:
    """Fires with the rows as dicts."""
    return _execute(db, sql, params).addCallback(_dicts)


def first(db, sql: "str | Prepared", params=None) -> Deferred:
    """Fires with the first row as a dict, or None."""
    return fetch(db, sql, params).addCallback(_first)


def rowcount(db, sql: "str | Prepared", params=None) -> Deferred:
    """Run one statement; fires with how many rows it changed."""
    return _execute(db, sql, params).addCallback(_rowcount)
