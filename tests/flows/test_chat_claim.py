"""
The chat_user_id claim follows the account linked at this service, at once
when it is linked again or unlinked, and falls back to the one the identity
backend knows.
"""

from __future__ import annotations

import pytest_twisted

from authsrv.chat.crypto import ACCESS, new_key_text
from authsrv.records import LinkedAccount
from authsrv.testing.identity import ALICE, BOB

from harness import Harness
from token_helpers import refresh, tokens, verify_jwt


async def userinfo(h, access_token):
    return (await h.json("GET", "/api/auth/oauth2/userinfo", headers={"Authorization": f"Bearer {access_token}"}))[1]


async def link(h, sub, account_id, provider_user_id):
    await h.store.link_account(LinkedAccount(
        account_id=account_id, sub=sub, provider="discord", provider_user_id=provider_user_id,
        access_token_enc=h.chat_cipher.encrypt("x", account_id, ACCESS), refresh_token_enc=None,
        scope="identify", expires_at=h.now() + 60, updated_at=h.now(),
    ))


@pytest_twisted.ensureDeferred
async def test_linked_account_names_the_chat_user(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTHSRV_TEST_CHAT_KEY", new_key_text())
    h = await Harness(tmp_path, monkeypatch, {"chat": {"encryption_key_env": "AUTHSRV_TEST_CHAT_KEY"}}).start()
    try:
        bob = await tokens(h, sub=BOB.sub)
        assert "chat_user_id" not in verify_jwt(h, bob["id_token"])[1]
        assert "chat_user_id" not in await userinfo(h, bob["access_token"])
        await link(h, BOB.sub, "acct-bob", "555000111")
        assert (await userinfo(h, bob["access_token"]))["chat_user_id"] == "555000111"
        bob = await tokens(h, sub=BOB.sub)
        assert verify_jwt(h, bob["id_token"])[1]["chat_user_id"] == "555000111"
        alice = await tokens(h, sub=ALICE.sub)
        assert (await userinfo(h, alice["access_token"]))["chat_user_id"] == ALICE.chat_user_id

        await link(h, BOB.sub, "acct-bob-2", "555000222")
        assert (await userinfo(h, bob["access_token"]))["chat_user_id"] == "555000222"
        _, rotated = await refresh(h, bob["refresh_token"])
        assert verify_jwt(h, rotated["id_token"])[1]["chat_user_id"] == "555000222"
        assert await h.store.unlink_account(BOB.sub, "discord")
        assert "chat_user_id" not in await userinfo(h, rotated["access_token"])
        _, rotated = await refresh(h, rotated["refresh_token"])
        assert "chat_user_id" not in verify_jwt(h, rotated["id_token"])[1]
    finally:
        await h.close()
