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
    Passkey,
    RECOVERY_FACTOR,
    TOTP_FACTOR,
    BrowserSession,
    Client,
    Factor,
    TotpFactor,
)
from authsrv.store.errors import AlreadyExists

NOW = 1_700_000_000
ALICE = "3f0c2a52-alice"
BOB = "3f0c2a52-bob"
SEALED = b"\x00sealed-totp-secret\xff"
STEP = NOW // 30
MFA_AMR = ("pwd", "otp", "mfa")


def passkey(credential_id: str, sub: str = ALICE, sign_count: int = 1, **changes) -> Passkey:
    fields = dict(public_key=b"\xa5\x01\x02cose-key\x00", backup_eligible=False, backup_state=False,
                  transports=("internal", "hybrid"), created_at=NOW)
    return Passkey(credential_id=credential_id, sub=sub, sign_count=sign_count, **{**fields, **changes})


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
        async with self.store(clients=()) as store:
            await store.add_client(client)
            await store.create_session(session)
            await store.create_session(plain)
            assert await store.get_session("hash-1", NOW) == session
            assert await store.get_session("hash-2", NOW) == plain
            await store.save_code(code, grant)
            assert await store.get_grant("g-mfa") == grant
            assert (await store.find_code(code.code_hash, NOW)).code == code
            await store.save_interaction(interaction)
            assert await store.get_interaction("i-mfa", NOW) == interaction
            assert await store.get_client(CLIENT) == client


    @pytest_twisted.ensureDeferred
    async def test_passkeys_round_trip_listed_and_removed(self):
        first, synced = passkey("cred-1"), passkey("cred-2", created_at=NOW + 5, backup_eligible=True,
                                                    backup_state=True, transports=())
        async with self.store() as store:
            assert await store.list_passkeys(ALICE) == []
            await store.add_passkey(synced)
            await store.add_passkey(first)
            await store.add_passkey(passkey("cred-bob", sub=BOB))
            try:
                await store.add_passkey(passkey("cred-1", sub=BOB))
                raise AssertionError("a second passkey with a known credential id was stored")
            except AlreadyExists:
                pass
            assert await store.get_passkey("cred-1") == first
            assert await store.get_passkey("cred-none") is None
            assert await store.list_passkeys(ALICE) == [first, synced]
            assert await store.remove_passkey(BOB, "cred-1") is False
            assert await store.remove_passkey(ALICE, "cred-1") is True
            assert await store.remove_passkey(ALICE, "cred-1") is False
            assert await store.list_passkeys(ALICE) == [synced]
            assert await store.reset_factors(ALICE) is True
            assert await store.list_passkeys(ALICE) == []
            assert await store.get_passkey("cred-bob") is not None

    @pytest_twisted.ensureDeferred
    async def test_passkey_counter_only_grows(self):
        async with self.store() as store:
            assert await store.use_passkey("cred-1", 5, False, NOW) is False
            await store.add_passkey(passkey("cred-1", sign_count=3))
            assert await store.use_passkey("cred-1", 3, False, NOW) is False
            assert await store.use_passkey("cred-1", 2, False, NOW) is False
            assert await store.use_passkey("cred-1", 4, True, NOW + 9) is True
            used = await store.get_passkey("cred-1")
            assert (used.sign_count, used.backup_state, used.last_used) == (4, True, NOW + 9)
            await store.add_passkey(passkey("cred-zero", sign_count=0))
            assert await store.use_passkey("cred-zero", 0, False, NOW) is True
            assert await store.use_passkey("cred-zero", 0, False, NOW + 1) is True

    @pytest_twisted.ensureDeferred
    async def test_session_device_and_last_seen(self):
        session = BrowserSession("hash-d", "sid-d", ALICE, NOW, NOW, NOW + 3600,
                                 user_agent="Mozilla/5.0 (X11; Linux x86_64) Firefox/130.0", address="192.0.2.7")
        async with self.store() as store:
            await store.create_session(session)
            assert await store.get_session("hash-d", NOW) == session
            await store.touch_session("hash-d", NOW + 120)
            await store.touch_session("hash-none", NOW + 120)
            assert await store.get_session("hash-d", NOW) == attrs.evolve(session, last_seen=NOW + 120)


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
                await first.add_passkey(passkey(f"cred-{n}", sub=sub))
                counted = await gatherResults([store.use_passkey(f"cred-{n}", 2, False, NOW) for store in (first, second)])
                assert sorted(counted) == [False, True]
