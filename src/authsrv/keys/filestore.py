"""
What the file-backed keystores share: their config keys, private-file
helpers, and L{FileKeystore}, which runs a L{KeyRing} over a storage (one
JWK-set file, or a folder of PEM files).

Every change is a locked read-modify-write of what is on disk, so the server,
other instances on the same host and the operator command (C{authsrv-admin
keys rotate}) can all change the keys, and each picks up the others' changes
through L{FileKeystore.reload}.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Self

from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from authsrv import events
from authsrv.configsection import ConfigError, Section
from authsrv.interfaces import IKeystore
from authsrv.keys.ring import KeyRing, Retention
from authsrv.protocol.signing import ALGORITHMS
from authsrv.records import Rotation

CLOCK_SKEW = 300
"""
Seconds a retired key stays published beyond the longest token lifetime (and
kept as a hint key beyond a browser session's): for verifiers' clocks, and for
instances still signing with the old key until their next
L{FileKeystore.maintain} picks up a rotation.
"""


MIN_ROTATE_EVERY = 3600
OPERATOR = "operator"
SCHEDULE = "schedule"
"""Who rotated, in the audit event: L{FileKeystore.rotate} is the operator command's, C{rotate_every} the schedule's."""


def read_options(section: Section) -> tuple[tuple[str, ...], int | None]:
    """The C{algorithms} and C{rotate_every} keys every file keystore takes."""
    algorithms = section.str_list("algorithms", ["RS256"])
    for alg in algorithms:
        if alg not in ALGORITHMS:
            raise section.error(
                "algorithms", f"unknown algorithm {alg!r}; choose among {', '.join(ALGORITHMS)}"
            )
    if "RS256" not in algorithms:
        raise section.error("algorithms", "must include RS256 (OpenID Connect requires it)")
    rotate_every = section.duration("rotate_every", None)
    if rotate_every is not None and rotate_every < MIN_ROTATE_EVERY:
        raise section.error(
            "rotate_every",
            "must be at least 1h: a next key must be published well before it"
            " signs, and relying parties cache the JWKS for minutes",
        )
    return tuple(dict.fromkeys(algorithms)), rotate_every


def file_keystore(section: Section, context, name: str, default: str, storage: Callable) -> FileKeystore | None:
    """
    A file keystore from its config C{section}: its keys live where the
    path key C{name} says (default C{default}), stored by
    C{storage(location, its config key)}, with the options of
    L{read_options}. Under C{check_only} the keys are only read, to check
    them; a location the service cannot use (a folder it may not write to,
    a full disk) is a L{ConfigError}, as the keys cannot be made or kept.
    """
    location = section.path_(name, default)
    algorithms, rotate_every = read_options(section)
    section.done()
    key = section.key(name)
    keys = storage(location, key)
    if context.check_only:
        keys.load(int(context.reactor.seconds()), missing_ok=True)
        return None
    try:
        return FileKeystore.open(keys, algorithms, rotate_every, context)
    except OSError as e:
        raise ConfigError(key, f"cannot use {location}: {e.strerror}") from None


def read_private(path: Path, key: str) -> bytes:
    """The contents of a private key file, refused when others could read it."""
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise ConfigError(key, f"{path} is not a regular file")
            if mode & 0o077:
                raise ConfigError(
                    key,
                    f"{path} holds private keys but is accessible to group or others"
                    f" (mode {stat.S_IMODE(mode):04o}); chmod 600 it",
                )
            return file.read()
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None


def write_private(path: Path, data: bytes) -> None:
    """
    Replace C{path} atomically with a file only its owner can read: write a
    0600 temporary file in the same folder, fsync it, rename it over.
    """
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), 0o600)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Make renames and removals in C{folder} durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def locked_folder(folder: Path) -> Iterator[None]:
    """
    Hold an exclusive lock on C{folder} (created 0700 if missing) against
    other processes changing the keys in it.
    """
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _signing(ring: KeyRing) -> dict[str, str]:
    """The kid each algorithm signs with."""
    return {info.alg: info.kid for info in ring.infos() if info.state == "active"}


@implementer(IKeystore)
class FileKeystore:
    """
    An L{IKeystore} over a storage, which provides:
      - C{locked()}: a context manager excluding other processes;
      - C{signature()}: a cheap value that changes whenever the stored keys do;
      - C{load(now, missing_ok)}: C{(ring, unsaved)}, the stored ring and
        whether it differs from what is stored (keys adopted, or nothing
        stored yet and C{missing_ok});
      - C{save(ring, stored)}: store C{ring} in place of C{stored}.

    Signing reads the in-memory ring on the reactor thread; every storage
    access runs on the keystore's own thread pool.
    """

    _log = Logger()

    def __init__(self, storage, algorithms, rotate_every, context):
        self.algorithms = algorithms
        self.rotate_every = rotate_every
        self.retention = Retention(
            published=context.max_token_lifetime + CLOCK_SKEW, hints=context.session_lifetime + CLOCK_SKEW
        )
        self._storage = storage
        self._reactor = context.reactor
        self._pool = context.threadpool("keys", 1)
        self._lock = threading.Lock()
        self._ring: KeyRing
        self._signature = None

    @classmethod
    def open(cls, storage, algorithms, rotate_every, context) -> Self:
        """
        Load the keys, creating or completing them on first start. Blocking,
        once, before the server serves anything.
        """
        keystore = cls(storage, algorithms, rotate_every, context)
        with keystore._lock:
            keystore._apply(keystore._now(), missing_ok=True)
        return keystore

    def _now(self) -> int:
        return int(self._reactor.seconds())

    def _in_thread(self, function: Callable, *args):
        return deferToThreadPool(self._reactor, self._pool, function, *args)

    def _apply(
        self,
        now: int,
        change: Callable[[KeyRing], KeyRing] = lambda ring: ring,
        missing_ok: bool = False,
    ) -> KeyRing:
        """
        With C{self._lock} held: read the stored ring under the storage lock,
        apply C{change}, retire what no configured algorithm signs with and
        complete it, store the result if it differs, keep it.
        """
        with self._storage.locked():
            stored, unsaved = self._storage.load(now, missing_ok)
            ring = change(stored).withdraw(self.algorithms, now, self.retention).provision(self.algorithms, now)
            if unsaved or ring is not stored:
                self._storage.save(ring, stored)
            self._ring, self._signature = ring, self._storage.signature()
        return ring

    def sign(self, claims, alg="RS256", typ="JWT"):
        if alg not in self.algorithms:
            raise ValueError(f"{alg} is not a configured algorithm ({', '.join(self.algorithms)})")
        return self._ring.sign(claims, alg, typ)

    def jwks_bytes(self):
        return self._ring.jwks_bytes

    def public_keyset(self):
        """The current ring's key set, shared: verify with it, never change it."""
        return self._ring.public_keyset

    def hint_key(self, kid):
        return self._ring.hint_key(kid)

    def keys(self):
        return self._ring.infos()

    def rotate(self, now, actor=OPERATOR):
        """
        Retire the keys this process signs with, if they still are the
        stored ones: when several processes (workers, instances, the
        operator command) ask for a rotation at about the same moment, or
        one whose keys were rotated since it last read them, the first
        rotates and the others adopt it, instead of each promoting the next
        key another generated only an instant before, which no relying
        party has yet.
        """
        def rotate():
            with self._lock:
                signing = _signing(self._ring)
                due: list[str] = []

                def change(ring: KeyRing) -> KeyRing:
                    stored = _signing(ring)
                    due[:] = [alg for alg in self.algorithms if stored.get(alg) == signing.get(alg)]
                    return ring.rotate(now, self.retention, due) if due else ring

                return self._apply(now, change), tuple(due)

        return self._in_thread(rotate).addCallback(self._after_rotate, actor)

    def _after_rotate(self, result, actor: str) -> Rotation:
        ring, due = result
        if due:
            return Rotation(keys=tuple(self._rotated(ring, due, actor)), rotated=True)
        self._log.info("Signing keys already rotated by another process; adopted", event="key_rotation_adopted")
        return Rotation(keys=tuple(ring.infos()), rotated=False)

    def _rotated(self, ring: KeyRing, algorithms, actor: str) -> list:
        active = _signing(ring)
        events.key_rotated(algorithms=list(algorithms), active={alg: active[alg] for alg in algorithms}, actor=actor)
        return ring.infos()

    def reload(self):
        now = self._now()

        def reload():
            with self._lock:
                return self._reload(now)

        return self._in_thread(reload)

    def _reload(self, now: int) -> bool:
        if self._storage.signature() == self._signature:
            return False
        before = self._ring.infos()
        return self._apply(now).infos() != before

    def maintain(self, now):
        return self._in_thread(self._maintain, now).addCallback(self._maintained)

    def _maintained(self, rotated) -> None:
        if rotated is not None:
            ring, algorithms = rotated
            self._rotated(ring, algorithms, SCHEDULE)

    def _maintain(self, now: int):
        """
        Reload, then rotate what is due, retire dropped algorithms' settled
        keys and prune; C{(ring, algorithms)} when something rotated. What is due is decided again on
        the stored ring under the storage lock, so that instances sharing the
        keys rotate once between them.
        """
        with self._lock:
            self._reload(now)
            ring = self._ring
            if (not self._due(ring, now) and ring.prune(now, self.retention) is ring
                    and ring.withdraw(self.algorithms, now, self.retention) is ring):
                return None
            due: list[str] = []

            def change(ring: KeyRing) -> KeyRing:
                due[:] = self._due(ring, now)
                return ring.rotate(now, self.retention, due) if due else ring.prune(now, self.retention)

            ring = self._apply(now, change)
            return (ring, tuple(due)) if due else None

    def _due(self, ring: KeyRing, now: int) -> list[str]:
        if self.rotate_every is None:
            return []
        return [alg for alg in ring.due(now, self.rotate_every) if alg in self.algorithms]
