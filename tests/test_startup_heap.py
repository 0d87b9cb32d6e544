"""
C{twist authsrv} puts what startup made out of the garbage collector's
reach once the reactor runs (L{authsrv.tap.freeze_startup_heap}): checked
in a process of its own, since a frozen heap stays frozen.
"""

from __future__ import annotations

import subprocess
import sys

SERVICE = """
import gc, sys
from twisted.internet import reactor
from authsrv.tap import Options, makeService

options = Options()
options.parseOptions(["--data-dir", sys.argv[1], "--listen", "tcp:0:interface=127.0.0.1"])
makeService(options, reactor)
print("before", gc.get_freeze_count(), flush=True)
reactor.callWhenRunning(lambda: reactor.callLater(0, lambda: (print("running", gc.get_freeze_count()), reactor.stop())))
reactor.run()
"""


def test_the_heap_startup_made_is_frozen_once_the_reactor_runs(tmp_path):
    run = subprocess.run([sys.executable, "-c", SERVICE, str(tmp_path / "data")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    counts = dict(line.split() for line in run.stdout.splitlines() if line.startswith(("before", "running")))
    assert counts["before"] == "0"
    # Every module, plugin and object of the service built before the reactor started.
    assert int(counts["running"]) > 10000
