"""
An operator's change to a client is made from what it read; another writer
that came between (a secret rotated, the client removed, on this instance
or another) is kept, never overwritten with the older record.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from authsrv.operations.clients import ClientOperations, client_etag
from authsrv.operations.errors import NotFound, PreconditionFailed
from authsrv.testing.memory import MemoryStore


def operations(store) -> ClientOperations:
    return ClientOperations(store=store, clock=Clock(), declared=frozenset(), resolve=None)


async def created(store) -> ClientOperations:
    ops = operations(store)
    await ops.create({"client_id": "crm", "redirect_uris": ["https://crm.example/cb"]}, actor="admin-api")
    return ops


def meanwhile(store, write):
    """The store, running C{write} once just before the next change_client compares."""
    change_client = store.change_client

    async def first_the_other_writer(before, after):
        store.change_client = change_client
        await write()
        return await change_client(before, after)

    store.change_client = first_the_other_writer


@pytest_twisted.ensureDeferred
async def test_a_change_keeps_a_secret_rotated_meanwhile():
    store = MemoryStore()
    ops = await created(store)
    rotations = []

    async def rotate():
        rotations.append(await ops.rotate_secret("crm", actor="admin-api", overlap=0))

    meanwhile(store, rotate)
    changed = await ops.update("crm", {"name": "CRM"}, actor="admin-api")
    [(rotated, _)] = rotations
    stored = await store.get_client("crm")
    assert stored == changed
    assert (stored.name, stored.secret_hash, stored.previous_secret_hash) == ("CRM", rotated.secret_hash, None)


@pytest_twisted.ensureDeferred
async def test_a_rotation_keeps_a_change_made_meanwhile():
    store = MemoryStore()
    ops = await created(store)
    meanwhile(store, lambda: ops.update("crm", {"name": "CRM"}, actor="admin-api"))
    rotated, _ = await ops.rotate_secret("crm", actor="admin-api", overlap=0)
    assert await store.get_client("crm") == rotated
    assert rotated.name == "CRM"


@pytest.mark.parametrize("change", [
    lambda ops: ops.update("crm", {"name": "CRM"}, actor="admin-api"),
    lambda ops: ops.rotate_secret("crm", actor="admin-api", overlap=0),
])
@pytest_twisted.ensureDeferred
async def test_a_client_removed_meanwhile_stays_removed(change):
    store = MemoryStore()
    ops = await created(store)
    meanwhile(store, lambda: ops.delete("crm", actor="admin-api"))
    with pytest.raises(NotFound):
        await change(ops)
    assert await store.get_client("crm") is None


@pytest_twisted.ensureDeferred
async def test_with_if_match_a_client_changed_meanwhile_is_refused():
    store = MemoryStore()
    ops = await created(store)
    tag = client_etag(await store.get_client("crm"))
    meanwhile(store, lambda: ops.rotate_secret("crm", actor="admin-api", overlap=0))
    with pytest.raises(PreconditionFailed):
        await ops.update("crm", {"name": "CRM"}, actor="admin-api", if_match=tag)
    assert (await store.get_client("crm")).name == "crm"


@pytest_twisted.ensureDeferred
async def test_with_if_match_a_client_changed_before_its_removal_is_kept():
    """
    A delete under If-Match removes the client only while it is still the
    one the tag names: a change that lands between the check and the removal
    (on this instance or another) makes it a 412, and the client stays.
    """
    store = MemoryStore()
    ops = await created(store)
    tag = client_etag(await store.get_client("crm"))
    remove_client = store.remove_client

    async def first_the_other_writer(client_id, *args, **kwargs):
        store.remove_client = remove_client
        await ops.update("crm", {"name": "CRM"}, actor="admin-api")
        return await remove_client(client_id, *args, **kwargs)

    store.remove_client = first_the_other_writer
    with pytest.raises(PreconditionFailed):
        await ops.delete("crm", actor="admin-api", if_match=tag)
    assert (await store.get_client("crm")).name == "CRM"

    await ops.delete("crm", actor="admin-api", if_match=client_etag(await store.get_client("crm")))
    assert await store.get_client("crm") is None
