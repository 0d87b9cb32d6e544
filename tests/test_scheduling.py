"""
Where the process may use one core only, its threads run as batch tasks
(L{authsrv.scheduling}); on more cores, or under a policy the operator
chose, the scheduling is left as it was. Each case runs in a process of
its own, pinned and scheduled as the case needs with util-linux's taskset
and chrt, since a policy once set sticks to the process.
"""

from __future__ import annotations

import os
import subprocess
import sys

from authsrv.embedded import prepare_data_dir
from conftest import free_port

POLICIES = {os.SCHED_OTHER: "other", os.SCHED_BATCH: "batch", os.SCHED_IDLE: "idle"}
PROBE = (
    "import os, threading\n"
    "from authsrv.scheduling import batch_on_one_core\n"
    "batch_on_one_core()\n"
    "seen = []\n"
    "thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))\n"
    "thread.start(); thread.join()\n"
    "print(os.sched_getscheduler(0), seen[0])\n"
)


def policies(*prefix: str) -> tuple[str, str]:
    """The policy of the probe's main thread and of a thread it started after, run under C{prefix}."""
    run = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    main, started = run.stdout.split()
    return POLICIES[int(main)], POLICIES[int(started)]


def test_on_one_core_every_thread_runs_as_a_batch_task():
    assert policies("taskset", "-c", "0") == ("batch", "batch")


def test_on_two_cores_the_scheduling_is_left_alone():
    assert len(os.sched_getaffinity(0)) >= 2, "this test needs a machine with two cores"
    assert policies("taskset", "-c", "0,1") == ("other", "other")


def test_a_policy_the_operator_chose_is_kept_even_on_one_core():
    assert policies("chrt", "-i", "0", "taskset", "-c", "0") == ("idle", "idle")


def test_twist_authsrv_pinned_to_one_core_runs_all_its_threads_as_batch_tasks(run_server, tmp_path):
    config, _ = prepare_data_dir(tmp_path / "data")
    port = free_port()
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(everywhere)})
    try:
        server = run_server(["authsrv", "--config", str(config), "--listen", f"tcp:{port}:interface=127.0.0.1"],
                            tmp_path, port=port, ready=False)
    finally:
        os.sched_setaffinity(0, everywhere)
    server.wait_ready()
    threads = os.listdir(f"/proc/{server.process.pid}/task")
    assert len(threads) >= 3, "the reactor and the store's writer and reader"
    assert {POLICIES[os.sched_getscheduler(int(tid))] for tid in threads} == {"batch"}
    _, err = server.stop()
    assert server.process.returncode == 0, err
