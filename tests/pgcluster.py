"""
A throwaway PostgreSQL for the tests: a cluster of its own in a temporary
folder on a free port, started from Debian's `postgresql` binaries, or the
server named by AUTHSRV_TEST_POSTGRES_DSN. Never a server that merely
happens to be running on the machine, and only a cluster started here is
ever stopped: outage tests ask for a local one (C{Cluster(local=True)}).

PostgreSQL refuses to run as root, so under root (CI) the cluster belongs to
the `postgres` system user that Debian's package creates.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg2

from conftest import free_port

DSN_VARIABLE = "AUTHSRV_TEST_POSTGRES_DSN"


def _binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError(
            "PostgreSQL binaries not found: install Debian's postgresql package"
            f" (scripts/test.sh does), or name a server in {DSN_VARIABLE}"
        )
    return Path(found[-1]).parent


class Cluster:
    """
    A running PostgreSQL; L{database} makes a fresh empty database on it.
    C{local}: a cluster of its own even when AUTHSRV_TEST_POSTGRES_DSN names
    a server, for tests that stop and start it. Without C{fsync} a commit
    skips the disk sync: fast tests, but benchmarks would time no real commit.
    """

    def __init__(self, *, local: bool = False, fsync: bool = False):
        self._folder: Path | None = None
        self._fsync = "on" if fsync else "off"
        self._as_postgres = os.geteuid() == 0
        self.running = False
        given = None if local else os.environ.get(DSN_VARIABLE)
        if given:
            self.admin_dsn = given
            return
        self._bin = _binaries()
        self._folder = Path(tempfile.mkdtemp(prefix="authsrv-pg-"))
        self.port = free_port()
        data = self._folder / "data"
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self._folder, user.pw_uid, user.pw_gid)
        self._run(str(self._bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")
        self.start()
        self.admin_dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *command: str) -> None:
        if self._as_postgres:
            command = ("runuser", "-u", "postgres", "--", *command)
        subprocess.run(command, check=True, capture_output=True, cwd="/")

    def database(self) -> str:
        """The DSN of a new, empty database."""
        name = "authsrv_test_" + secrets.token_hex(6)
        connection = psycopg2.connect(self.admin_dsn)
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        connection.close()
        base = dict(item.split("=", 1) for item in self.admin_dsn.split())
        base["dbname"] = name
        return " ".join(f"{k}={v}" for k, v in base.items())

    def _started_here(self) -> None:
        if self._folder is None:
            raise RuntimeError(
                f"refusing to stop or start the PostgreSQL named by {DSN_VARIABLE}: the tests did not start"
                " it; a test that stops its server uses a cluster of its own (Cluster(local=True))"
            )

    def stop(self, mode: str = "immediate") -> None:
        """Stop at once, as a crash would, or as C{pg_ctl stop -m fast} does (outage tests)."""
        self._started_here()
        self._run(str(self._bin / "pg_ctl"), "-D", str(self._folder / "data"), "-m", mode, "-w", "stop")
        self.running = False

    def start(self) -> None:
        """Start the cluster (again, after L{stop}: outage tests)."""
        self._started_here()
        self._run(
            str(self._bin / "pg_ctl"), "-D", str(self._folder / "data"), "-w", "-t", "60",
            "-l", str(self._folder / "log"),
            "-o", f"-p {self.port} -k {self._folder} -c listen_addresses=127.0.0.1 -c fsync={self._fsync}"
                  " -c max_connections=200",
            "start",
        )
        self.running = True

    def destroy(self) -> None:
        if self._folder is None:
            return
        if self.running:
            try:
                self.stop()
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self._folder, ignore_errors=True)
