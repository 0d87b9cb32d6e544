"""
The chat_user_id claim follows the account linked at this service, and falls
back to the one the identity backend knows.
"""

from __future__ import annotations

import pytest_twisted

from authsrv.chat.crypto import ACCESS, new_key_text
from authsrv.records import LinkedAccount
from authsrv.testing.identity import ALICE, BOB

from harness import Harness
from token_helpers import tokens, verify_jwt


async def userinfo(h, access_token):
    return (await h.json("GET", "/api/auth/oauth2/userinfo", headers={"Authorization": f"Bearer {access_token}"}))[1]


@pytest_twisted.ensureDeferred
async def test_linked_account_names_the_chat_user(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTHSRV_TEST_CHAT_KEY", new_key_text())
    h = await Harness(tmp_path, monkeypatch, {"chat": {"encryption_key_env": "AUTHSRV_TEST_CHAT_KEY"}}).start()
    try:
        bob = await tokens(h, sub=BOB.sub)
        assert "chat_user_id" not in verify_jwt(h, bob["id_token"])[1]
        assert "chat_user_id" not in await userinfo(h, bob["access_token"])
        await h.store.link_account(LinkedAccount(
            account_id="acct-bob", sub=BOB.sub, provider="discord", provider_user_id="555000111",
            access_token_enc=h.chat_cipher.encrypt("x", "acct-bob", ACCESS), refresh_token_enc=None,
            scope="identify", expires_at=h.now() + 60, updated_at=h.now(),
        ))
        assert (await userinfo(h, bob["access_token"]))["chat_user_id"] == "555000111"
        bob = await tokens(h, sub=BOB.sub)
        assert verify_jwt(h, bob["id_token"])[1]["chat_user_id"] == "555000111"
        alice = await tokens(h, sub=ALICE.sub)
        assert (await userinfo(h, alice["access_token"]))["chat_user_id"] == ALICE.chat_user_id
    finally:
        await h.close()
