"""
Log files an operator rotates: the audit log and the access log. C{"-"}
is standard output (as the process had it at start, before C{twist}
redirects it into the log). Each write is one whole line; L{LineFile.reopen}
after logrotate moved the file, which SIGUSR1 or SIGHUP asks for
(L{reopen_on_signals}).

Several worker processes (L{authsrv.workers}) append to the same files and
the same standard output, so every write(2) holds whole lines, and at most
C{PIPE_BUF} bytes where it can: the kernel keeps such a write in one piece
on a pipe, and appends to a file never split a write.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import stat
import sys
from contextlib import contextmanager
from typing import Callable

from twisted.logger import Logger

STDOUT = "-"
REOPEN_SIGNALS = (signal.SIGUSR1, signal.SIGHUP)

log = Logger()


class _Refused(Exception):
    """The file refused a write (C{error}); C{dropped} of the lines flushed are lost."""

    def __init__(self, error: OSError, dropped: int):
        super().__init__(error)
        self.error = error
        self.dropped = dropped


class LineFile:
    """
    A file appended to one line at a time. C{flush_each}: every line is on
    disk (well, in the kernel) when the call returns, as the audit log
    needs; otherwise lines wait in the buffer until L{flush}, which costs
    the access log nothing per request.
    """

    def __init__(self, path: str, *, flush_each: bool = True):
        self.path = path
        self.on_dropped: Callable[[int], None] | None = None
        """Told how many lines were lost each time some are (the metrics count them)."""
        self._flush_each = flush_each
        self._pending: list[str] = []
        self._dropped: int | None = None
        self._held = 0
        self._file = self._open()

    def _open(self):
        if self.path == STDOUT:
            return sys.stdout
        return open(_append_fd(self.path, create=True), "a", encoding="utf-8")

    def write(self, line: str) -> None:
        """
        Write C{line}, which ends with a newline; with C{flush_each}, a line
        the file refuses is dropped as L{flush} says, never raised: the
        audit log writes from a log observer, where an error would be a
        traceback per event.
        """
        self._pending.append(line)
        if self._flush_each:
            self.flush()

    def flush(self) -> None:
        """
        The lines written so far, in writes of whole lines up to C{PIPE_BUF}
        bytes each. Lines the file refuses (a full disk) are dropped rather
        than kept in memory, with one line when that starts and one, with
        how many, when it ends: the timer that flushes goes on, and so does
        serving. The one write under way when the file refused it stays in
        the file's buffer and goes out first once the file takes it (or
        counts as dropped when the file is closed first).
        """
        lines, self._pending = self._pending, []
        try:
            self._write_lines(lines)
        except _Refused as refused:
            if self._dropped is None:
                self._dropped = 0
                log.error("cannot write to {path}: {error}; its lines are dropped until it can",
                          path=self.path, error=refused.error.strerror)
            self._lost(refused.dropped)
            return
        if self._dropped is not None:
            log.info("writing to {path} again; {count} lines were dropped", path=self.path, count=self._dropped)
            self._dropped = None

    def _write_lines(self, lines: list[str]) -> None:
        """Write C{lines}; L{_Refused} says how many of them the file did not take."""
        try:
            self._file.flush()
        except OSError as e:
            raise _Refused(e, len(lines)) from None
        self._held = 0
        data = "".join(lines).encode("utf-8")
        left = len(lines)
        start = 0
        while start < len(data):
            end = data.rfind(b"\n", start, start + select.PIPE_BUF) + 1
            if end <= start:
                end = data.index(b"\n", start) + 1
            chunk = data[start:end]
            try:
                self._file.buffer.write(chunk)
            except OSError as e:  # a line longer than the buffer, written at once
                raise _Refused(e, left) from None
            left -= chunk.count(b"\n")
            try:
                self._file.buffer.flush()
            except OSError as e:
                # What the file did not take of this write waits in its buffer for the next flush.
                self._held = chunk.count(b"\n")
                raise _Refused(e, left) from None
            start = end

    def reopen(self) -> None:
        """Continue in a new file at C{path}: the old one was moved away."""
        if self.path == STDOUT:
            return
        self.flush()
        old, self._file = self._file, self._open()
        self._close(old)

    def close(self) -> None:
        self.flush()
        if self.path != STDOUT:
            self._close(self._file)

    def _close(self, file) -> None:
        """Close C{file}; the lines a full disk left in its buffer (L{flush}) are dropped with it."""
        try:
            file.close()
        except OSError:
            if self._dropped is None:
                raise
            self._lost(self._held)
        self._held = 0

    def _lost(self, count: int) -> None:
        self._dropped = (self._dropped or 0) + count
        if self.on_dropped is not None and count:
            self.on_dropped(count)


def _append_fd(path: str, *, create: bool) -> int:
    """
    C{path} opened for appending: without waiting at first, since a named
    pipe that no process reads would hold the open, and the start or the
    reopen on a signal with it, until one does; then waiting, as writes do.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "a named pipe that no process reads") from None
        raise
    os.set_blocking(fd, True)
    return fd


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def open_problem(path: str) -> str | None:
    """
    Why C{path} could not be opened as L{LineFile} opens it (its errno's
    text), or None; nothing is created (C{check-config}). A named pipe is
    not opened: closing it again would end a reader waiting for the server.
    """
    if path == STDOUT or stat.S_ISFIFO(_mode(path)):
        return None
    try:
        os.close(_append_fd(path, create=False))
        return None
    except FileNotFoundError:
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            return os.strerror(errno.ENOENT)
        return None if os.access(folder, os.W_OK | os.X_OK) else os.strerror(errno.EACCES)
    except OSError as e:
        return e.strerror


def hold_reopen_signals() -> None:
    """
    Keep SIGUSR1 and SIGHUP waiting until L{reopen_on_signals} handles
    them: until then their default action would end the process, and
    logrotate sends them whenever it rotates, a start-up included. A process
    started meanwhile inherits them held (L{reopen_signals_held}).
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, REOPEN_SIGNALS)


@contextmanager
def reopen_signals_held():
    """
    SIGUSR1 and SIGHUP held for the block, in which a worker is started: it
    begins with them held, and one passed on to it before it can reopen its
    files waits for it (L{reopen_on_signals}) rather than end it.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, REOPEN_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def reopen_on_signals(reactor, files, then: Callable[[int], None] | None = None) -> None:
    """
    On SIGUSR1 or SIGHUP reopen C{files}, from the reactor's thread, never
    in the middle of a write; then C{then(signal)} (the workers' parent
    passes the signal on). A file that cannot be reopened (its folder gone
    or unwritable after a rotation) is one line, and lines keep going to the
    file open before; the other files and the workers are not held back.
    The signals held since start (L{hold_reopen_signals}) are let through,
    one that came meanwhile handled now.
    """

    def reopen(number: int) -> None:
        for file in files:
            try:
                file.reopen()
            except OSError as e:
                log.error("cannot reopen {path}: {error}; still writing to the file open before",
                          path=file.path, error=e.strerror)
        log.info("log files reopened on {signal} (pid {pid})", signal=signal.Signals(number).name, pid=os.getpid())
        if then is not None:
            then(number)

    for number in REOPEN_SIGNALS:
        signal.signal(number, lambda number, frame: reactor.callFromThread(reopen, number))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, REOPEN_SIGNALS)
