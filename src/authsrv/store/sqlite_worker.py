"""
The one thread that owns an SQLite connection, with group commit.

SQLite allows one writer at a time and each durable COMMIT waits for the
disk. Writes that queue up while one commits are therefore run together in
the next transaction, each inside its own SAVEPOINT: a write that fails is
rolled back alone, and every write's result is delivered only after the
single COMMIT that made it durable. Under concurrent token requests this
turns one disk sync per write into one per batch. Reads that queue up are
likewise run one after another and their results handed to the reactor
thread in one wake-up. Where the reactor would wake the thread once per
call only for it to wait for the GIL, the reactor hands it the whole
turn's calls at the turn's end instead (C{gather}, L{SQLiteWorker.submit}).

A plain queue and thread, rather than Twisted's thread pool, because every
store call crosses threads twice and the pool's coordination costs twice as
much per crossing; it is still bounded: one thread.

A write that need not outlast a power failure (L{SQLiteWorker.submit}'s
C{durable}) still commits before its result is delivered, but where every
write of its batch is such, the COMMIT does not wait for the disk
(C{PRAGMA synchronous = NORMAL} in WAL mode): the next durable commit syncs
the write-ahead log with everything before it, so a power failure can only
lose the last commits, never one without those after it.

A thread made C{background} runs as a batch task (Linux's C{SCHED_BATCH}):
woken by the reactor's hand-over, it waits for the reactor thread to give
up the core instead of preempting it, only to find the GIL held and hand
the core back (bench/README.md, "The reader waits its turn").
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque
from queue import Empty, SimpleQueue
from typing import Any, Callable

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from authsrv.scheduling import run_as_batch_task

MAX_BATCH = 64

_STOP = object()


class SQLiteWorker:
    """
    Runs C{work(connection, *args)} callables on its thread, L{submit}ted
    either C{transactional}, inside a group-committed transaction, or not:
    one at a time outside any transaction (reads, or work that manages its
    own transactions).
    """

    def __init__(self, reactor, connection: sqlite3.Connection, map_error: Callable, name: str,
                 gather: bool = False, background: bool = False, synchronous: str | None = None):
        """
        C{map_error} turns an SQLite exception into the store's own (or
        returns it); C{gather}: hand work to the thread once per reactor
        turn (L{submit}); C{background}: run the thread as a batch task;
        C{synchronous}: the connection's C{PRAGMA synchronous}, which a
        batch of writes none of them durable lowers to C{NORMAL}.
        """
        self._reactor = reactor
        self._gather = gather
        self._connection = connection
        self._map_error = map_error
        self._queue: SimpleQueue = SimpleQueue()
        self._pending: list = []
        self._background = background
        self._synchronous = self._level = synchronous
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> Deferred:
        """Finish what is queued, close the connection; fires when done."""
        d: Deferred[None] = Deferred()
        self._hand_over()
        self._queue.put([(_STOP, d)])
        return d

    def submit(self, transactional: bool, work, args, durable: bool = True) -> Deferred:
        """
        Queue C{work}; a C{transactional} one not C{durable} fires once
        committed, without waiting for the disk (above). Gathering, it
        reaches the thread with everything else submitted in this turn of
        the reactor, at the turn's end: one wake-up of the thread for all of
        them, instead of one each, every one of which could take the core
        from the reactor only to find the GIL held. Otherwise it starts at
        once, beside the reactor where there is a core to spare (a commit
        waiting for the disk, say).
        """
        d: Deferred[Any] = Deferred()
        job = (d, transactional, work, args, durable)
        if not self._gather:
            self._queue.put([job])
            return d
        if not self._pending:
            self._reactor.callLater(0, self._hand_over)
        self._pending.append(job)
        return d

    def _hand_over(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._queue.put(pending)

    def _deliver(self, outcomes) -> None:
        for d, result in outcomes:
            if isinstance(result, Failure):
                d.errback(result)
            else:
                d.callback(result)

    def _call(self, work, args):
        try:
            return work(self._connection, *args)
        except BaseException as e:
            return self._failure(e)

    def _failure(self, error: BaseException) -> Failure:
        mapped = self._map_error(error)
        return Failure(mapped) if mapped is not error else Failure(error)

    def _serve(self) -> None:
        if self._background:
            run_as_batch_task()
        queued: deque = deque()
        while True:
            if not queued:
                queued.extend(self._queue.get())
            while True:
                try:
                    queued.extend(self._queue.get_nowait())
                except Empty:
                    break
            item = queued.popleft()
            if item[0] is _STOP:
                self._connection.close()
                self._reactor.callFromThread(item[1].callback, None)
                return
            batch = [item]
            while queued and len(batch) < MAX_BATCH and queued[0][0] is not _STOP and queued[0][1] == item[1]:
                batch.append(queued.popleft())
            if item[1]:
                outcomes = self._commit(batch)
            else:
                outcomes = [(d, self._call(work, args)) for d, _, work, args, _ in batch]
            # One wake-up of the reactor thread for the whole batch.
            self._reactor.callFromThread(self._deliver, outcomes)

    def _commit(self, batch) -> list:
        """Run a batch of writes in one transaction; each write's outcome."""
        db = self._connection
        outcomes = []
        try:
            self._sync(any(job[4] for job in batch))
            db.execute("BEGIN IMMEDIATE")
            for index, (d, _, work, args, _) in enumerate(batch):
                db.execute(f"SAVEPOINT write_{index}")
                outcome = self._call(work, args)
                if isinstance(outcome, Failure):
                    if not db.in_transaction:
                        # SQLite gave up the whole transaction (I/O error, disk full).
                        raise outcome.value
                    db.execute(f"ROLLBACK TO write_{index}")
                db.execute(f"RELEASE write_{index}")
                outcomes.append((d, outcome))
            db.execute("COMMIT")
        except BaseException as e:
            if db.in_transaction:
                db.execute("ROLLBACK")
            failure = self._failure(e)
            return [(item[0], failure) for item in batch]
        return outcomes

    def _sync(self, durable: bool) -> None:
        """
        Make the transaction about to start wait for the disk at its COMMIT
        or not (SQLite reads the level at each COMMIT; it is set between
        transactions).
        """
        if self._synchronous is None:
            return
        level = self._synchronous if durable else "NORMAL"
        if level != self._level:
            self._connection.execute(f"PRAGMA synchronous = {level}")
            self._level = level
