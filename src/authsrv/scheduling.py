"""
How the kernel schedules authsrv's threads where the process may use one
core only (a pinned process, a one-CPU container). There a password check
(argon2id, about 18 ms of CPU) shares the core with the reactor and the
store's threads, and as ordinary tasks every wake-up of theirs (a request
arrived, a commit is done) takes the core from the check at once: twenty
switches and more per sign-in, each finding the caches swept by the
check's 19 MiB. As batch tasks (C{SCHED_BATCH}) a wake-up waits for the
running thread's turn to end, so requests and commits gather into fewer,
longer turns (bench/README.md, "Batch tasks on one core").
"""

from __future__ import annotations

import os

from twisted.logger import Logger

log = Logger()


def run_as_batch_task() -> bool:
    """The calling thread, and the threads it starts from now on, as batch tasks; False where refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        # Not Linux, or a sandbox that refuses it: the thread is scheduled as before.
        return False
    return True


def one_core() -> bool:
    """Whether this process may use one core only: a pinned process, a one-CPU container."""
    return len(os.sched_getaffinity(0)) == 1


def batch_on_one_core() -> None:
    """
    Run as batch tasks when this process may use one core only and was
    started as an ordinary task; a policy the operator chose (C{chrt},
    systemd's C{CPUSchedulingPolicy}) is left as it is. Called before any
    thread starts, so that every thread inherits it.
    """
    if not one_core() or os.sched_getscheduler(0) != os.SCHED_OTHER:
        return
    if run_as_batch_task():
        log.info("one core: the server's threads run as batch tasks (SCHED_BATCH)")
