"""
Whether an unknown user and a wrong password take the same time, on every
identity backend: the timing side of issue 12's "no user enumeration".

    .venv/bin/python bench/enumeration.py [--tries 20]

Each backend is the real thing with production settings: the static users
file and PostgreSQL (a throwaway cluster, tests/pgcluster.py) with the
default argon2id parameters, LDAP on the tests' own slapd (tests/slapd.py),
and a chain of LDAP then the static file. Every try is a login through a
twisted.cred portal over the identity chain, as the login flow makes it;
unknown-user and wrong-password tries alternate, so that whatever else the
machine does falls on both alike. Prints one Markdown table row per backend:
the median of each kind and their ratio (slower over faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred
from twisted.internet.task import react

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pgcluster import Cluster  # noqa: E402
from slapd import Slapd  # noqa: E402

from authsrv.configsection import Section  # noqa: E402
from authsrv.context import PluginContext  # noqa: E402
from authsrv.identity import postgres, static  # noqa: E402
from authsrv.identity.chain import IdentityChain  # noqa: E402
from authsrv.identity.errors import UnknownUser  # noqa: E402
from authsrv.identity.ldap import backend as ldap  # noqa: E402
from authsrv.identity.passwords import hash_password  # noqa: E402
from authsrv.identity.realm import UserRealm  # noqa: E402
from authsrv.interfaces import IUser  # noqa: E402
from authsrv.testing.identity import ALICE, PASSWORDS  # noqa: E402

UNKNOWN = "nobody-by-this-name"
WRONG = "not the password"


async def _refused(portal: Portal, login: str) -> tuple[float, type]:
    """The seconds one refused login takes, and the failure's type."""
    started = time.perf_counter()
    try:
        await portal.login(UsernamePassword(login.encode(), WRONG.encode()), None, IUser)
    except UnauthorizedLogin as e:
        return time.perf_counter() - started, type(e)
    raise SystemExit(f"enumeration: {login!r} logged in with a wrong password")


async def measure(name: str, backends: list, known: str, tries: int) -> tuple[str, float, float]:
    chain = IdentityChain(backends)
    portal = Portal(UserRealm(chain), [chain])
    for login in (known, UNKNOWN):
        await _refused(portal, login)
    unknown, wrong = [], []
    for _ in range(tries):
        seconds, kind = await _refused(portal, UNKNOWN)
        assert kind is UnknownUser, kind
        unknown.append(seconds)
        seconds, kind = await _refused(portal, known)
        assert kind is UnauthorizedLogin, kind
        wrong.append(seconds)
    return name, statistics.median(unknown), statistics.median(wrong)


def static_backend(context: PluginContext, folder: Path):
    path = folder / "users.toml"
    static.add_user(path, login=ALICE.login, sub=ALICE.sub, password_hash=hash_password(PASSWORDS[ALICE.sub]))
    return static.from_config(Section({"path": str(path)}, "identity[0]", folder), context)


async def postgres_backend(context: PluginContext, cluster: Cluster):
    backend = postgres.from_config(Section({"dsn": cluster.database()}, "identity[0]", None), context)
    await backend.add_user(ALICE, hash_password(PASSWORDS[ALICE.sub]))
    return backend


def ldap_backend(context: PluginContext, slapd: Slapd):
    return ldap.from_config(Section(slapd.backend_config(), "identity[0]", context.base_dir), context)


async def run(reactor, tries: int) -> None:
    cluster, slapd = Cluster(), Slapd()
    folder = Path(tempfile.mkdtemp(prefix="authsrv-bench-"))
    context = PluginContext(reactor, folder)
    rows = []
    try:
        users = static_backend(context, folder)
        database = await postgres_backend(context, cluster)
        directory = ldap_backend(context, slapd)
        rows.append(await measure("static file", [users], ALICE.login, tries))
        rows.append(await measure("PostgreSQL", [database], ALICE.login, tries))
        rows.append(await measure("LDAP", [directory], ALICE.login, tries))
        rows.append(await measure("chain: LDAP, then static file", [directory, users], ALICE.login, tries))
        for backend in (users, database, directory):
            await backend.close()
    finally:
        context.stop()
        slapd.destroy()
        cluster.destroy()
    print(f"| backend | unknown user (median of {tries}) | wrong password (median of {tries}) | ratio |")
    print("|---|---|---|---|")
    for name, unknown, wrong in rows:
        ratio = max(unknown, wrong) / min(unknown, wrong)
        print(f"| {name} | {unknown * 1000:.1f} ms | {wrong * 1000:.1f} ms | {ratio:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20, help="logins of each kind per backend")
    args = parser.parse_args()
    react(lambda reactor: Deferred.fromCoroutine(run(reactor, args.tries)))


if __name__ == "__main__":
    main()
