"""
The client side of one PostgreSQL store lookup, in instructions: the same
number however busy or fast the machine is that day, where a rate or a CPU
time moved by a tenth between runs of one minute here. A throwaway cluster
(fsync off: only the client is counted) holds a migrated, empty database;
this script then runs itself under valgrind's callgrind, which counts every
instruction the process executes, once with --calls lookups and once with
none, and divides the difference by --calls. With --src, the same is
counted for another checkout's authsrv, for a before/after in one sitting.

    .venv/bin/python bench/pg_instructions.py
    .venv/bin/python bench/pg_instructions.py --src BEFORE/src

A lookup is a store call that goes alone (get_grant, a plain single-row
read) or, with 16 under way on a pool of 8, waits for a connection; the
gathered kind (find_access_token) at 16 under way goes in groups, as many
as fell in one turn of the reactor: that depends on timing, which valgrind
slows, so the lookups per statement are given beside each figure, and
figures at 16 under way move between runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = (("get_grant", 1), ("get_grant", 16), ("find_access_token", 16))


def lookups(kind: str, under_way: int, calls: int, dsn: str) -> None:
    """Run C{calls} lookups of C{kind}, C{under_way} at a time, after a warm-up that opens the pool."""
    from twisted.internet import defer, reactor

    from authsrv.context import PluginContext
    from authsrv.store.postgres import PostgresStore

    store = PostgresStore(reactor, dsn, pool_size=8, statement_timeout=5, connect_timeout=5,
                          lookups=PluginContext(reactor, ".").threadpool("lookups", 1))
    call = {
        "get_grant": lambda n: store.get_grant(f"grant-{n}"),
        "find_access_token": lambda n: store.find_access_token(f"hash-{n}", 1),
    }[kind]

    async def worker(count: int) -> None:
        for n in range(count):
            await call(n)

    statements = []
    run = store._pool.run
    store._pool.run = lambda work, label="": (statements.append(label), run(work, label))[1]

    async def main() -> None:
        await defer.gatherResults([defer.ensureDeferred(worker(50)) for _ in range(16)])
        statements.clear()
        await defer.gatherResults([defer.ensureDeferred(worker(calls // under_way)) for _ in range(under_way)])
        print(len(statements))

    def done(outcome):
        reactor.stop()
        return outcome

    reactor.callWhenRunning(lambda: defer.ensureDeferred(main()).addBoth(done))
    reactor.run()


def counted(src: Path, kind: str, under_way: int, calls: int, dsn: str) -> tuple[int, int]:
    """Instructions the whole process executed, under callgrind, and the statements its lookups went in."""
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--one", kind, str(under_way), str(calls), dsn],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}, check=True,
    )
    return int(re.search(r"Collected : (\d+)", run.stderr).group(1)), int(run.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3200, help="lookups counted per kind (default 3200)")
    parser.add_argument("--src", type=Path, action="append", default=[],
                        help="another checkout's src/ to count as well (before/after)")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, under_way, calls, dsn = args.one
        return lookups(kind, int(under_way), int(calls), dsn)
    sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
    from pgcluster import Cluster

    from authsrv.store.postgres import migrate

    cluster = Cluster(local=True)
    try:
        dsn = cluster.database()
        migrate(dsn, 5, 0)
        sources = [ROOT / "src", *(path.resolve() for path in args.src)]
        print("| source | lookup | under way | lookups per statement | instructions per lookup |\n|---|---|---|---|---|")
        for src in sources:
            for kind, under_way in KINDS:
                (spent, statements), (idle, _) = (counted(src, kind, under_way, calls, dsn) for calls in (args.calls, 0))
                name = "this checkout" if src == ROOT / "src" else str(src)
                print(f"| {name} | {kind} | {under_way} | {args.calls / statements:.2f} |"
                      f" {(spent - idle) // args.calls:,} |", flush=True)
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
