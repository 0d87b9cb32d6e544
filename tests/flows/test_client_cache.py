"""
The client cache (L{authsrv.flows.clients.ClientCache}): unknown client_ids
are kept apart from real clients, so a flood of junk ids never evicts a real
client and never sends its next request to the store.
"""

from __future__ import annotations

import pytest_twisted
from twisted.internet.task import Clock

from authsrv.flows import clients as module
from authsrv.flows.clients import MAX_ENTRIES, TTL, ClientCache
from authsrv.records import Client
from authsrv.testing.memory import MemoryStore


class CountingStore(MemoryStore):
    """The in-memory store, counting client reads by id."""

    def __init__(self):
        super().__init__()
        self.reads: dict[str, int] = {}

    async def get_client(self, client_id):
        self.reads[client_id] = self.reads.get(client_id, 0) + 1
        return await super().get_client(client_id)


async def cache() -> tuple[Clock, CountingStore, ClientCache]:
    clock = Clock()
    clock.advance(1_000_000)
    store = CountingStore()
    await store.put_client(Client(client_id="real", secret_hash=None, redirect_uris=["https://app.example/cb"]))
    return clock, store, ClientCache(store, clock)


@pytest_twisted.ensureDeferred
async def test_a_flood_of_unknown_ids_keeps_real_clients_in_memory():
    clock, store, clients = await cache()
    assert (await clients.get_client("real")).client_id == "real"
    for n in range(MAX_ENTRIES):
        assert await clients.get_client(f"junk-{n}") is None
    assert (await clients.get_client("real")).client_id == "real"
    assert store.reads["real"] == 1


@pytest_twisted.ensureDeferred
async def test_unknown_ids_kept_are_bounded():
    clock, store, clients = await cache()
    for n in range(module.MAX_UNKNOWN + 1):
        await clients.get_client(f"junk-{n}")
    assert len(clients._unknown) <= module.MAX_UNKNOWN


@pytest_twisted.ensureDeferred
async def test_an_unknown_id_is_kept_briefly_and_a_new_client_is_seen_after():
    clock, store, clients = await cache()
    assert await clients.get_client("later") is None
    assert await clients.get_client("later") is None
    assert store.reads["later"] == 1
    await store.put_client(Client(client_id="later", secret_hash=None, redirect_uris=["https://app.example/cb"]))
    assert (await clients.get_client("later", fresh=True)).client_id == "later"
    clock.advance(TTL + 1)
    assert (await clients.get_client("later")).client_id == "later"
    assert await clients.get_client("later") is not None
    assert store.reads["later"] == 3
