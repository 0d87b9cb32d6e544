"""
The store conformance tests of second factors (L{authsrv.interfaces.IFactorStore})
and of how sessions, codes, grants and interactions record the way a user
authenticated. L{authsrv.testing.store.StoreConformance} and
L{authsrv.testing.store.StoreConcurrencyConformance} include them; they use
those classes' C{store()} and C{store_pair()}.
"""

from __future__ import annotations

import attrs
import pytest_twisted
from twisted.internet.defer import gatherResults

from authsrv.records import (
    ACR_MFA,
    MFA_STAGE,
    RECOVERY_FACTOR,
    TOTP_FACTOR,
    BrowserSession,
    Client,
    Factor,
    TotpFactor,
)

NOW = 1_700_000_000
ALICE = "3f0c2a52-alice"
BOB = "3f0c2a52-bob"
SEALED = b"\x00sealed-totp-secret\xff"
STEP = NOW // 30
MFA_AMR = ("pwd", "otp", "mfa")


def code_hashes(label: str, count: int = 10) -> list[str]:
    return [f"{label}-{n:02d}-" + "0" * 40 for n in range(count)]


class FactorStoreConformance:
    """Mixin of a store conformance class: factors and authentication contexts."""

    @pytest_twisted.ensureDeferred
    async def test_totp_enrolment_round_trip_and_replacement(self):
        async with self.store() as store:
            assert await store.get_totp(ALICE) is None
            assert await store.enrol_totp(ALICE, SEALED, STEP, NOW) is None
            assert await store.get_totp(ALICE) == TotpFactor(ALICE, SEALED, NOW, STEP)
            assert await store.get_totp(BOB) is None
            await store.enrol_totp(ALICE, b"another", STEP + 100, NOW + 3000)
            assert await store.get_totp(ALICE) == TotpFactor(ALICE, b"another", NOW + 3000, STEP + 100)

    @pytest_twisted.ensureDeferred
    async def test_totp_step_is_used_once_and_never_an_older_one(self):
        async with self.store() as store:
            assert await store.use_totp_step(ALICE, STEP) is False
            await store.enrol_totp(ALICE, SEALED, STEP, NOW)
            assert await store.use_totp_step(ALICE, STEP) is False
            assert await store.use_totp_step(ALICE, STEP + 1) is True
            assert await store.use_totp_step(ALICE, STEP + 1) is False
            assert await store.use_totp_step(ALICE, STEP) is False
            assert await store.use_totp_step(ALICE, STEP + 3) is True
            assert (await store.get_totp(ALICE)).last_step == STEP + 3

    @pytest_twisted.ensureDeferred
    async def test_recovery_codes_are_used_once_and_replaced_as_a_set(self):
        first, second = code_hashes("a"), code_hashes("b")
        async with self.store() as store:
            assert await store.use_recovery_code(ALICE, first[0]) is False
            await store.replace_recovery_codes(ALICE, first, NOW)
            assert await store.use_recovery_code(BOB, first[0]) is False
            assert await store.use_recovery_code(ALICE, first[0]) is True
            assert await store.use_recovery_code(ALICE, first[0]) is False
            await store.replace_recovery_codes(ALICE, second, NOW + 60)
            assert await store.use_recovery_code(ALICE, first[1]) is False
            assert await store.use_recovery_code(ALICE, second[1]) is True

    @pytest_twisted.ensureDeferred
    async def test_factors_listed_and_reset(self):
        async with self.store() as store:
            assert await store.list_factors(ALICE) == []
            await store.enrol_totp(ALICE, SEALED, STEP, NOW)
            await store.replace_recovery_codes(ALICE, code_hashes("a"), NOW + 5)
            await store.use_recovery_code(ALICE, code_hashes("a")[3])
            await store.enrol_totp(BOB, SEALED, STEP, NOW)
            assert await store.list_factors(ALICE) == [
                Factor(TOTP_FACTOR, NOW), Factor(RECOVERY_FACTOR, NOW + 5, remaining=9),
            ]
            assert await store.mfa_demanded(ALICE, NOW) == NOW
            assert await store.reset_factors(ALICE) is True
            assert await store.reset_factors(ALICE) is False
            assert await store.list_factors(ALICE) == []
            assert await store.get_totp(ALICE) is None
            assert await store.list_factors(BOB) == [Factor(TOTP_FACTOR, NOW)]
            assert await store.mfa_demanded(ALICE, NOW + 99) == NOW + 99

    @pytest_twisted.ensureDeferred
    async def test_mfa_demand_keeps_the_first_time(self):
        async with self.store() as store:
            assert await store.mfa_demanded(ALICE, NOW) == NOW
            assert await store.mfa_demanded(ALICE, NOW + 500) == NOW
            assert await store.mfa_demanded(BOB, NOW + 7) == NOW + 7

    @pytest_twisted.ensureDeferred
    async def test_authentication_context_round_trips(self):
        from authsrv.testing.store import CLIENT, make_code, make_grant, make_interaction

        session = BrowserSession("hash-1", "sid-1", ALICE, NOW, NOW, NOW + 3600, amr=MFA_AMR, acr=ACR_MFA)
        plain = BrowserSession("hash-2", "sid-2", ALICE, NOW, NOW, NOW + 3600)
        grant = make_grant("g-mfa", amr=MFA_AMR, acr=ACR_MFA)
        code = attrs.evolve(make_code("code-mfa", grant), amr=MFA_AMR, acr=ACR_MFA)
        interaction = make_interaction("i-mfa", MFA_STAGE, sub=ALICE, amr=("pwd",), sid="sid-1")
        interaction = attrs.evolve(interaction, request=attrs.evolve(interaction.request,
                                                                      acr_values=(ACR_MFA, "urn:other")))
        client = Client(CLIENT, None, ["https://app.example/cb"], require_mfa=True)
        async with self.store() as store:
            await store.create_session(session)
            await store.create_session(plain)
            assert await store.get_session("hash-1", NOW) == session
            assert await store.get_session("hash-2", NOW) == plain
            await store.save_code(code, grant)
            assert await store.get_grant("g-mfa") == grant
            assert (await store.consume_code(code.code_hash, NOW)).code == code
            await store.save_interaction(interaction)
            assert await store.get_interaction("i-mfa", NOW) == interaction
            await store.add_client(client)
            assert await store.get_client(CLIENT) == client


class FactorConcurrencyConformance:
    """Mixin of a concurrency conformance class: racing uses of one code."""

    @pytest_twisted.ensureDeferred
    async def test_racing_totp_steps_and_recovery_codes(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                sub = f"user-{n}"
                await first.enrol_totp(sub, SEALED, STEP, NOW)
                await first.replace_recovery_codes(sub, code_hashes(sub), NOW)
                steps = await gatherResults([store.use_totp_step(sub, STEP + 1) for store in (first, second)])
                assert sorted(steps) == [False, True]
                uses = await gatherResults(
                    [store.use_recovery_code(sub, code_hashes(sub)[0]) for store in (second, first)]
                )
                assert sorted(uses) == [False, True]
