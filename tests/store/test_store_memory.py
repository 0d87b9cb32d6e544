"""The in-memory store passes both conformance suites, as the SQL stores do."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from authsrv.records import Client
from authsrv.store.errors import AlreadyExists
from authsrv.testing.memory import MemoryStore
from authsrv.testing.store import CLIENT, StoreConcurrencyConformance, StoreConformance


class TestMemoryStore(StoreConformance):
    def make_store(self):
        return MemoryStore()


class TestMemoryConcurrency(StoreConcurrencyConformance):
    def make_store_pair(self):
        first = MemoryStore()
        return first, MemoryStore(first.tables)


class TestAnswers(SynchronousTestCase):
    def test_answers_are_already_fired(self):
        """StubTreq tests run without a reactor turning: nothing may wait for one."""
        store = MemoryStore()
        client = Client(CLIENT, None, ["https://app.example/cb"])
        self.assertIsNone(self.successResultOf(store.add_client(client)))
        self.assertEqual(self.successResultOf(store.get_client(CLIENT)), client)
        self.failureResultOf(store.add_client(client), AlreadyExists)
        self.assertIsNone(self.successResultOf(store.close()))
