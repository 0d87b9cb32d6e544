"""
The code exchange and the refresh timed in-process, on SQLite and on
PostgreSQL: the real web root (tests/harness.py) served on a loopback port of
this process's reactor and asked one request at a time, so each figure is
one request's latency with its store calls and durable commits (SQLite with
synchronous = FULL, PostgreSQL on a throwaway cluster with fsync on; both in
the temporary folder, which must be on a disk). With --src, the same driver
times another checkout's authsrv, for a before/after comparison in one
sitting.

    .venv/bin/python bench/store_calls.py --rounds 200 --seconds 20
    .venv/bin/python bench/store_calls.py --src BEFORE/src --out bench/results/store-calls-before

Each store gets at most --rounds exchanges (each followed by a refresh of
the token it gave) and at most --seconds of wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 10
TOKEN = "/api/auth/oauth2/token"
UNLIMITED = {"rate_limits": {"default": "1000000/s", "internal": "1000000/s"}}


class Environment:
    """What the harness asks of pytest's monkeypatch: its clients' secrets in the environment."""

    def setenv(self, name: str, value: str) -> None:
        os.environ[name] = value


async def timed_store(reactor, store: str, rounds: int, seconds: float) -> dict:
    """Exchange and refresh latencies (ms) on one store, the cluster and the folder removed after."""
    import treq
    from twisted.web.client import HTTPConnectionPool
    from twisted.web.server import Site

    from harness import SECRETS, Harness
    from token_helpers import redirect_uri_of, save_code

    cluster = None
    folder = Path(tempfile.mkdtemp(prefix="authsrv-store-calls-"))
    try:
        options = {}
        if store == "postgres":
            from pgcluster import Cluster

            cluster = Cluster(local=True, fsync=True)
            options["postgres_dsn"] = cluster.database()
        h = Harness(folder, Environment(), UNLIMITED, **options)
        await h.start()
        port = reactor.listenTCP(0, Site(h.root), interface="127.0.0.1")
        pool = HTTPConnectionPool(reactor, persistent=True)
        url = f"http://127.0.0.1:{port.getHost().port}{TOKEN}"
        client = {"client_id": "first", "client_secret": SECRETS["first"]}

        async def token(fields: dict) -> tuple[float, dict]:
            started = time.perf_counter()
            response = await treq.post(url, data={**client, **fields}, pool=pool)
            body = await response.json()
            elapsed = (time.perf_counter() - started) * 1000
            if response.code != 200:
                raise RuntimeError(f"{fields['grant_type']}: {response.code} {body}")
            return elapsed, body

        times: dict[str, list[float]] = {"code exchange": [], "refresh": []}
        deadline = time.monotonic() + seconds
        try:
            for n in range(WARM_UP + rounds):
                if time.monotonic() > deadline:
                    break
                code, verifier = await save_code(h)
                exchanged, body = await token({"grant_type": "authorization_code", "code": code,
                                               "code_verifier": verifier, "redirect_uri": redirect_uri_of("first")})
                refreshed, _ = await token({"grant_type": "refresh_token", "refresh_token": body["refresh_token"]})
                if n >= WARM_UP:
                    times["code exchange"].append(exchanged)
                    times["refresh"].append(refreshed)
        finally:
            await pool.closeCachedConnections()
            await port.stopListening()
            await h.close()
        return times
    finally:
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)


def summary(store: str, times: dict) -> list[dict]:
    return [
        {"store": store, "endpoint": endpoint, "requests": len(values),
         "p50_ms": statistics.median(values), "p90_ms": statistics.quantiles(values, n=10)[-1]}
        for endpoint, values in times.items()
    ]


def table(rows: list[dict], source: str) -> str:
    lines = [f"authsrv from {source}, one request at a time, in-process.", "",
             "| store | endpoint | requests | p50 ms | p90 ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['store']} | {r['endpoint']} | {r['requests']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200, help="exchanges (each with a refresh) per store")
    parser.add_argument("--seconds", type=float, default=20, help="wall-time bound per store")
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the authsrv source tree to time")
    parser.add_argument("--out", type=Path, help="write PATH.md and PATH.json")
    args = parser.parse_args()
    # The driver (harness, cluster helper) is this checkout's; the server is --src's.
    sys.path[:0] = [str(args.src.resolve()), str(ROOT / "tests")]

    import authsrv
    from twisted.internet import defer, task

    source = os.path.relpath(Path(authsrv.__file__).parent.parent, Path.cwd())

    async def run(reactor):
        rows = []
        for store in args.stores.split(","):
            rows += summary(store, await timed_store(reactor, store, args.rounds, args.seconds))
        text = table(rows, source)
        print(text)
        if args.out:
            args.out.with_suffix(".md").write_text(text)
            args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))

    task.react(lambda reactor: defer.ensureDeferred(run(reactor)))


if __name__ == "__main__":
    main()
