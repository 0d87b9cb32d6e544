"""
The folder the workers count their metrics in (L{authsrv.metrics}): one per
parent process, named after it, C{authsrv-metrics-<pid>-<random>} in the
temporary directory. A parent that stops removes its own; one killed
(SIGKILL, the OOM killer) cannot, so a parent starting removes the folders
whose process no longer runs. Only folders of this name, of this user, and
of a pid that runs no process are removed: another running server's, and
anything else in the directory, are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile

from twisted.logger import Logger

PREFIX = "authsrv-metrics-"
_NAME = re.compile(r"authsrv-metrics-([1-9][0-9]{0,9})-[a-z0-9_]{8}")
"""A folder L{make} made: C{tempfile.mkdtemp} adds eight of these characters after the prefix."""

log = Logger()


def make(parent: str | None = None) -> str:
    """A new folder for this process's workers, in C{parent} (the temporary directory), once the abandoned are gone."""
    parent = parent or tempfile.gettempdir()
    remove_abandoned(parent)
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent)


def remove_abandoned(parent: str) -> None:
    """Remove the folders in C{parent} that a parent process of this user made and, killed, left behind."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None or _runs(int(match[1])):
            continue
        path = os.path.join(parent, name)
        try:
            status = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed the metrics folder {path} of process {pid}, which no longer runs", path=path,
                     pid=int(match[1]))


def _runs(pid: int) -> bool:
    """Whether a process C{pid} runs (another user's too); this one's own counts as running."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
