"""
Log files an operator rotates: the audit log and the access log. C{"-"}
is standard output (as the process had it at start, before C{twist}
redirects it into the log). Each write is one whole line; L{LineFile.reopen}
after logrotate moved the file, which SIGUSR1 asks for (L{reopen_on_sigusr1}).
"""

from __future__ import annotations

import signal
import sys

STDOUT = "-"


class LineFile:
    """
    A file appended to one line at a time. C{flush_each}: every line is on
    disk (well, in the kernel) when the call returns, as the audit log
    needs; otherwise lines wait in the buffer until L{flush}, which costs
    the access log nothing per request.
    """

    def __init__(self, path: str, *, flush_each: bool = True):
        self.path = path
        self._flush_each = flush_each
        self._file = self._open()

    def _open(self):
        if self.path == STDOUT:
            return sys.stdout
        return open(self.path, "a", encoding="utf-8")

    def write(self, line: str) -> None:
        """Write C{line}, which ends with a newline."""
        self._file.write(line)
        if self._flush_each:
            self._file.flush()

    def flush(self) -> None:
        self._file.flush()

    def reopen(self) -> None:
        """Continue in a new file at C{path}: the old one was moved away."""
        if self.path == STDOUT:
            return
        old, self._file = self._file, self._open()
        old.close()

    def close(self) -> None:
        if self.path == STDOUT:
            self._file.flush()
        else:
            self._file.close()


def reopen_on_sigusr1(reactor, files) -> None:
    """On SIGUSR1 reopen C{files}, from the reactor's thread, never in the middle of a write."""

    def reopen() -> None:
        for file in files:
            file.reopen()

    signal.signal(signal.SIGUSR1, lambda number, frame: reactor.callFromThread(reopen))
