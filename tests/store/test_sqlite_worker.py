"""
The SQLite store's threads (L{authsrv.store.sqlite_worker.SQLiteWorker}):
gathering, what one turn of the reactor submits reaches the thread
together at the turn's end, writes in one transaction, in the order
submitted; otherwise the thread starts at once. Lookups are always
gathered, writes where the process has one core. A transaction waits for
the disk at its COMMIT only where one of its writes must. The lookups'
thread runs as a batch task, where the system lets it.
"""

from __future__ import annotations

import os
import sqlite3
import time

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults

from authsrv.store import sqlite
from authsrv.store.sqlite_worker import SQLiteWorker


def started_worker(path, gather: bool, synchronous: str | None = None) -> SQLiteWorker:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    if synchronous is not None:
        connection.execute(f"PRAGMA synchronous = {synchronous}")
    connection.execute("CREATE TABLE seen (n INTEGER)")
    statements: list[str] = []
    connection.set_trace_callback(statements.append)
    worker = SQLiteWorker(reactor, connection, lambda error: error, "test-sqlite-worker", gather,
                          synchronous=synchronous)
    worker.statements = statements
    return worker


@pytest.fixture
def worker(tmp_path):
    worker = started_worker(tmp_path / "worker.sqlite3", gather=True)
    yield worker
    pytest_twisted.blockon(worker.stop())


def insert(db, n):
    db.execute("INSERT INTO seen (n) VALUES (?)", (n,))
    return n


def numbers(db):
    return [n for n, in db.execute("SELECT n FROM seen ORDER BY rowid")]


@pytest_twisted.ensureDeferred
async def test_a_turns_writes_wait_for_its_end_then_commit_together(worker):
    started = [worker.submit(True, insert, (n,)) for n in range(5)]
    # The thread could take the GIL now, were the writes already queued to it.
    time.sleep(0.05)
    assert worker.statements == []
    assert await gatherResults(started) == [0, 1, 2, 3, 4]
    assert worker.statements.count("BEGIN IMMEDIATE") == 1
    assert worker.statements.count("COMMIT") == 1
    assert await worker.submit(False, numbers, ()) == [0, 1, 2, 3, 4]


@pytest_twisted.ensureDeferred
async def test_reads_and_writes_of_one_turn_keep_their_order(worker):
    results = gatherResults([
        worker.submit(False, numbers, ()),
        worker.submit(True, insert, (1,)),
        worker.submit(False, numbers, ()),
        worker.submit(True, insert, (2,)),
    ])
    assert await results == [[], 1, [1], 2]


def level(db) -> int:
    return db.execute("PRAGMA synchronous").fetchone()[0]


NORMAL, FULL = 1, 2


@pytest_twisted.ensureDeferred
async def test_a_transaction_waits_for_the_disk_only_where_one_of_its_writes_must(tmp_path):
    worker = started_worker(tmp_path / "sync.sqlite3", gather=True, synchronous="FULL")
    try:
        steps = [worker.submit(True, insert, (n,), durable=False) for n in (1, 2)]
        assert await gatherResults(steps) == [1, 2]
        assert worker.statements[:2] == ["PRAGMA synchronous = NORMAL", "BEGIN IMMEDIATE"]
        assert await worker.submit(False, level, ()) == NORMAL

        worker.statements.clear()
        mixed = [worker.submit(True, insert, (3,), durable=False), worker.submit(True, insert, (4,))]
        assert await gatherResults(mixed) == [3, 4]
        assert worker.statements[:2] == ["PRAGMA synchronous = FULL", "BEGIN IMMEDIATE"]
        assert worker.statements.count("COMMIT") == 1

        worker.statements.clear()
        assert await worker.submit(True, insert, (5,)) == 5
        assert not any(s.startswith("PRAGMA") for s in worker.statements), "already at FULL"
        assert await worker.submit(False, level, ()) == FULL
        assert await worker.submit(False, numbers, ()) == [1, 2, 3, 4, 5]
    finally:
        await worker.stop()


@pytest_twisted.ensureDeferred
async def test_a_connection_that_never_waits_for_the_disk_is_left_so(tmp_path):
    worker = started_worker(tmp_path / "normal.sqlite3", gather=True, synchronous="NORMAL")
    try:
        assert await gatherResults([worker.submit(True, insert, (1,), durable=False),
                                    worker.submit(True, insert, (2,))]) == [1, 2]
        assert await worker.submit(True, insert, (3,)) == 3
        assert not any(s.startswith("PRAGMA") for s in worker.statements)
        assert await worker.submit(False, level, ()) == NORMAL
    finally:
        await worker.stop()


@pytest_twisted.ensureDeferred
async def test_with_a_core_of_its_own_the_thread_starts_at_once(tmp_path):
    worker = started_worker(tmp_path / "worker.sqlite3", gather=False)
    try:
        written = worker.submit(True, insert, (1,))
        deadline = time.monotonic() + 10
        while "COMMIT" not in worker.statements and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "COMMIT" in worker.statements
        assert await written == 1
    finally:
        await worker.stop()


@pytest.mark.parametrize("cores, writes_gathered", [({0}, True), ({0, 1}, False)])
@pytest_twisted.ensureDeferred
async def test_the_store_gathers_lookups_always_and_writes_on_one_core(tmp_path, monkeypatch, cores,
                                                                       writes_gathered):
    monkeypatch.setattr(sqlite.os, "sched_getaffinity", lambda pid: cores)
    store = sqlite.open_store(reactor, tmp_path / "authsrv.sqlite3")
    try:
        assert (store._worker._gather, store._reader._gather) == (writes_gathered, True)
    finally:
        await store.close()


@pytest.mark.parametrize("gather", [True, False])
@pytest_twisted.ensureDeferred
async def test_stop_runs_what_was_submitted_first(tmp_path, gather):
    worker = started_worker(tmp_path / "stop.sqlite3", gather)
    written = worker.submit(True, insert, (7,))
    await worker.stop()
    assert await written == 7
    with sqlite3.connect(tmp_path / "stop.sqlite3") as db:
        assert numbers(db) == [7]


def scheduling_policy(worker: SQLiteWorker) -> int:
    return os.sched_getscheduler(worker._thread.native_id)


batch_tasks = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="batch tasks are Linux's")
"""Both tests read a thread's scheduling policy, which only Linux gives."""


@batch_tasks
@pytest_twisted.ensureDeferred
async def test_the_lookups_thread_runs_as_a_batch_task_and_the_writer_does_not(tmp_path):
    store = sqlite.open_store(reactor, tmp_path / "store.sqlite3")
    try:
        # The thread sets its own policy as it starts: by its first answer it has.
        await store.get_grant("g1")
        assert scheduling_policy(store._reader) == os.SCHED_BATCH
        assert scheduling_policy(store._worker) == os.SCHED_OTHER
    finally:
        await store.close()


@batch_tasks
@pytest_twisted.ensureDeferred
async def test_a_thread_that_may_not_be_a_batch_task_runs_as_before(tmp_path, monkeypatch):
    def refused(*_):
        raise PermissionError("not here")

    monkeypatch.setattr(os, "sched_setscheduler", refused)
    connection = sqlite3.connect(tmp_path / "refused.sqlite3", isolation_level=None, check_same_thread=False)
    worker = SQLiteWorker(reactor, connection, lambda error: error, "test-refused", gather=True, background=True)
    try:
        assert await worker.submit(False, lambda db: db.execute("SELECT 1").fetchone()[0], ()) == 1
        assert scheduling_policy(worker) == os.SCHED_OTHER
    finally:
        await worker.stop()
