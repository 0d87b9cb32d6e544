"""
The static-file identity backend: users in a TOML file with argon2id hashes
(or Better Auth scrypt hashes, brought over from such a deployment and
replaced by argon2id at each user's first successful login).

The embedded default needs no database, so users live in a file the operator
edits by hand or with C{authsrv-admin user ...} (L{add_user}, and the
backend's L{IUserManagement} methods, which edit the file in place). The file is
validated as strictly as the config, and re-read when it changes, so adding a
user or disabling one needs no restart; a broken edit is logged and the users
loaded before keep being served, since a typo must not lock everyone out,
and a version written in place that drops users is served only once it has
held still for a look, since a half-written file must not remove anyone.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import tempfile
import tomllib
import unicodedata
import uuid
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

import tomlkit
from attrs import asdict, frozen
from twisted.cred.credentials import IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from authsrv.configsection import ConfigError, Section
from authsrv.identity.credentials import credential_text
from authsrv.identity.errors import UnknownUser
from authsrv.identity.passwords import (
    PasswordVerifier,
    is_argon2id_hash,
    is_better_auth_hash,
    looks_like_better_auth_hash,
)
from authsrv.interfaces import IIdentityBackend, IUserManagement
from authsrv.records import User

log = Logger()

RELOAD_INTERVAL = 1.0
"""Seconds between two looks at the users file for changes."""
FILE_POOL = "users-file"
"""The server's pool of one thread on which the users file is reloaded and rewritten."""

_HEADER = """\
# authsrv users: one [[users]] table per user, for example
#
#   [[users]]
#   sub = "f3c2..."          # stable id, never reused
#   login = "alice"          # unique, case-insensitive
#   password_hash = "$argon2id$..."
#   name = "Alice"
#
# `authsrv-admin user add` appends users and hashes their passwords.
"""

_TOML_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def login_key(login: str) -> str:
    """
    The form in which logins are compared: NFC-normalized, then casefolded,
    so that C{Alice}, C{ALICE} and a decomposed C{é} all find one user.
    """
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", login).casefold())


@frozen
class _Account:
    user: User
    password_hash: str


@frozen
class _Users:
    by_sub: dict
    by_login: dict

    @classmethod
    def of(cls, accounts: list[_Account]) -> "_Users":
        return cls(
            {a.user.sub: a for a in accounts},
            {login_key(a.user.login): a for a in accounts},
        )


def _account(section: Section) -> _Account:
    sub = section.str("sub")
    if len(sub) > 255 or not (sub.isascii() and sub.isprintable()):
        raise section.error("sub", "must be at most 255 printable ASCII characters (OIDC Core 2)")
    login = section.str("login")
    password_hash = section.str("password_hash")
    if looks_like_better_auth_hash(password_hash) and not is_better_auth_hash(password_hash):
        raise section.error("password_hash", "a Better Auth hash must be 32 hex digits, a colon and 128 hex digits")
    if not (is_argon2id_hash(password_hash) or is_better_auth_hash(password_hash)):
        raise section.error(
            "password_hash", "must be an argon2id hash ($argon2id$v=19$...), as authsrv-admin makes"
        )
    user = User(
        sub=sub,
        login=login,
        name=section.str("name", None),
        picture=section.str("picture", None),
        email=section.str("email", None),
        email_verified=section.bool("email_verified", False),
        disabled=section.bool("disabled", False),
        disabled_reason=section.str("disabled_reason", None),
        chat_user_id=section.str("chat_user_id", None),
    )
    section.done()
    return _Account(user, password_hash)


def _accounts(document: dict) -> list[_Account]:
    top = Section(document, "", Path("."))
    tables = top.tables("users")
    top.done()
    accounts: list[_Account] = []
    subs: dict[str, int] = {}
    logins: dict[str, int] = {}
    for index, table in enumerate(tables):
        account = _account(table)
        sub, key = account.user.sub, login_key(account.user.login)
        if sub in subs:
            raise table.error("sub", f"{sub!r} is already the sub of users[{subs[sub]}]")
        if key in logins:
            raise table.error(
                "login", f"{account.user.login!r} is already the login of users[{logins[key]}]"
            )
        subs[sub] = logins[key] = index
        accounts.append(account)
    return accounts


def _parse(text: str, label: str) -> list[_Account]:
    """
    Every account in a users file's text, or a one-line L{ConfigError}
    prefixed by C{label} (the file's name), naming the dotted key and, where
    it can be told, its line.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(label, f"not valid TOML: {e}") from None
    try:
        return _accounts(document)
    except ConfigError as e:
        line = _line_of(text, document.get("users"), e.key)
        problem = e.problem if line is None else f"{e.problem} (at line {line})"
        raise ConfigError(f"{label}: {e.key}", problem) from None


_USERS_HEADER = re.compile(r"""\s*\[\[\s*(users|"users"|'users')\s*\]\]\s*(#.*)?""")
_TABLE_KEY = re.compile(r"users\[(\d+)\](?:\.(\w+))?")


def _line_of(text: str, users, key: str) -> int | None:
    """
    The line (from 1) an error about C{key} points to: the C{name = ...}
    line of C{users[i].name}, else the C{[[users]]} header of table C{i}.
    None when the headers are not one per table of C{users} (an inline
    array, a header-like line inside a multi-line string).
    """
    wanted = _TABLE_KEY.fullmatch(key)
    if wanted is None or not isinstance(users, list):
        return None
    lines = text.splitlines()
    headers = [n for n, line in enumerate(lines) if _USERS_HEADER.fullmatch(line)]
    index, name = int(wanted[1]), wanted[2]
    if len(headers) != len(users) or index >= len(headers):
        return None
    start, end = headers[index], (headers + [len(lines)])[index + 1]
    if name is not None:
        assignment = re.compile(rf"""\s*({name}|"{name}"|'{name}')\s*=""")
        for n in range(start + 1, end):
            if assignment.match(lines[n]):
                return n + 1
    return start + 1


def _read(path: Path) -> list[_Account]:
    """Parse the users file (past a byte order mark, as every reader here); L{OSError} when it cannot be read."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(path.name, "not UTF-8 text") from None
    return _parse(text, path.name)


def _read_users(path: Path) -> "_Users":
    """L{_read}, indexed: on the file's thread, all of the parse's work."""
    return _Users.of(_read(path))


def _signature(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


@implementer(IIdentityBackend, IUserManagement)
class StaticIdentityBackend:
    """
    Users from a TOML file, checked with L{PasswordVerifier}; the
    L{IUserManagement} methods rewrite the file atomically and serve the
    result at once.

    C{reactor} gives the time (L{IReactorTime}) that spaces out the looks at
    the file for changes; C{on_file_thread} (from L{file_thread}) runs the
    reading, rewriting (with two fsyncs) and re-reading of the file for
    those methods, for hashes upgraded at sign-in and for a reload after a
    change, one after another and never on the reactor thread: a large
    file takes a while to parse and write. A login does not wait for its
    upgrade's write (the upgrades that arrive while one is written go into
    the next, together), nor for a reload (the users read before answer
    until it is done).
    Building the backend reads the file and raises L{ConfigError} or
    L{OSError}.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, path: Path, reactor, verifier: PasswordVerifier, on_file_thread: Callable[..., Deferred]):
        self._path = Path(path)
        self.users_location = str(self._path)
        self._reactor = reactor
        self._verifier = verifier
        self._on_file_thread = on_file_thread
        self._signature: tuple | None = _signature(self._path)
        self._users, hashes = self._load()
        self._inode = self._signature[2]
        """The inode of the file the users served were read from."""
        self._unsettled: tuple | None = None
        """The signature of a file rewritten in place without some users, seen at one look so far."""
        self._checked_at = reactor.seconds()
        self._reloading = False
        """Whether the file is being parsed for L{_refresh}."""
        self._upgrades: dict[str, tuple[str, str, str]] = {}
        """Upgrades not yet being written: sub to (login, hash read at sign-in, new hash)."""
        self._writing = False
        """Whether L{_write_upgrades} is running."""
        self._drained: list[Deferred] = []
        """Fired once no upgrade is left to write (L{close})."""
        self._closed = False
        log.info("{count} users loaded from {path}", count=len(self._users.by_sub), path=str(self._path))
        self._warn_of_other_parameters(*hashes)

    def _load(self) -> tuple[_Users, tuple[list[str], list[str]]]:
        """
        The users file read and indexed, with the logins whose hashes
        L{_warn_of_other_parameters} names: a look at every hash, which for
        a reload runs on the file's thread with the parse.
        """
        users = _read_users(self._path)
        accounts = users.by_sub.values()
        logins = sorted(
            a.user.login for a in accounts
            if is_argon2id_hash(a.password_hash) and self._verifier.needs_rehash(a.password_hash)
        )
        imported = sorted(a.user.login for a in accounts if is_better_auth_hash(a.password_hash))
        return users, (logins, imported)

    def _warn_of_other_parameters(self, logins: list[str], imported: list[str]) -> None:
        """
        Name the users whose hashes were made with other argon2 parameters
        than the configured ones: a wrong password for them costs what their
        hash's parameters cost, not what an unknown login costs, so timing
        would tell their names apart until their passwords are set again.
        """
        if imported:
            log.info(
                "{path}: {logins} have Better Auth scrypt hashes, replaced by argon2id at their next login",
                path=str(self._path), logins=_names(imported),
            )
        if logins:
            log.warn(
                "{path}: the password hashes of {logins} have other argon2 parameters than the configured"
                " ones, so timing tells these logins from unknown ones until each is replaced at its"
                " user's next successful login (or set again with authsrv-admin user passwd)",
                path=str(self._path), logins=_names(logins),
            )

    def _refresh(self) -> None:
        """
        Re-read the file if it changed, looking at most once per
        L{RELOAD_INTERVAL}. The look is a stat(2); the parse and the look at
        every hash (L{_load}) run on the file's thread (5,000 users take a
        tenth of a second), and the users read before are served until it
        succeeds.
        """
        now = self._reactor.seconds()
        if now - self._checked_at < RELOAD_INTERVAL or self._reloading:
            return
        self._checked_at = now
        try:
            signature = _signature(self._path)
        except OSError as e:
            signature, problem = None, f"cannot be read: {e.strerror}"
        if signature == self._signature:
            return
        if signature is None:
            self._not_reloaded(signature, problem)
            return
        self._reloading = True
        reading = self._on_file_thread(self._load)
        reading.addCallbacks(self._reloaded, self._unreadable, (signature,), errbackArgs=(signature,))

    def _reloaded(self, loaded: tuple[_Users, tuple[list[str], list[str]]], signature: tuple) -> None:
        self._reloading = False
        users, hashes = loaded
        if self._half_written(signature, users):
            return
        self._signature, self._users, self._inode, self._unsettled = signature, users, signature[2], None
        log.info("{count} users reloaded from {path}", count=len(self._users.by_sub), path=str(self._path))
        self._warn_of_other_parameters(*hashes)

    def _unreadable(self, failure, signature: tuple) -> None:
        self._reloading = False
        if failure.check(ConfigError):
            self._not_reloaded(signature, str(failure.value))
        elif failure.check(OSError):
            self._not_reloaded(signature, f"cannot be read: {failure.value.strerror}")
        else:
            log.failure("users file {path} not reloaded", failure, path=str(self._path))

    def _not_reloaded(self, signature: tuple | None, problem: str) -> None:
        """The file as it is now (C{signature}) is refused until it changes again."""
        self._signature = signature
        log.error(
            "users file {path} not reloaded, still serving the {count} users read before: {problem}",
            path=str(self._path),
            count=len(self._users.by_sub),
            problem=problem,
        )

    def _half_written(self, signature: tuple, users: _Users) -> bool:
        """
        Whether C{users}, read from the file rewritten in place (its inode
        unchanged), lack a user served now and this version of the file is
        new at this look. An editor or C{cat >} truncates the file, then
        writes it: a look in between reads users removed, and a refresh
        meanwhile would end their grants for good. Such a version is
        served once it holds still until the next look; one that adds or
        changes users is served at once, and so is a file replaced whole
        (a new inode: authsrv-admin, editors that rename), which no reader
        sees half written.
        """
        if signature[2] != self._inode or users.by_sub.keys() >= self._users.by_sub.keys():
            return False
        if signature == self._unsettled:
            return False
        self._unsettled = signature
        return True

    def _by_login(self, login: str | bytes) -> _Account | None:
        self._refresh()
        text = credential_text(login)
        return None if text is None else self._users.by_login.get(login_key(text))

    def requestAvatarId(self, credentials) -> Deferred:
        """
        Fires with the user's sub, or fails with L{UnknownUser} or
        L{UnauthorizedLogin}. An unknown login takes the same steps as a
        wrong password: one check on the verifier's pool, against the
        verifier's dummy hash, then the same decision.
        """
        account = self._by_login(credentials.username)
        d = self._verifier.verify(
            account.user.login if account else "",
            credentials.password,
            account.password_hash if account else None,
        )

        def decide(matched: bool) -> Deferred | str:
            if account is None:
                raise UnknownUser("unknown login")
            if not matched:
                raise UnauthorizedLogin("wrong password")
            if self._verifier.needs_rehash(account.password_hash):
                return Deferred.fromCoroutine(self._upgrade(account, credentials.password))
            return account.user.sub

        return d.addCallback(decide)

    async def _upgrade(self, account: _Account, password) -> str:
        """
        Hash the verified password with the configured parameters (on the
        verifier's pool, as a check is) and leave writing it to
        L{_write_upgrades}: the login answers without waiting for the file,
        since a whole-file rewrite per login makes a rush of logins after a
        change of C{[passwords]} queue behind one another.
        """
        new_hash = await self._verifier.rehash(password)
        login = account.user.login
        if self._closed:
            log.info("password hash of {login!r} not upgraded: the server is stopping", login=login)
        else:
            self._upgrades[account.user.sub] = (login, account.password_hash, new_hash)
            if not self._writing:
                Deferred.fromCoroutine(self._write_upgrades())
        return account.user.sub

    async def _write_upgrades(self) -> None:
        """
        Write the pending upgrades, all those that arrived during one write
        in the next (one parse and one dump for all of them), until none is
        left. Best effort: a failure is logged once per write, by login,
        and leaves those users' old hashes in place.
        """
        self._writing = True
        try:
            while self._upgrades:
                batch, self._upgrades = self._upgrades, {}
                try:
                    upgraded = await self._on_file(self._rewrite_users, partial(_replace_hashes, batch))
                except (OSError, ValueError) as e:
                    log.error(
                        "password hashes of {logins} not upgraded to the configured argon2id parameters: {problem}",
                        logins=_names(login for login, _, _ in batch.values()), problem=str(e),
                    )
                except Exception:
                    log.failure("password hashes of {logins} not upgraded",
                                logins=_names(login for login, _, _ in batch.values()))
                else:
                    for login in upgraded:
                        log.info("password hash of {login!r} upgraded to the configured argon2id parameters",
                                 login=login)
        finally:
            self._writing = False
            drained, self._drained = self._drained, []
            for d in drained:
                d.callback(None)

    def user_by_id(self, sub: str) -> Deferred:
        self._refresh()
        account = self._users.by_sub.get(sub)
        return succeed(account.user if account else None)

    def user_by_login(self, login: str | bytes) -> Deferred:
        account = self._by_login(login)
        return succeed(account.user if account else None)

    def close(self) -> Deferred:
        """
        Take no more upgrades; fires once those already taken are written
        (or failed), so that stopping the file's thread cuts no write off.
        """
        self._closed = True
        if not self._writing:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._drained.append(d)
        return d

    async def _on_file(self, work, *args):
        """
        C{work(*args)} on the file's thread; then the file as it is after
        that is served from here on. Returns what C{work} returned.
        """
        def work_and_read():
            done = work(*args)
            return done, _read_users(self._path), _signature(self._path)

        done, self._users, self._signature = await self._on_file_thread(work_and_read)
        self._inode, self._unsettled = self._signature[2], None
        return done

    async def add_user(self, user: User, password_hash: str) -> User:
        try:
            return await self._on_file(lambda: add_user(self._path, password_hash=password_hash, **asdict(user)))
        except ConfigError as e:
            raise ValueError(str(e)) from None
        except ValueError as e:
            raise ValueError(f"{self._path}: {e}") from None

    async def set_password_hash(self, login: str, password_hash: str) -> None:
        if not is_argon2id_hash(password_hash):
            raise ValueError("password_hash must be an argon2id hash")
        await self._edit(login, lambda users, index: _set(users[index], "password_hash", password_hash))

    async def set_disabled(self, login: str, disabled: bool, reason: str | None = None) -> None:
        def change(users, index):
            table = users[index]
            for key, value in (("disabled", disabled), ("disabled_reason", reason if disabled else None)):
                if value:
                    _set(table, key, value)
                elif key in table:
                    del table[key]

        await self._edit(login, change)

    async def remove_user(self, login: str) -> None:
        await self._edit(login, _remove)

    async def list_users(self) -> list[User]:
        accounts = await self._on_file_thread(_read, self._path)
        return [a.user for a in sorted(accounts, key=lambda a: login_key(a.user.login))]

    async def _edit(self, login: str, change) -> bool:
        """
        Apply C{change(users, index)} to the C{[[users]]} table of C{login}
        in the file's tomlkit document (on the file's thread), so that the
        operator's comments and order survive; the result is validated
        before it replaces the file. A change that returns False leaves the
        file as it is, and so does this (False).
        """
        return await self._on_file(self._rewrite, login, change)

    def _rewrite(self, login: str, change) -> bool:
        def at_login(users) -> bool:
            key = None if credential_text(login) is None else login_key(login)
            index = next((i for i, table in enumerate(users) if login_key(table["login"]) == key), None)
            if index is None:
                raise ValueError(f"{self._path}: no user with login {login!r}")
            return change(users, index) is not False

        return self._rewrite_users(at_login)

    def _rewrite_users(self, change):
        """
        Apply C{change(users)} to the file's C{[[users]]} array under the
        file's lock, and write the result unless C{change} returned a false
        value; returns what C{change} returned.
        """
        with _editing(self._path):
            try:
                text = self._path.read_bytes().decode("utf-8-sig")
            except UnicodeDecodeError:
                raise ValueError(f"{self._path.name}: not UTF-8 text") from None
            self._check(text)
            document = tomlkit.parse(text)
            users = document.get("users", [])
            done = change(users)
            if not done:
                return done
            if not users:
                del document["users"]
            new_text = tomlkit.dumps(document)
            self._check(new_text)
            _write_atomically(self._path, new_text)
            return done

    def _check(self, text: str) -> None:
        try:
            _parse(text, self._path.name)
        except ConfigError as e:
            raise ValueError(str(e)) from None


def _detach_trailing(table) -> list:
    """
    Take the blank lines and comments off the end of a tomlkit table: in the
    file they come before the next table, and may be about it.
    """
    body = table.value.body
    trailing: list = []
    while body and body[-1][0] is None:
        trailing.insert(0, body.pop())
    return trailing


def _set(table, key: str, value) -> None:
    """Set C{key} in a tomlkit table; a new key goes after the table's last key."""
    if key in table:
        table[key] = value
        return
    trailing = _detach_trailing(table)
    table.append(key, value)
    for item in trailing:
        table.raw_append(*item)


def _replace_hashes(batch: dict[str, tuple[str, str, str]], users) -> list[str]:
    """
    Set each user's new hash from C{batch} (sub to login, hash read at
    sign-in, new hash) where the file still holds the hash read at sign-in:
    one changed since (an operator's edit, a password set through the admin
    API) is kept. Returns the logins upgraded.
    """
    upgraded = []
    for table in users:
        wanted = batch.get(str(table["sub"]))
        if wanted is not None and table["password_hash"] == wanted[1]:
            _set(table, "password_hash", wanted[2])
            upgraded.append(str(table["login"]))
    return upgraded


NAMED = 10
"""Logins a line names at most; a file of thousands of users would otherwise make one line of them all."""


def _names(logins: Iterable[str]) -> str:
    logins = list(logins)
    named = ", ".join(map(repr, logins[:NAMED]))
    return named if len(logins) <= NAMED else f"{named} and {len(logins) - NAMED} more"


def _remove(users, index: int) -> None:
    """Remove a table; the comments after it move to the end of the table before it."""
    trailing = _detach_trailing(users[index])
    del users[index]
    if index > 0:
        for item in trailing:
            users[index - 1].raw_append(*item)


def file_thread(context) -> Callable[..., Deferred]:
    """
    Runs a function on the server's one thread for the users file (an
    L{IPluginContext}'s pool L{FILE_POOL}) and fires with its result on the
    reactor's thread.
    """
    return partial(deferToThreadPool, context.reactor, context.threadpool(FILE_POOL, 1))


def from_config(section: Section, context) -> StaticIdentityBackend:
    """
    Build the backend from its config section: C{path} (default
    C{users.toml}, relative to the config file's folder).
    """
    path = section.path_("path", "users.toml")
    section.done()
    try:
        return StaticIdentityBackend(path, context.reactor, PasswordVerifier.for_context(context),
                                     file_thread(context))
    except FileNotFoundError:
        raise section.error(
            "path", f"{path} does not exist (authsrv-admin user add creates it)"
        ) from None
    except OSError as e:
        raise section.error("path", f"cannot read {path}: {e.strerror}") from None


def toml_string(value: str) -> str:
    """
    C{value} as a TOML basic string that reads back as exactly C{value};
    raises L{UnicodeEncodeError} (a L{ValueError}) for lone surrogates, which
    no TOML file can hold.
    """
    value.encode("utf-8")
    return '"' + "".join(
        _TOML_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if c < " " or c == "\x7f" else c)
        for c in value
    ) + '"'


def _toml_table(fields: dict) -> str:
    lines = ["[[users]]"]
    for key, value in fields.items():
        lines.append(f"{key} = {'true' if value is True else toml_string(value)}")
    return "\n".join(lines) + "\n"


@contextmanager
def _editing(path: Path):
    """
    Held around each read, change and write of the users file: an exclusive
    lock on a file beside it, so that the server's workers and the operator
    command, each of which writes the whole file anew, never write over a
    change another made after it read.
    """
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    """
    Replace C{path} with C{text} so that readers see the old or the new file,
    never a partial one; keeps the old file's mode (a new file is 0600: it
    holds password hashes).
    """
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(temporary, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def create_users_file(path: str | os.PathLike) -> bool:
    """
    Create a users file holding no user, only a header comment that explains
    the format, unless the file exists; returns True when it was created.
    """
    path = Path(path)
    if path.exists():
        return False
    _write_atomically(path, _HEADER)
    return True


def add_user(
    path: str | os.PathLike,
    *,
    login: str,
    password_hash: str,
    sub: str | None = None,
    name: str | None = None,
    email: str | None = None,
    email_verified: bool = False,
    picture: str | None = None,
    chat_user_id: str | None = None,
    disabled: bool = False,
    disabled_reason: str | None = None,
) -> User:
    """
    Append a user to a users file (created if missing), keeping its existing
    text and comments, and return the new L{User}; C{sub} defaults to a random
    UUID. Raises L{ValueError} for a bad field or a login or sub already
    taken, and L{ConfigError} if the existing file is invalid.
    """
    path = Path(path)
    fields = {
        "sub": str(uuid.uuid4()) if sub is None else sub,
        "login": login,
        "password_hash": password_hash,
        "name": name,
        "email": email,
        "email_verified": email_verified,
        "picture": picture,
        "chat_user_id": chat_user_id,
        "disabled": disabled,
        "disabled_reason": disabled_reason,
    }
    fields = {k: v for k, v in fields.items() if v is not None and v is not False}
    try:
        new = _account(Section(dict(fields), "", path.parent))
    except ConfigError as e:
        raise ValueError(str(e)) from None
    with _editing(path):
        return _append(path, fields, new.user)


def _append(path: Path, fields: dict, user: User) -> User:
    """Append C{user}'s table to the file, unless its login or sub is taken."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        text = _HEADER
    except UnicodeDecodeError:
        raise ConfigError(path.name, "not UTF-8 text") from None
    users = _Users.of(_parse(text, path.name))
    taken = users.by_login.get(login_key(user.login))
    if taken is not None:
        raise ValueError(f"login {taken.user.login!r} is already taken by user {taken.user.sub!r}")
    if user.sub in users.by_sub:
        raise ValueError(f"sub {user.sub!r} is already taken by login {users.by_sub[user.sub].user.login!r}")
    separator = "\n" if not text or text.endswith("\n") else "\n\n"
    new_text = text + separator + _toml_table(fields)
    try:
        _parse(new_text, path.name)
    except ConfigError as e:
        raise ValueError(f"cannot append a [[users]] table to {path.name}: {e}") from None
    _write_atomically(path, new_text)
    return user
