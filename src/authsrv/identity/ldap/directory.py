"""
Connections to the directory on ldap3, which blocks: every method runs in a
thread of the backend's pool. Service connections are kept for reuse, each
used by one thread at a time; a pooled connection the directory dropped is
replaced and the operation tried once more; an unreachable, refusing or
hung directory is L{BackendUnavailable} within the configured timeouts.
"""

from __future__ import annotations

import socket
import ssl
import threading
from urllib.parse import urlsplit

from ldap3 import ANONYMOUS, NONE, SIMPLE, SYNC, Connection, Server, Tls
from ldap3.core.exceptions import LDAPException
from twisted.cred.error import UnauthorizedLogin
from twisted.logger import Logger

from authsrv.identity.errors import BackendUnavailable
from authsrv.identity.ldap.config import LdapSettings

log = Logger()

_BIND_REFUSED = {32, 48, 49, 50, 53}
"""Bind results that mean "not with this password": no such object (the decoy bind of
an unknown login, on a directory that says so rather than invalid credentials),
inappropriate authentication, invalid credentials, insufficient access, unwilling to
perform (locked, expired)."""


class _Dropped(Exception):
    """A pooled connection failed in a way a new connection may not."""


def _timed_out(error: BaseException | None) -> bool:
    """Whether C{error} or one it was raised from is a timeout (ldap3 wraps the socket's)."""
    while error is not None:
        if isinstance(error, TimeoutError):
            return True
        error = error.__cause__ or error.__context__
    return False


def close_connection(connection: Connection) -> None:
    try:
        connection.unbind()
    except (LDAPException, OSError):
        pass


class Directory:
    """
    Connections to the directory, for use from pool threads: service
    connections kept for reuse, each used by one thread at a time, and
    short-lived connections that bind as a user to check a password.
    """

    def __init__(self, settings: LdapSettings):
        self._settings = settings
        self._idle: list[Connection] = []
        self._checkers: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _tls(self, host: str | None) -> Tls:
        ca_file = str(self._settings.ca_file) if self._settings.ca_file else None
        return Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=ca_file, sni=host)

    def _connect(self, url: str, user: str | None, password: bytes | None, timeout: float) -> Connection:
        """An open connection to C{url}, bound as C{user}; its result tells how the bind went."""
        settings = self._settings
        parts = urlsplit(url)
        secure = parts.scheme.lower() == "ldaps"
        server = Server(
            parts.hostname, port=parts.port or (636 if secure else 389), use_ssl=secure,
            tls=self._tls(parts.hostname) if secure or settings.start_tls else None,
            get_info=NONE, connect_timeout=settings.connect_timeout,
        )
        connection = Connection(
            server, user=user, password=password, authentication=SIMPLE if user else ANONYMOUS,
            client_strategy=SYNC, receive_timeout=timeout, read_only=True, auto_referrals=False,
            raise_exceptions=False, return_empty_attributes=False,
        )
        try:
            connection.open()
            # ldap3 leaves Nagle's algorithm on, and a handshake's last write
            # followed by the bind request would then wait for the directory's
            # delayed acknowledgement (40 ms on Linux) on every password check.
            connection.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if settings.start_tls and not secure:
                connection.start_tls()
            connection.bind()
        except BaseException:
            close_connection(connection)
            raise
        return connection

    def open(self, user: str | None, password: bytes | None, timeout: float) -> Connection:
        """
        A connection to the first server, in the configured order, that
        answers, bound as C{user} (anonymously for None); raises
        L{UnauthorizedLogin} when a server refuses the password, else
        L{BackendUnavailable} when none answers.
        """
        problems = []
        for url in self._settings.urls:
            try:
                connection = self._connect(url, user, password, timeout)
            except (LDAPException, OSError) as e:
                problems.append(f"{url}: {e}")
                continue
            if connection.bound:
                return connection
            result = connection.result
            close_connection(connection)
            if result["result"] in _BIND_REFUSED:
                raise UnauthorizedLogin(f"the directory refused the bind: {result['description']}")
            problems.append(f"{url}: bind answered {result['description']} {result['message']}".strip())
        raise BackendUnavailable("directory unavailable: " + "; ".join(problems))

    def _service_connection(self) -> Connection:
        settings = self._settings
        password = settings.bind_password.encode("utf-8") if settings.bind_password else None
        try:
            connection = self.open(settings.bind_dn, password, settings.bind_timeout)
        except UnauthorizedLogin as e:
            log.error("the directory refused the bind of bind_dn {bind_dn!r}: check it and its password",
                      bind_dn=settings.bind_dn)
            raise BackendUnavailable(str(e)) from None
        connection.socket.settimeout(settings.search_timeout)
        return connection

    def check(self, user: str, password: bytes, timeout: float) -> None:
        """
        Returns if the directory takes C{password} for C{user}; raises
        L{UnauthorizedLogin} when it refuses it, else L{BackendUnavailable}.
        The bind goes on a connection kept for password checks, one round
        trip where a new connection costs a TCP and TLS handshake too (about
        2 ms of CPU against 0.16, bench/README.md "LDAP identity"). A kept
        connection serves binds only, and only while ldap3 holds it open
        with its TLS in place: ldap3's bind on a connection it has closed
        opens a new one, without StartTLS. One the directory dropped, or
        that answered neither yes nor no, is replaced by a new connection
        (L{open}, every server in turn); one that timed out is not, since a
        new connection would wait as long.
        """
        with self._lock:
            kept = self._checkers.pop() if self._checkers else None
        if kept is not None and self._intact(kept):
            kept.user, kept.password = user, password
            try:
                bound = kept.bind()
            except (LDAPException, OSError) as e:
                close_connection(kept)
                if _timed_out(e):
                    raise BackendUnavailable(f"directory unavailable: {e}") from None
            else:
                if bound or kept.result["result"] in _BIND_REFUSED:
                    return self._keep_checker(kept, bound)
                close_connection(kept)
        elif kept is not None:
            close_connection(kept)
        self._keep_checker(self.open(user, password, timeout), True)

    def _intact(self, connection: Connection) -> bool:
        secure = connection.server.ssl or not self._settings.start_tls
        return not connection.closed and (secure or connection.tls_started)

    def _keep_checker(self, connection: Connection, bound: bool) -> None:
        """Keep C{connection}, without the password, for the next check; raise if its bind was refused."""
        connection.password = None
        with self._lock:
            kept = not self._closed
            if kept:
                self._checkers.append(connection)
        if not kept:
            close_connection(connection)
        if not bound:
            raise UnauthorizedLogin(f"the directory refused the bind: {connection.result['description']}")

    def run(self, operation):
        """
        C{operation(connection)} on a service connection, taken from the
        pool or new; a pooled connection the directory dropped is replaced
        and the operation tried once more.
        """
        with self._lock:
            pooled = self._idle.pop() if self._idle else None
        if pooled is not None:
            try:
                return self._use(pooled, operation, retry=True)
            except _Dropped:
                pass
        return self._use(self._service_connection(), operation, retry=False)

    def _use(self, connection: Connection, operation, *, retry: bool):
        try:
            result = operation(connection)
        except (LDAPException, OSError) as e:
            close_connection(connection)
            if retry and not _timed_out(e):
                raise _Dropped() from e
            raise BackendUnavailable(f"directory unavailable: {e}") from None
        except BaseException:
            close_connection(connection)
            raise
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return result
        close_connection(connection)
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle, self._checkers = self._idle + self._checkers, [], []
        for connection in idle:
            close_connection(connection)
