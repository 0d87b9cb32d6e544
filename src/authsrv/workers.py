"""
Several processes on one machine's cores (C{[server] workers}, C{twist
authsrv --workers N}): the parent binds every listener, migrates the store,
makes the signing keys and stores the config's clients once, then starts N
workers, each a C{twist authsrv} with the same command line and its own
reactor, that adopt the parent's listening sockets (inherited as file
descriptors 3, 4, ...) instead of binding their own. The kernel hands each
new connection to whichever worker accepts it first.

Inherited sockets rather than SO_REUSEPORT: one bind, so a taken port or a
bad TLS file stops the start with one line before any worker runs; no other
process of the same user can join the port and take a share of the
connections; every Twisted endpoint (TCP, TLS, Unix sockets, the PROXY
protocol wrapper, port 0) works unchanged, since only the C{listen*} call at
the bottom is replaced; and a stopping worker leaves no connections behind
in an accept queue of its own, as a SO_REUSEPORT socket does when it closes.

What the workers share lives in the store (grants, tokens, sessions, bans,
the login throttle, the chat refresh leases) or the keystore; what each
keeps in memory is per worker: the client cache (two seconds), the standing
cache, the rate-limit buckets, the caps on password checks in flight and
the key ring (reloaded within a minute). The admin and metrics listeners
are served by worker 0 alone; with metrics on, each worker counts into files
of a temporary directory the parent makes and removes once every worker has
exited, and worker 0's C{/metrics} adds them up (L{authsrv.metrics}); the
files of a worker that exits are folded into those of the dead ones.

The parent passes SIGTERM on (every worker drains, then the parent exits 0
once all have), and SIGHUP and SIGUSR1 (every worker reopens its log
files; a worker starts with them held, so that one passed on while it
starts waits for it instead of ending it). Every worker runs the config
file as the parent read it at start, handed over in one more inherited file
descriptor after the sockets: a worker started again never runs a file
edited since, broken or not, that its siblings do not (the edit takes
effect on a restart, as without workers). A worker that dies otherwise is started again after a second, if
it had run for a while; one that fails at start (a secret file it cannot
read, a store it cannot open) is started again after a growing delay, and
when starts keep failing the parent stops every worker and exits 1 with one
line, rather than restart them forever (L{RestartPolicy}, as systemd's
C{StartLimitBurst} and gunicorn do).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import sys
from collections import deque

from attrs import define, field, frozen
from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.error import CannotListenError, ProcessExitedAlready, ReactorNotRunning
from twisted.internet.interfaces import IProcessTransport
from twisted.internet.protocol import ProcessProtocol, ServerFactory
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory

from authsrv import metrics_folder
from authsrv.config import ConfigSource
from authsrv.logfile import reopen_signals_held
from authsrv.metrics import fold_dead_process
from authsrv.store.errors import outage_of

WORKER_ENV = "AUTHSRV_WORKER"
"""
C{"index:sockets:parent"} in a worker's environment: its number, how many
listening sockets it inherits (then the config file's bytes), and its
parent's pid.
"""
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where the workers count (L{authsrv.metrics}); prometheus_client reads it when it is first imported."""
FIRST_FD = 3
RESTART_DELAY = 1.0
PREPARE_RETRY = 5.0
GIVE_UP_STATUS = 1
"""The parent's exit status when its workers keep failing at start."""
_PR_SET_PDEATHSIG = 1

log = Logger()


class WorkerError(Exception):
    """A worker's environment does not match what its parent handed it."""


@frozen
class WorkerRole:
    """
    This process is worker C{index}, with listening sockets on C{fds}, in
    the order they are bound, and C{config}, the config file's bytes as the
    parent read them.
    """

    index: int
    fds: tuple[int, ...]
    parent: int
    config: bytes


def worker_role(environ=os.environ) -> WorkerRole | None:
    """The role the parent gave this process, or None for a process started by hand."""
    value = environ.get(WORKER_ENV)
    if value is None:
        return None
    try:
        index, count, parent = (int(part) for part in value.split(":"))
    except ValueError:
        raise WorkerError(f"{WORKER_ENV}={value!r} is not index:sockets:parent") from None
    fds = tuple(range(FIRST_FD, FIRST_FD + count))
    for fd in fds:
        try:
            listening = socket.socket(fileno=os.dup(fd))
        except OSError:
            raise WorkerError(f"file descriptor {fd} is not a socket inherited from the parent") from None
        with listening:
            if not listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise WorkerError(f"file descriptor {fd} is not a listening socket")
    return WorkerRole(index, fds, parent, _inherited_config(FIRST_FD + count))


def _inherited_config(fd: int) -> bytes:
    """
    The config file's bytes in the parent's file C{fd}, read from its start
    whatever its offset (every worker shares it), then closed.
    """
    chunks = []
    offset = 0
    try:
        while chunk := os.pread(fd, 65536, offset):
            chunks.append(chunk)
            offset += len(chunk)
        os.close(fd)
    except OSError:
        raise WorkerError(f"file descriptor {fd} does not hold the config file the parent read") from None
    return b"".join(chunks)


def config_copy(source: bytes) -> int:
    """An anonymous in-memory file holding C{source}, the config file as read at start, for the workers to inherit."""
    fd = os.memfd_create("authsrv-config", os.MFD_CLOEXEC)
    view = memoryview(source)
    while view:
        view = view[os.write(fd, view):]
    return fd


def stop_with_parent(role: WorkerRole) -> None:
    """
    Have Linux send this worker SIGTERM when its parent dies, even by
    SIGKILL, so that no orphan keeps serving on the inherited sockets; a
    parent already gone stops it at once.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        log.warn("cannot ask to be stopped with the parent: a killed parent leaves this worker running")
    if os.getppid() != role.parent:
        os.kill(os.getpid(), signal.SIGTERM)


class _Listening:
    """
    Stands in for the reactor where endpoints call C{listenTCP},
    C{listenSSL} and C{listenUNIX}; everything else goes to the reactor.
    """

    def __init__(self, reactor):
        self._reactor = reactor

    def __getattr__(self, name):
        return getattr(self._reactor, name)

    def listenTCP(self, port, factory, backlog=50, interface=""):
        return self._port(factory, lambda: self._reactor.listenTCP(port, ServerFactory(), backlog, interface))

    def listenSSL(self, port, factory, contextFactory, backlog=50, interface=""):
        return self._port(TLSMemoryBIOFactory(contextFactory, False, factory),
                          lambda: self._reactor.listenTCP(port, ServerFactory(), backlog, interface))

    def listenUNIX(self, address, factory, backlog=50, mode=0o666, wantPID=0):
        return self._port(factory, lambda: self._reactor.listenUNIX(address, ServerFactory(), backlog, mode, wantPID))

    def adoptStreamPort(self, fileDescriptor, addressFamily, factory):
        return self._port(factory, lambda: self._reactor.adoptStreamPort(fileDescriptor, addressFamily, ServerFactory()))

    def _port(self, factory, bind):
        raise NotImplementedError


class Binder(_Listening):
    """The parent's: binds each listener for real, but accepts nothing itself."""

    def _port(self, factory, bind):
        port = bind()
        port.stopReading()
        return port


class Adopter(_Listening):
    """A worker's: each listener takes the next inherited socket, in the order the parent bound them."""

    def __init__(self, reactor, fds: tuple[int, ...]):
        super().__init__(reactor)
        self._fds = list(fds)

    def _port(self, factory, bind):
        if not self._fds:
            raise CannotListenError(None, None, "the parent handed over fewer sockets than the config has listeners")
        fd = self._fds.pop(0)
        with socket.socket(fileno=os.dup(fd)) as inherited:
            family = inherited.family
        port = self._reactor.adoptStreamPort(fd, family, factory)
        os.close(fd)
        return port

    def check_all_taken(self) -> None:
        if self._fds:
            raise WorkerError(f"the parent handed over {len(self._fds)} more sockets than the config has listeners")


@define
class RestartPolicy:
    """
    When to start a dead worker again, or None to give up: a worker that
    ran at least C{settle} seconds is started again after C{delay}; one
    that died sooner failed at start, and is started again after a delay
    that doubles with each of its failed starts in a row, up to
    C{max_delay}, until C{burst} failed starts of any workers fall within
    C{window} seconds.
    """

    delay: float = RESTART_DELAY
    settle: float = 10.0
    max_delay: float = 30.0
    burst: int = 5
    window: float = 60.0
    _failed: deque = field(factory=deque, init=False)
    _in_a_row: dict = field(factory=dict, init=False)

    def after_exit(self, index: int, uptime: float, now: float) -> float | None:
        """The delay before worker C{index}, ended at C{now} after C{uptime} seconds, starts again; None: give up."""
        if uptime >= self.settle:
            self._in_a_row.pop(index, None)
            return self.delay
        self._failed.append(now)
        while self._failed[0] <= now - self.window:
            self._failed.popleft()
        if len(self._failed) >= self.burst:
            return None
        in_a_row = self._in_a_row.get(index, 0)
        self._in_a_row[index] = in_a_row + 1
        return min(self.delay * 2 ** in_a_row, self.max_delay)


def exit_after_stop(reactor, status: int) -> None:
    """
    Stop the reactor (every service stops as on SIGTERM), then exit with
    C{status}: C{twist} itself always exits 0 once its reactor stops.
    """

    def exit_now():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    reactor.addSystemEventTrigger("after", "shutdown", exit_now)
    try:
        reactor.stop()
    except ReactorNotRunning:
        log.info("already stopping: the exit status is still {status}", status=status)


class _Worker(ProcessProtocol):
    def __init__(self, supervisor: "Supervisor", index: int, started: float):
        self.supervisor = supervisor
        self.index = index
        self.started = started
        self.pid: int | None = None
        """Kept here: the process transport forgets its pid once the process ended."""
        self.ended: Deferred = Deferred()

    def processEnded(self, reason):
        self.supervisor.ended(self, reason.value.exitCode, reason.value.signal)


class Supervisor(Service):
    """
    The parent: starts C{count} workers once C{prepare()} (migrations, keys,
    the config's clients) has fired, each with the sockets of C{ports}
    (worker 0 with all of them, the others with the first C{shared}) and
    C{config}, the config file as read at start. With C{shared_metrics}, the workers count into one directory of
    files. A L{RestartPolicy} decides restarts; giving up calls
    C{give_up(status)}, which stops the reactor and exits by default.
    """

    def __init__(self, reactor, count: int, ports: list, shared: int, prepare, *, config: ConfigSource, argv=None,
                 shared_metrics=False, give_up=None):
        self._reactor = reactor
        self._count = count
        self._ports = ports
        self._shared = shared
        self._prepare = prepare
        self._argv = list(sys.argv[1:] if argv is None else argv)
        self._running: dict[int, tuple[_Worker, IProcessTransport]] = {}
        self._stopping = False
        self._shared_metrics = shared_metrics
        self._env: dict[str, str] = {}
        self._policy = RestartPolicy()
        self._give_up = give_up or (lambda status: exit_after_stop(reactor, status))
        self._config = config
        self._config_fd = config_copy(config.data)

    def startService(self):
        super().startService()
        if self._shared_metrics:
            self._env[METRICS_DIR_ENV] = metrics_folder.make()
        self._start()

    def _start(self) -> None:
        d = Deferred.fromCoroutine(self._prepare())
        d.addCallbacks(self._spawn_all, self._unprepared)

    def _spawn_all(self, _) -> None:
        for index in range(self._count):
            self._spawn(index)

    def _unprepared(self, failure):
        """An outage is one line (the pool logs it too), anything else a failure; retried either way."""
        outage = outage_of(failure)
        if outage is not None:
            log.warn("could not store the clients declared in the config file ({error}); trying again in {delay}s",
                     error=str(outage), delay=PREPARE_RETRY)
        else:
            log.failure("could not store the clients declared in the config file; trying again in {delay}s",
                        failure, delay=PREPARE_RETRY)
        if not self._stopping:
            self._reactor.callLater(PREPARE_RETRY, self._start)

    def _spawn(self, index: int) -> None:
        if self._stopping:
            return
        ports = self._ports if index == 0 else self._ports[:self._shared]
        fds = {0: 0, 1: 1, 2: 2}
        fds.update({FIRST_FD + i: port.fileno() for i, port in enumerate(ports)})
        fds[FIRST_FD + len(ports)] = self._config_fd
        worker = _Worker(self, index, self._reactor.seconds())
        with reopen_signals_held():
            process = self._reactor.spawnProcess(
                worker, sys.executable, [sys.executable, "-m", "twisted", *self._argv],
                env={**os.environ, **self._env, WORKER_ENV: f"{index}:{len(ports)}:{os.getpid()}"}, childFDs=fds,
            )
        worker.pid = process.pid
        self._running[index] = (worker, process)
        log.info("worker {index} started (pid {pid})", index=index, pid=process.pid)

    def ended(self, worker: _Worker, status: int | None, number: int | None) -> None:
        self._running.pop(worker.index, None)
        self._fold_metrics(worker)
        if self._stopping:
            if status:
                log.warn("worker {index} exited with status {status}", index=worker.index, status=status)
        else:
            self._restart(worker, status, number)
        worker.ended.callback(status)

    def _fold_metrics(self, worker: _Worker) -> None:
        """An exited worker's counts join the dead ones' (L{fold_dead_process}); a failure leaves its files."""
        shared = self._env.get(METRICS_DIR_ENV)
        if shared is None or worker.pid is None:
            return
        try:
            fold_dead_process(shared, worker.pid)
        except OSError as e:
            log.warn("cannot fold the metrics files of worker {index} (pid {pid}): {error}",
                     index=worker.index, pid=worker.pid, error=e.strerror)

    def _restart(self, worker: _Worker, status: int | None, number: int | None) -> None:
        """Start C{worker} again after the policy's delay, or stop everything when its starts keep failing."""
        now = self._reactor.seconds()
        uptime = now - worker.started
        delay = self._policy.after_exit(worker.index, uptime, now)
        if delay is None:
            log.critical(
                "workers keep failing at start ({burst} failed starts within {window:.0f}s, the last worker {index}"
                " with status {status}, signal {signal}, after {uptime:.1f}s): stopping authsrv; the workers' own"
                " lines above say why", burst=self._policy.burst, window=self._policy.window, index=worker.index,
                status=status, signal=number, uptime=uptime)
            self._stopping = True
            self._give_up(GIVE_UP_STATUS)
            return
        log.error("worker {index} ended after {uptime:.1f}s (status {status}, signal {signal});"
                  " starting it again in {delay:.0f}s", index=worker.index, uptime=uptime, status=status,
                  signal=number, delay=delay)
        self._warn_if_edited(worker.index)
        self._reactor.callLater(delay, self._spawn, worker.index)

    def _warn_if_edited(self, index: int) -> None:
        """Say that a worker started again runs the config file as read at start, when the file changed since."""
        if self._config.edited():
            log.warn("worker {index} runs the config file as read at start: {path} changed since, and takes effect"
                     " on a restart (authsrv-admin check-config checks it)", index=index, path=str(self._config.path))

    def signal_workers(self, number: int) -> None:
        """Pass C{number} on to every running worker."""
        for _, process in list(self._running.values()):
            try:
                process.signalProcess(number)
            except (OSError, ProcessExitedAlready):
                pass

    def stopService(self):
        """Stop accepting here, then let every worker drain and wait for all of them to exit."""
        super().stopService()
        self._stopping = True
        for port in self._ports:
            # A plain close: Twisted's stopListening would shutdown(2) the socket, and with it every worker's.
            port.socket.close()
        waiting = [worker.ended for worker, _ in self._running.values()]
        self.signal_workers(signal.SIGTERM)
        return gatherResults(waiting).addBoth(self._remove_shared)

    def _remove_shared(self, result):
        """The metrics directory and the config file's copy go once no worker can use them."""
        shared = self._env.pop(METRICS_DIR_ENV, None)
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
        os.close(self._config_fd)
        return result
