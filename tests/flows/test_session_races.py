"""
A browser session ended (by its user signing out, an operator ending the
user's sessions, or a ban) while a step of it is under way: a step-up of
it, whichever store call of the step-up the end lands after, leaves no
session that outlives the end, and a code issued as it ends is refused, as
its client would never hear of the end by back-channel logout.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from flow_client import location
from harness import Harness
from test_account_page import signed_in

from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.flows.sessions import new_session, step_up_session
from authsrv.records import ACR_MFA
from authsrv.store import sqlite
from authsrv.testing.identity import ALICE as SIGNED_IN
from authsrv.testing.memory import MemoryStore

NOW = 1_700_000_000
ALICE = "3f0c2a52-alice"
STEP_UP_CALLS = 2
"""The store calls a step-up makes: the operator's end lands after each of them in turn."""


class Limits:
    session_ttl = 3600


class OperatorAfter:
    """
    A store whose C{after}-th session call (counting from 1) is followed,
    before it answers, by the operator ending every session of ALICE.
    """

    def __init__(self, store, after: int):
        self._store = store
        self._left = after

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def _then_operator(self, answer):
        self._left -= 1
        if self._left == 0:
            await self._store.end_user_sessions(ALICE)
        return answer

    async def end_session(self, session_hash):
        return await self._then_operator(await self._store.end_session(session_hash))

    async def create_session(self, session):
        return await self._then_operator(await self._store.create_session(session))


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        yield MemoryStore()
        return
    from twisted.internet import reactor

    context = PluginContext(reactor, tmp_path)
    store = sqlite.from_config(Section({}, "store", tmp_path), context)
    yield store
    context.stop()


@pytest.mark.parametrize("after", range(1, STEP_UP_CALLS + 1))
@pytest_twisted.ensureDeferred
async def test_a_step_up_never_outlives_the_operator_ending_sessions(store, after):
    _, session = new_session(Limits, ALICE, NOW)
    await store.create_session(session)
    await step_up_session(OperatorAfter(store, after), session, ("pwd", "otp"), ACR_MFA, NOW + 5)
    assert await store.list_user_sessions(ALICE, NOW + 5) == []


@pytest_twisted.ensureDeferred
async def test_a_step_up_of_a_session_signed_out_meanwhile_leaves_none(store):
    _, session = new_session(Limits, ALICE, NOW)
    await store.create_session(session)
    await store.end_session(session.session_hash)
    assert await step_up_session(store, session, ("pwd", "otp"), ACR_MFA, NOW + 5) is None
    assert await store.list_user_sessions(ALICE, NOW + 5) == []


@pytest_twisted.ensureDeferred
async def test_a_code_issued_as_its_session_ends_is_refused(tmp_path, monkeypatch):
    """
    The session ends after the authorization request found it live and
    before its code is stored: the end's back-channel logout could not name
    the code's client, so the code is refused and the browser is signed out.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        browser, _ = await signed_in(h)
        save_code = h.store.save_code

        async def ended_first(code, grant, stored_client=True):
            await h.store.end_user_sessions(grant.sub)
            return await save_code(code, grant, stored_client)

        h.store.save_code = ended_first
        response, body = await browser.get(h.authorize_url())
        assert response.code == 400 and b"Signed out" in body, (response.code, location(response))
        assert [g.client_id for g in await h.store.list_user_grants(SIGNED_IN.sub, h.now())] == ["first"]
    finally:
        await h.close()
