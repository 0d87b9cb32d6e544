"""
Housekeeping end to end: the running service's maintenance timer, on a
Clock, deletes what expired from a real SQLite store in small batches,
round after round, and leaves everything live alone (docs/design.md,
Housekeeping).
"""

from __future__ import annotations

import sqlite3

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import fail
from twisted.internet.task import Clock, deferLater

from authsrv import service
from authsrv.config import parse_config
from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.identity.chain import IdentityChain
from authsrv.keys import jwkfile
from authsrv.records import (
    LOGIN_STAGE,
    AccessToken,
    AuthorizationCode,
    AuthorizationRequest,
    BrowserSession,
    Client,
    Grant,
    Interaction,
    RefreshToken,
)
from authsrv.service import MAINTENANCE_INTERVAL, AuthsrvService
from authsrv.store import sqlite
from authsrv.store.errors import StoreUnavailable
from authsrv.tokens import token_hash

NOW = 1_800_000_000
DAY = 86400
BATCH = 2
TABLES = ("browser_sessions", "interactions", "authorization_codes", "access_tokens", "refresh_tokens",
          "grants")


class Server:
    """The service over a real store and keystore in C{folder}, its time a Clock."""

    def __init__(self, folder):
        self.folder = folder
        self.clock = Clock()
        self.clock.advance(NOW)
        config = parse_config({}, folder / "authsrv.toml")
        self.context = PluginContext(reactor, folder, config.limits.max_token_lifetime)
        self.store = sqlite.from_config(Section({}, "store", folder), self.context)
        keystore = jwkfile.from_config(Section({}, "keystore", folder), self.context)
        self.gc_results: list = []
        self._real_gc = self.store.gc
        self.store.gc = self._gc
        self.service = AuthsrvService(
            reactor=self.clock, config=config, context=self.context, store=self.store, keystore=keystore,
            identity=IdentityChain([]), ports=[],
        )

    def _gc(self, now, batch_size):
        """The store's own gc, noting when and how it was asked, and what it answered."""
        self.gc_results.append((now, batch_size, None))
        d = self._real_gc(now, batch_size)

        def noted(result):
            self.gc_results[-1] = (now, batch_size, result)
            return result

        return d.addBoth(noted)

    async def round_done(self) -> None:
        """Until the round in progress has finished and the timer waits for the next one."""
        for _ in range(5000):
            if self.clock.getDelayedCalls():
                return
            await deferLater(reactor, 0.001, lambda: None)
        raise AssertionError("the maintenance round never finished")

    async def next_round(self) -> None:
        self.clock.advance(MAINTENANCE_INTERVAL)
        await self.round_done()

    def counts(self) -> dict[str, int]:
        with sqlite3.connect(self.folder / "authsrv.sqlite3") as db:
            return {table: db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in TABLES}


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(service, "GC_BATCH", BATCH)
    server = Server(tmp_path)
    yield server
    if server.service.running:
        pytest_twisted.blockon(server.service.stopService())
    else:
        server.context.stop()


def _grant(grant_id: str, **changes) -> Grant:
    values = dict(grant_id=grant_id, client_id="first", sub="alice", scope={"openid"}, sid="sid-" + grant_id,
                  created_at=NOW, expires_at=NOW + 30 * DAY)
    return Grant(**{**values, **changes})


def _code(label: str, grant: Grant, expires_at: int) -> AuthorizationCode:
    return AuthorizationCode(token_hash(label), grant.grant_id, grant.client_id, grant.sub,
                             "http://127.0.0.1:9000/callback", grant.scope, issued_at=NOW, expires_at=expires_at)


def _access(label: str, grant: Grant, expires_at: int) -> AccessToken:
    return AccessToken(token_hash(label), grant.grant_id, grant.client_id, grant.sub, grant.scope,
                       issued_at=NOW, expires_at=expires_at)


def _refresh(label: str, grant: Grant, expires_at: int) -> RefreshToken:
    return RefreshToken(token_hash(label), grant.grant_id, grant.client_id, grant.sub, grant.scope,
                        issued_at=NOW, expires_at=expires_at)


def _interaction(interaction_id: str, expires_at: int) -> Interaction:
    request = AuthorizationRequest(
        client_id="first", redirect_uri="http://127.0.0.1:9000/callback", scope=("openid",), state="s",
        code_challenge="c" * 43,
    )
    return Interaction(interaction_id, LOGIN_STAGE, request, "csrf", NOW - 600, expires_at)


async def _seed(store) -> None:
    """
    Expired now: 5 sessions, 3 interactions, 3 access and 3 refresh
    tokens. Expiring within the minute: the live grant's code, and the code
    that keeps a revoked grant (and its live-looking token) until then.
    Live for days: one of each.
    """
    for n in range(5):
        await store.create_session(BrowserSession(token_hash(f"old-{n}"), f"old-{n}", "alice", NOW, NOW - DAY, NOW - n))
    await store.create_session(BrowserSession(token_hash("live"), "live", "alice", NOW, NOW, NOW + DAY))
    for n in range(3):
        await store.save_interaction(_interaction(f"old-{n}", NOW - n))
    await store.save_interaction(_interaction("live", NOW + 600))
    await store.add_client(Client("first", None, ["http://127.0.0.1:9000/callback"]))
    live = _grant("live")
    await store.save_code(_code("code-live", live, NOW + 60), live)
    for n in range(3):
        await store.issue_tokens(_access(f"old-access-{n}", live, NOW - n), _refresh(f"old-refresh-{n}", live, NOW - n))
    await store.issue_tokens(_access("access-live", live, NOW + 3600), _refresh("refresh-live", live, NOW + 30 * DAY))
    revoked = _grant("revoked")
    await store.save_code(_code("code-revoked", revoked, NOW + 60), revoked)
    await store.issue_tokens(_access("access-revoked", revoked, NOW + 3600), None)
    await store.revoke_grant("revoked", NOW)


@pytest_twisted.ensureDeferred
async def test_expired_rows_go_in_batches_each_minute_and_live_ones_stay(server):
    """A round deletes batch after batch until one comes back short: what expires never piles up."""
    await _seed(server.store)
    assert server.counts() == {
        "browser_sessions": 6, "interactions": 4, "authorization_codes": 2,
        "access_tokens": 5, "refresh_tokens": 4, "grants": 2,
    }

    server.service.startService()
    await server.round_done()
    assert server.gc_results == [(NOW, BATCH, 8), (NOW, BATCH, 5), (NOW, BATCH, 1)]
    assert server.counts() == {
        "browser_sessions": 1, "interactions": 1, "authorization_codes": 2,
        "access_tokens": 2, "refresh_tokens": 1, "grants": 2,
    }

    server.clock.advance(MAINTENANCE_INTERVAL - 1)
    assert len(server.gc_results) == 3

    server.clock.advance(1)
    await server.round_done()
    # Both codes expired at NOW + 60: the revoked grant goes, with its token.
    assert server.gc_results[3:] == [(NOW + 60, BATCH, 3), (NOW + 60, BATCH, 0)]
    assert server.counts() == {
        "browser_sessions": 1, "interactions": 1, "authorization_codes": 0,
        "access_tokens": 1, "refresh_tokens": 1, "grants": 1,
    }

    await server.next_round()
    assert server.gc_results[5:] == [(NOW + 120, BATCH, 0)]
    store, now = server.store, server.clock.seconds()
    assert await store.get_session(token_hash("live"), now) is not None
    assert await store.get_interaction("live", now) is not None
    assert await store.find_access_token(token_hash("access-live"), now) is not None
    assert await store.get_refresh_token(token_hash("refresh-live")) is not None
    assert await store.get_grant("live") is not None
    assert await store.get_grant("revoked") is None

    await server.service.stopService()
    server.clock.advance(10 * MAINTENANCE_INTERVAL)
    assert len(server.gc_results) == 6


@pytest_twisted.ensureDeferred
async def test_a_round_with_a_backlog_stops_after_its_time(server, monkeypatch):
    """One batch of each kind at least, then more only within GC_ROUND_SECONDS: the rest waits for the next round."""
    monkeypatch.setattr(service, "GC_ROUND_SECONDS", 0)
    await _seed(server.store)
    server.service.startService()
    await server.round_done()
    assert server.gc_results == [(NOW, BATCH, 8)]
    assert server.counts()["browser_sessions"] == 4


@pytest_twisted.ensureDeferred
async def test_a_failed_round_is_retried_next_minute(server):
    await _seed(server.store)
    real_gc = server._real_gc
    server._real_gc = lambda now, size: fail(StoreUnavailable("database is locked"))

    server.service.startService()
    await server.round_done()
    assert server.counts()["browser_sessions"] == 6

    server._real_gc = real_gc
    await server.next_round()
    assert server.counts()["browser_sessions"] == 1
