"""
argon2id password hashes, checked off the reactor thread.

argon2 is slow on purpose (tens of milliseconds and 19 MiB per check with
the default parameters, C{[passwords]} in the config), so a check runs on a
small bounded thread pool: a burst of logins queues instead of stalling every
other request or exhausting memory. Any identity backend that stores password hashes (static file,
PostgreSQL) checks them through L{PasswordVerifier}.

Besides argon2id it accepts the scrypt hashes of Better Auth, so users
brought over from a Better Auth deployment keep their passwords; such a hash
is replaced by argon2id after its user's first successful login.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import unicodedata
from typing import Callable, Self

from argon2 import PasswordHasher, Type, extract_parameters, profiles
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from argon2.low_level import ARGON2_VERSION
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from authsrv.identity.credentials import MAX_PASSWORD_BYTES, password_bytes



def argon2id_hasher(memory_kib: int, time_cost: int, parallelism: int) -> PasswordHasher:
    """An argon2id hasher of these costs, with RFC 9106's salt and tag lengths."""
    base = profiles.RFC_9106_LOW_MEMORY
    return PasswordHasher(time_cost=time_cost, memory_cost=memory_kib, parallelism=parallelism,
                          hash_len=base.hash_len, salt_len=base.salt_len, type=Type.ID)


def hasher_of(config) -> PasswordHasher:
    """The hasher of a config's C{[passwords]} argon2id parameters."""
    hashing = config.password_hashing
    return argon2id_hasher(hashing.memory_kib, hashing.time_cost, hashing.parallelism)


DEFAULT_MEMORY_KIB, DEFAULT_TIME_COST, DEFAULT_PARALLELISM = 19456, 2, 1
"""OWASP's first equal-strength argon2id set; the config's defaults (L{authsrv.config.PasswordHashing})."""

DEFAULT_HASHER = argon2id_hasher(DEFAULT_MEMORY_KIB, DEFAULT_TIME_COST, DEFAULT_PARALLELISM)
"""
The production parameters when the config sets none (see
L{authsrv.config.PasswordHashing} for why these). Tests pass a cheaper
L{PasswordHasher} (for example built from C{argon2.profiles.CHEAPEST}) as
the C{hasher} argument of L{hash_password} and L{PasswordVerifier} instead.
"""

POOL_NAME = "passwords"


def pool_size(cores: int) -> int:
    """
    Checks at a time on C{cores} usable cores: two, to bound the memory
    (19 MiB each) and leave a core to the reactor, or one on a single core
    (a pinned process, a one-CPU container), where two checks only take
    turns, each evicting the other's memory from the cache: about 7 % more
    sign-ins per core with one (bench/README.md).
    """
    return max(1, min(2, cores))


POOL_SIZE = pool_size(len(os.sched_getaffinity(0)))

_MATCH, _MISMATCH, _MALFORMED, _COSTLY = "match", "mismatch", "malformed", "costly"

MAX_ARGON2 = {"memory_cost": 256 * 1024, "time_cost": 10, "parallelism": 16}
"""
The most a stored argon2 hash may ask of one check (256 MiB, ten passes,
sixteen lanes), or the configured hasher's own when that is more. A hash
sets its own cost, and one asking for gigabytes or millions of passes (a
damaged or hostile record in a table read side by side) would hold a
thread of the small password pool for hours at every login: it is
refused unchecked instead.
"""

BETTER_AUTH_SCRYPT = {"n": 16384, "r": 16, "p": 1, "dklen": 64}
"""
Better Auth's fixed scrypt parameters (C{@better-auth/utils/password}):
32 MiB of memory per check, about 0.1 s.
"""

_BETTER_AUTH_MAXMEM = 2 * 128 * BETTER_AUTH_SCRYPT["n"] * BETTER_AUTH_SCRYPT["r"]
_BETTER_AUTH_HASH = re.compile(r"([0-9a-fA-F]{32}):([0-9a-fA-F]{128})")


def hash_password(password: str | bytes, hasher: PasswordHasher = DEFAULT_HASHER) -> str:
    """An argon2id hash of C{password} in the PHC string format."""
    return hasher.hash(password)


def is_argon2id_hash(value: str) -> bool:
    """Whether C{value} parses as an argon2id PHC string (a cheap check, no hashing)."""
    if not value.isascii():
        return False
    try:
        return extract_parameters(value).type is Type.ID
    except InvalidHashError:
        return False


def is_better_auth_hash(value: str | None) -> bool:
    """
    Whether C{value} is a Better Auth password hash: C{<salt>:<key>}, a
    32-digit hex salt and a 64-byte key in hex.
    """
    return value is not None and _BETTER_AUTH_HASH.fullmatch(value) is not None


def looks_like_better_auth_hash(value: str | None) -> bool:
    """
    Whether C{value} is meant as a Better Auth hash (it has the colon and is
    no PHC string), so that a damaged one is reported as malformed.
    """
    return value is not None and ":" in value and not value.startswith("$")


def check_better_auth_hash(password: bytes, stored_hash: str) -> str:
    """
    Better Auth's check: scrypt over the NFKC form of the password, with the
    salt's hex text itself (its ASCII bytes) as the salt, compared in
    constant time. Text that is not valid Unicode still costs a full check.
    """
    match = _BETTER_AUTH_HASH.fullmatch(stored_hash)
    if match is None:
        return _MALFORMED
    salt, key = match.groups()
    try:
        password = unicodedata.normalize("NFKC", password.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        pass
    derived = hashlib.scrypt(password, salt=salt.encode("ascii"), maxmem=_BETTER_AUTH_MAXMEM, **BETTER_AUTH_SCRYPT)
    return _MATCH if hmac.compare_digest(derived, bytes.fromhex(key)) else _MISMATCH


def dummy_hash(hasher: PasswordHasher) -> str:
    """
    A PHC string with exactly C{hasher}'s parameters (type, version, memory,
    time, lanes, salt and tag length) and a random salt and tag: checking a
    password against it runs the full argon2 computation, as a real hash of
    those parameters does, and matches nothing. Made without hashing, so it
    is ready at once and costs no start-up time.
    """
    salt, tag = secrets.token_bytes(hasher.salt_len), secrets.token_bytes(hasher.hash_len)
    return (
        f"$argon2{hasher.type.name.lower()}$v={ARGON2_VERSION}"
        f"$m={hasher.memory_cost},t={hasher.time_cost},p={hasher.parallelism}"
        f"${_b64(salt)}${_b64(tag)}"
    )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).rstrip(b"=").decode("ascii")


def new_hashes(context) -> Callable[[str | bytes], Deferred]:
    """
    Makes new hashes of an L{IPluginContext}'s configured parameters on its
    password pool, beside the checks: a password change's hash is bounded as
    a check is, and never waits on (or holds up) the reactor's default pool.
    """
    return PasswordVerifier.for_context(context).rehash


class PasswordVerifier:
    """
    Checks passwords against stored hashes on a bounded thread pool.

    When there is no stored hash (unknown user), the password is checked
    against L{dummy_hash} of the configured hasher, on the same pool in the
    same number of steps, so that an unknown login and a wrong password
    cost the same time and cannot be told apart by timing. A stored hash
    made with other parameters, or a Better Auth scrypt hash, costs what its
    own parameters cost: see L{needs_rehash}.
    """

    log = Logger()

    def __init__(self, reactor, pool, hasher: PasswordHasher = DEFAULT_HASHER):
        self._reactor = reactor
        self._pool = pool
        self._hasher = hasher
        self._dummy = dummy_hash(hasher)

    @classmethod
    def for_context(cls, context, hasher: PasswordHasher | None = None) -> Self:
        """
        The verifier on the server's shared password pool of an
        L{IPluginContext}, hashing with the context's configured hasher.
        """
        return cls(context.reactor, context.threadpool(POOL_NAME, POOL_SIZE), hasher or context.password_hasher)

    def needs_rehash(self, stored_hash: str) -> bool:
        """
        Whether C{stored_hash} was made with other parameters than the
        configured hasher's: a wrong password for its user then costs a
        different time than an unknown login, until the hash is replaced.
        """
        try:
            return self._hasher.check_needs_rehash(stored_hash)
        except InvalidHashError:
            return True

    def rehash(self, password: str | bytes) -> Deferred:
        """Fires with a new argon2id hash of C{password}, made on the pool."""
        return deferToThreadPool(self._reactor, self._pool, self._hasher.hash, password)

    def verify(self, login: str, password: str | bytes, stored_hash: str | None) -> Deferred:
        """
        Fires with True when C{password} matches C{stored_hash}, else False;
        always False when C{stored_hash} is None, after the same work.

        A malformed stored hash is a failed check, logged with C{login} (never
        the password or the hash), so one bad record cannot crash a login.
        """
        d = deferToThreadPool(self._reactor, self._pool, self._check, password, stored_hash)

        def outcome(result: str) -> bool:
            if result == _MALFORMED:
                self.log.error("stored password hash of {login!r} is malformed", login=login)
            elif result == _COSTLY:
                self.log.error("stored password hash of {login!r} asks for more work than a check may take:"
                               " refused unchecked", login=login)
            return result == _MATCH and stored_hash is not None

        return d.addCallback(outcome)

    def _check(self, password: str | bytes, stored_hash: str | None) -> str:
        """
        The outcome of one check. A password over L{MAX_PASSWORD_BYTES} is
        refused unhashed, whoever it is for. A stored hash that cannot be
        checked (malformed, too costly) costs the unknown-login work all the
        same, so that timing does not single out its user.
        """
        password = password_bytes(password)
        if len(password) > MAX_PASSWORD_BYTES:
            return _MISMATCH
        outcome = self._compare(password, stored_hash)
        if outcome in (_MALFORMED, _COSTLY):
            self._compare(password, None)
        return outcome

    def _compare(self, password: bytes, stored_hash: str | None) -> str:
        """C{password} against C{stored_hash}, or against the unknown-login dummy for None."""
        if stored_hash is not None and not stored_hash.isascii():
            return _MALFORMED
        if stored_hash is not None and looks_like_better_auth_hash(stored_hash):
            return check_better_auth_hash(password, stored_hash)
        if stored_hash is not None and self._too_costly(stored_hash):
            return _COSTLY
        try:
            self._hasher.verify(self._dummy if stored_hash is None else stored_hash, password)
        except VerifyMismatchError:
            return _MISMATCH
        except (InvalidHashError, VerificationError):
            return _MALFORMED
        return _MATCH

    def _too_costly(self, stored_hash: str) -> bool:
        """Whether an argon2 C{stored_hash} asks for more than L{MAX_ARGON2} (or the configured hasher) allows."""
        try:
            parameters = extract_parameters(stored_hash)
        except InvalidHashError:
            return False
        return any(getattr(parameters, name) > max(most, getattr(self._hasher, name))
                   for name, most in MAX_ARGON2.items())
