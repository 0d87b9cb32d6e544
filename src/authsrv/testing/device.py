"""
The store conformance tests of device authorization requests
(L{authsrv.interfaces.IDeviceAuthorizationStore}, RFC 8628).
L{authsrv.testing.store.StoreConformance} and
L{authsrv.testing.store.StoreConcurrencyConformance} include them; they use
those classes' C{store()} and C{store_pair()}.
"""

from __future__ import annotations

import attrs
import pytest_twisted
from twisted.internet.defer import gatherResults

from authsrv.records import (
    DEVICE_APPROVED,
    DEVICE_DENIED,
    DEVICE_PENDING,
    DEVICE_REDEEMED,
    POLL_APPROVED,
    POLL_DENIED,
    POLL_EXPIRED,
    POLL_PENDING,
    POLL_REDEEMED,
    POLL_REUSED,
    POLL_SLOW_DOWN,
    POLL_UNKNOWN,
    LOGIN_STAGE,
    AccessToken,
    AuthorizationRequest,
    Ban,
    DeviceAuthorization,
    DevicePoll,
    Grant,
    Interaction,
    RefreshToken,
)
from authsrv.store.errors import AlreadyExists
from authsrv.tokens import token_hash

NOW = 1_700_000_000
ALICE = "3f0c2a52-alice"
TV = "living-room-tv"
OTHER = "partner-app"
TTL = 600
SLOW_DOWN = 5


def device(label: str, client_id: str = TV, **changes) -> DeviceAuthorization:
    made = DeviceAuthorization(
        device_code_hash=token_hash("device-" + label), user_code_hash=token_hash("user-" + label),
        client_id=client_id, scope={"openid", "offline_access"}, resource=("https://api.example/",),
        created_at=NOW, expires_at=NOW + TTL, poll_interval=5,
    )
    return attrs.evolve(made, **changes)


def device_grant(grant_id: str, client_id: str = TV) -> Grant:
    return Grant(grant_id=grant_id, client_id=client_id, sub=ALICE, scope={"openid", "offline_access"},
                 resource=("https://api.example/",), auth_time=NOW, created_at=NOW, expires_at=NOW + 90 * 86400)


def device_access(label: str, grant: Grant) -> AccessToken:
    return AccessToken(token_hash=token_hash(label), grant_id=grant.grant_id, client_id=grant.client_id, sub=ALICE,
                       scope=grant.scope, audience=grant.resource, issued_at=NOW, expires_at=NOW + 3600)


def device_refresh(label: str, grant: Grant) -> RefreshToken:
    return RefreshToken(token_hash=token_hash(label), grant_id=grant.grant_id, client_id=grant.client_id, sub=ALICE,
                        scope=grant.scope, issued_at=NOW, expires_at=NOW + 30 * 86400)


async def approved(store, label: str = "a") -> tuple[DeviceAuthorization, Grant]:
    """A device request saved and approved by ALICE at NOW, with its grant C{g-<label>}."""
    tv = device(label)
    await store.save_device_authorization(tv)
    grant = device_grant(f"g-{label}")
    await store.decide_device_authorization(tv.user_code_hash, ALICE, grant, NOW)
    return tv, grant


class DeviceStoreConformance:
    """Mixin of a store conformance class: device authorization requests."""

    @pytest_twisted.ensureDeferred
    async def test_device_round_trip_by_user_code_until_expiry(self):
        async with self.store() as store:
            tv = device("a")
            assert await store.save_device_authorization(tv) is None
            assert await store.find_device_authorization(tv.user_code_hash, NOW) == tv
            assert await store.find_device_authorization(tv.user_code_hash, NOW + TTL - 1) == tv
            assert await store.find_device_authorization(tv.user_code_hash, NOW + TTL) is None
            assert await store.find_device_authorization(tv.device_code_hash, NOW) is None
            assert await store.find_device_authorization("user\x00code", NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_device_codes_and_user_codes_are_unique(self):
        async with self.store() as store:
            await store.save_device_authorization(device("a"))
            for clash in (attrs.evolve(device("b"), user_code_hash=device("a").user_code_hash),
                          attrs.evolve(device("b"), device_code_hash=device("a").device_code_hash)):
                try:
                    await store.save_device_authorization(clash)
                except AlreadyExists:
                    pass
                else:
                    raise AssertionError("a taken code hash was stored again")
            assert await store.find_device_authorization(device("b").user_code_hash, NOW) is None

    @pytest_twisted.ensureDeferred
    async def test_device_polls_pending_then_slow_down_raises_the_interval(self):
        async with self.store() as store:
            tv = device("a")
            await store.save_device_authorization(tv)
            first = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW)
            assert first == DevicePoll(POLL_PENDING, attrs.evolve(tv, polled_at=NOW))
            fast = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 4)
            assert fast == DevicePoll(POLL_SLOW_DOWN, attrs.evolve(tv, polled_at=NOW + 4, poll_interval=10))
            again = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 13)
            assert again.outcome == POLL_SLOW_DOWN and again.device.poll_interval == 15
            waited = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 28)
            assert waited == DevicePoll(POLL_PENDING, attrs.evolve(tv, polled_at=NOW + 28, poll_interval=15))
            assert (await store.find_device_authorization(tv.user_code_hash, NOW + 28)).poll_interval == 15

    @pytest_twisted.ensureDeferred
    async def test_device_approved_is_redeemed_once_with_its_tokens(self):
        async with self.store() as store:
            tv = device("a")
            await store.save_device_authorization(tv)
            grant = device_grant("g-a")
            assert await store.decide_device_authorization(tv.user_code_hash, ALICE, grant, NOW + 10) is True
            assert await store.get_grant("g-a") == grant
            approved = await store.find_device_authorization(tv.user_code_hash, NOW + 10)
            assert approved == attrs.evolve(tv, status=DEVICE_APPROVED, sub=ALICE, grant_id="g-a")
            assert await store.decide_device_authorization(tv.user_code_hash, ALICE, None, NOW + 11) is False
            for when in (NOW + 12, NOW + 13):
                assert await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, when) == \
                    DevicePoll(POLL_APPROVED, approved)
            access, refresh = device_access("access-a", grant), device_refresh("refresh-a", grant)
            assert await store.redeem_device_authorization(tv.device_code_hash, access, refresh, NOW + 14) == \
                POLL_REDEEMED
            assert await store.find_access_token(access.token_hash, NOW + 14) == access
            assert await store.get_refresh_token(refresh.token_hash) == refresh
            redeemed = attrs.evolve(approved, status=DEVICE_REDEEMED, polled_at=NOW + 14)
            assert await store.find_device_authorization(tv.user_code_hash, NOW + 14) == redeemed
            for when in (NOW + 15, NOW + TTL + 5):
                assert await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, when) == \
                    DevicePoll(POLL_REUSED, redeemed)

    @pytest_twisted.ensureDeferred
    async def test_device_redeemed_again_revokes_its_grant_and_stores_nothing(self):
        async with self.store() as store:
            tv, grant = await approved(store)
            first = device_access("access-1", grant)
            assert await store.redeem_device_authorization(tv.device_code_hash, first, None, NOW + 1) == POLL_REDEEMED
            again, refresh = device_access("access-2", grant), device_refresh("refresh-2", grant)
            assert await store.redeem_device_authorization(tv.device_code_hash, again, refresh, NOW + 2) == \
                POLL_REUSED
            assert (await store.get_grant("g-a")).revoked_at == NOW + 2
            for access in (first, again):
                assert await store.find_access_token(access.token_hash, NOW + 2) is None
            assert await store.get_refresh_token(refresh.token_hash) is None

    @pytest_twisted.ensureDeferred
    async def test_device_of_a_user_banned_after_approval_is_not_redeemed(self):
        """A ban stored after the poll that found the request approved: the redemption issues nothing."""
        async with self.store() as store:
            tv, grant = await approved(store)
            assert (await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 5)).outcome == \
                POLL_APPROVED
            await store.ban_user(Ban(ALICE, "spam", NOW))
            access, refresh = device_access("access-a", grant), device_refresh("refresh-a", grant)
            assert await store.redeem_device_authorization(tv.device_code_hash, access, refresh, NOW + 5) == \
                POLL_UNKNOWN
            assert await store.find_access_token(access.token_hash, NOW + 5) is None
            assert await store.get_refresh_token(refresh.token_hash) is None
            assert (await store.find_device_authorization(tv.user_code_hash, NOW + 5)).status == DEVICE_APPROVED

    @pytest_twisted.ensureDeferred
    async def test_device_not_redeemable_is_left_as_it_is(self):
        """Pending, denied, expired, of a revoked grant or unknown: nothing is redeemed, stored or revoked."""
        async with self.store() as store:
            pending, denied, late, revoked = device("p"), device("d"), device("l"), device("r")
            for tv in (pending, denied, late, revoked):
                await store.save_device_authorization(tv)
            await store.decide_device_authorization(denied.user_code_hash, ALICE, None, NOW)
            await store.decide_device_authorization(late.user_code_hash, ALICE, device_grant("g-l"), NOW)
            await store.decide_device_authorization(revoked.user_code_hash, ALICE, device_grant("g-r"), NOW)
            assert await store.revoke_grant("g-r", NOW + 1) is True
            cases = ((pending, NOW + 2), (denied, NOW + 2), (late, NOW + TTL), (revoked, NOW + 2))
            for n, (tv, when) in enumerate(cases):
                access = device_access(f"access-{n}", device_grant(tv.grant_id or "g-none"))
                assert await store.redeem_device_authorization(tv.device_code_hash, access, None, when) == \
                    POLL_UNKNOWN
                assert await store.find_access_token(access.token_hash, NOW + 2) is None
                assert (await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, when)).outcome \
                    != POLL_REUSED
            assert (await store.get_grant("g-l")).revoked_at is None
            assert await store.redeem_device_authorization(token_hash("unknown"), device_access("x", device_grant("g-l")),
                                                           None, NOW) == POLL_UNKNOWN
            assert await store.redeem_device_authorization("unknown\x00", device_access("y", device_grant("g-l")),
                                                           None, NOW) == POLL_UNKNOWN

    @pytest_twisted.ensureDeferred
    async def test_device_whose_tokens_fail_to_store_stays_approved(self):
        """The redemption and its tokens are one step: tokens that cannot be stored leave the code unused."""
        async with self.store() as store:
            tv, grant = await approved(store)
            taken = device_access("access-taken", grant)
            await store.issue_tokens(taken, None)
            try:
                await store.redeem_device_authorization(tv.device_code_hash, taken, None, NOW + 1)
            except AlreadyExists:
                pass
            else:
                raise AssertionError("an access token hash was stored twice")
            polled = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 2)
            assert polled.outcome == POLL_APPROVED
            access = device_access("access-a", grant)
            assert await store.redeem_device_authorization(tv.device_code_hash, access, None, NOW + 3) == POLL_REDEEMED

    @pytest_twisted.ensureDeferred
    async def test_device_of_a_removed_client_is_not_approved(self):
        async with self.store() as store:
            tv = device("a")
            await store.save_device_authorization(tv)
            assert await store.remove_client(TV) is True
            assert await store.decide_device_authorization(tv.user_code_hash, ALICE, device_grant("g-a"), NOW) is False
            assert await store.get_grant("g-a") is None
            assert await store.find_device_authorization(tv.user_code_hash, NOW) == tv
            polled = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 10)
            assert polled.outcome == POLL_PENDING

    @pytest_twisted.ensureDeferred
    async def test_device_denied_stays_denied(self):
        async with self.store() as store:
            tv = device("a")
            await store.save_device_authorization(tv)
            assert await store.decide_device_authorization(tv.user_code_hash, ALICE, None, NOW) is True
            denied = attrs.evolve(tv, status=DEVICE_DENIED, sub=ALICE)
            assert await store.find_device_authorization(tv.user_code_hash, NOW) == denied
            assert await store.decide_device_authorization(tv.user_code_hash, ALICE, device_grant("g"), NOW) is False
            assert await store.get_grant("g") is None
            for when in (NOW + 1, NOW + 100):
                assert await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, when) == \
                    DevicePoll(POLL_DENIED, denied)

    @pytest_twisted.ensureDeferred
    async def test_device_expired_cannot_be_decided_or_redeemed(self):
        async with self.store() as store:
            pending, approved = device("a"), device("b")
            await store.save_device_authorization(pending)
            await store.save_device_authorization(approved)
            await store.decide_device_authorization(approved.user_code_hash, ALICE, device_grant("g-b"), NOW)
            late = NOW + TTL
            assert await store.decide_device_authorization(pending.user_code_hash, ALICE, None, late) is False
            assert await store.decide_device_authorization(pending.user_code_hash, ALICE, device_grant("g-a"),
                                                           late) is False
            assert await store.get_grant("g-a") is None
            for tv in (pending, approved):
                polled = await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, late)
                assert polled.outcome == POLL_EXPIRED
                assert polled.device.status in (DEVICE_PENDING, DEVICE_APPROVED)

    @pytest_twisted.ensureDeferred
    async def test_device_code_of_another_client_is_unknown_and_untouched(self):
        async with self.store() as store:
            tv, _ = await approved(store)
            for client_id in (OTHER, "living-room-tv\x00"):
                assert await store.poll_device_authorization(tv.device_code_hash, client_id, SLOW_DOWN, NOW) == \
                    DevicePoll(POLL_UNKNOWN)
            assert await store.poll_device_authorization(token_hash("nope"), TV, SLOW_DOWN, NOW) == \
                DevicePoll(POLL_UNKNOWN)
            assert (await store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW)).outcome == \
                POLL_APPROVED

    @pytest_twisted.ensureDeferred
    async def test_interaction_for_the_verification_page_keeps_its_mark(self):
        request = AuthorizationRequest(TV, "https://id.example/api/auth/device?user_code=BCDF-GHJK", (), "", "",
                                       device=True)
        sign_in = Interaction(interaction_id="ia-device", stage=LOGIN_STAGE, request=request, csrf_token="c",
                              created_at=NOW, expires_at=NOW + 600, address="192.0.2.1")
        async with self.store() as store:
            await store.save_login_interaction(sign_in, 10)
            assert await store.get_interaction("ia-device", NOW) == sign_in
            assert (await store.get_interaction("ia-device", NOW)).request.device is True

    @pytest_twisted.ensureDeferred
    async def test_gc_removes_expired_device_requests(self):
        async with self.store() as store:
            old, young = device("old"), device("young", expires_at=NOW + 2 * TTL)
            await store.save_device_authorization(old)
            await store.save_device_authorization(young)
            await store.gc(NOW + TTL, 100)
            assert await store.poll_device_authorization(old.device_code_hash, TV, SLOW_DOWN, NOW + TTL) == \
                DevicePoll(POLL_UNKNOWN)
            assert await store.find_device_authorization(young.user_code_hash, NOW + TTL) == young
            await store.save_device_authorization(attrs.evolve(device("new"), user_code_hash=old.user_code_hash))


class DeviceConcurrencyConformance:
    """Mixin of a concurrency conformance class: racing decisions and polls."""

    @pytest_twisted.ensureDeferred
    async def test_racing_device_decisions_and_redemptions(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                tv = device(f"r{n}")
                await first.save_device_authorization(tv)
                decided = await gatherResults([
                    first.decide_device_authorization(tv.user_code_hash, ALICE, device_grant(f"g{n}"), NOW),
                    second.decide_device_authorization(tv.user_code_hash, ALICE, None, NOW),
                ])
                assert sorted(decided) == [False, True]
                polls = await gatherResults([
                    store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW + 1)
                    for store in (first, second)
                ])
                outcomes = sorted(poll.outcome for poll in polls)
                if not decided[0]:
                    assert outcomes == [POLL_DENIED, POLL_DENIED]
                    assert await first.get_grant(f"g{n}") is None
                    continue
                assert outcomes == [POLL_APPROVED, POLL_APPROVED]
                grant = device_grant(f"g{n}")
                tokens = [device_access(f"access-{n}-{side}", grant) for side in (1, 2)]
                redeemed = await gatherResults([
                    store.redeem_device_authorization(tv.device_code_hash, access,
                                                      device_refresh(f"refresh-{n}-{side}", grant), NOW + 2)
                    for side, store, access in ((1, first, tokens[0]), (2, second, tokens[1]))
                ])
                assert sorted(redeemed) == [POLL_REDEEMED, POLL_REUSED]
                # The loser revoked the grant: the winner's tokens are dead too.
                assert (await first.get_grant(f"g{n}")).revoked_at == NOW + 2
                for access in tokens:
                    assert await second.find_access_token(access.token_hash, NOW + 2) is None

    @pytest_twisted.ensureDeferred
    async def test_racing_polls_agree_on_the_interval(self):
        async with self.store_pair() as (first, second):
            for n in range(self.rounds):
                tv = device(f"p{n}")
                await first.save_device_authorization(tv)
                polls = await gatherResults([
                    store.poll_device_authorization(tv.device_code_hash, TV, SLOW_DOWN, NOW)
                    for store in (first, second)
                ])
                assert sorted(poll.outcome for poll in polls) == [POLL_PENDING, POLL_SLOW_DOWN]
                assert (await second.find_device_authorization(tv.user_code_hash, NOW)).poll_interval == 10
