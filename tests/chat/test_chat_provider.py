"""
The chat provider client: the conformance suite against the fake provider,
reached in memory and on a real 127.0.0.1 port, then what only the real
client's construction and a closed port show.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import attrs
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.python.threadpool import ThreadPool

from authsrv.chat.config import ChatConfig
from authsrv.chat.crypto import key_from_text, new_key_text
from authsrv.chat.errors import ChatProviderUnavailable
from authsrv.chat.provider import LOOKUPS_WAITING, ChatProvider, PlatformClient
from authsrv.hostlookup import HostLookups
from authsrv.testing.chat import TIMEOUT, ChatProviderConformance, endpoints
from authsrv.testing.fake_chat import FakeChatProvider


def config_for(fake: FakeChatProvider, base_url: str) -> ChatConfig:
    return ChatConfig(
        encryption_key=key_from_text(new_key_text()), timeout=TIMEOUT, lock_ttl=TIMEOUT + 1,
        **endpoints(fake, base_url),
    )


@asynccontextmanager
async def on_a_port(fake: FakeChatProvider):
    """The real client over TCP to the fake listening on 127.0.0.1, its calls timed on the fake's clock."""
    port = fake.listen(reactor)
    lookups = ThreadPool(minthreads=0, maxthreads=1)
    lookups.start()
    base = f"http://127.0.0.1:{port.getHost().port}"
    try:
        yield ChatProvider(fake.clock, PlatformClient(reactor, HostLookups(reactor, lookups, LOOKUPS_WAITING), TIMEOUT, clock=fake.clock),
                           config_for(fake, base))
    finally:
        lookups.stop()
        await port.stopListening()


class TestInMemory(ChatProviderConformance):
    @asynccontextmanager
    async def connect(self, fake):
        yield ChatProvider(fake.clock, fake.memory_client(), config_for(fake, "https://chat.example.test"))


class TestOnARealPort(ChatProviderConformance):
    def connect(self, fake):
        return on_a_port(fake)


@pytest_twisted.ensureDeferred
async def test_a_closed_port_is_unavailable():
    fake = FakeChatProvider(Clock())
    async with on_a_port(fake) as provider:
        access = fake.grant()["access_token"]
        assert await provider.current_user(access) == fake.user.id
    with pytest.raises(ChatProviderUnavailable):
        await provider.current_user(access)


def test_a_client_needs_a_client_id():
    config = ChatConfig(encryption_key=key_from_text(new_key_text()))
    with pytest.raises(ValueError, match="client_id"):
        ChatProvider(Clock(), None, config)


@pytest_twisted.ensureDeferred
async def test_without_a_revocation_endpoint_revoke_asks_nothing():
    fake = FakeChatProvider(Clock())
    config = attrs.evolve(config_for(fake, "https://chat.example.test"), revocation_url=None)
    access = fake.grant()["access_token"]
    await ChatProvider(fake.clock, fake.memory_client(), config).revoke(access, "access_token")
    assert fake.revocations == [] and fake.access_valid(access)
