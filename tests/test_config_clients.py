"""Clients declared in the config file are the file's: removing one there removes it from the store."""

from __future__ import annotations

import attrs
import pytest_twisted

from authsrv.config import parse_config
from authsrv.service import sync_config_clients
from authsrv.testing.memory import MemoryStore


def _clients(*ids: str):
    return parse_config(
        {"clients": [{"client_id": i, "redirect_uris": [f"https://{i}.example/cb"]} for i in ids]}, None
    ).clients


@pytest_twisted.ensureDeferred
async def test_a_client_removed_from_the_config_leaves_the_store_and_operator_clients_stay():
    store = MemoryStore()
    await sync_config_clients(store, _clients("web", "old"))
    (declared,) = _clients("by-hand")
    await store.add_client(attrs.evolve(declared, source="operator"))
    await sync_config_clients(store, _clients("web"))
    assert [c.client_id for c in await store.list_clients()] == ["by-hand", "web"]
    assert await store.get_client("old") is None
    assert (await store.get_client("web")).source == "config"
