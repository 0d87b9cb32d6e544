"""
Pre-link a demo user's chat account, as if they had linked it in the
browser: a long-lived provider token, encrypted with the config's chat key,
stored for the user. For the demo only (examples/demo.toml):

    .venv/bin/python examples/seed_chat_link.py --config examples/demo.toml alice

chat-token then answers 200 for that user at once. Running it again
replaces the link with a fresh token. A chat account linked to another user
stays theirs: the script says so and changes nothing.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.internet.task import react

from authsrv.chat.crypto import ACCESS, REFRESH, TokenCipher
from authsrv.config import ConfigFileError, load_config
from authsrv.context import PluginContext
from authsrv.records import LinkedAccount
from authsrv.service import build_identity, build_plugin
from authsrv.store.errors import AlreadyLinked

YEAR = 365 * 86400
SCOPE = "identify guilds.join"


async def seed(reactor, config_path: Path, login: str) -> None:
    config = load_config(config_path)
    if config.chat is None:
        raise SystemExit(f"{config_path}: no [chat] section, so nothing to link")
    context = PluginContext(reactor, config.base_dir, config.limits.max_token_lifetime)
    identity = build_identity(config, context)
    store = build_plugin("store", config.store, context)
    try:
        user = await identity.user_by_login(login) or await identity.user_by_id(login)
        if user is None or not user.chat_user_id:
            raise SystemExit(f"{login}: no such user, or the users file names no chat_user_id for them")
        now = int(reactor.seconds())
        account_id = secrets.token_hex(8)
        cipher = TokenCipher(config.chat.encryption_key)
        try:
            await store.link_account(LinkedAccount(
                account_id=account_id, sub=user.sub, provider=config.chat.provider,
                provider_user_id=user.chat_user_id,
                access_token_enc=cipher.encrypt("demo-" + secrets.token_urlsafe(24), account_id, ACCESS),
                refresh_token_enc=cipher.encrypt("demo-" + secrets.token_urlsafe(24), account_id, REFRESH),
                scope=SCOPE, expires_at=now + YEAR, updated_at=now,
            ))
        except AlreadyLinked:
            raise SystemExit(f"{login}: chat user {user.chat_user_id} is already linked to another user; unlink it"
                             f" there first (account page), nothing changed") from None
        print(f"linked {user.login} (sub {user.sub}) to chat user {user.chat_user_id}")
    finally:
        await store.close()
        await identity.close()
        context.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("user", help="the demo user's login or id")
    args = parser.parse_args()
    try:
        react(lambda reactor: Deferred.fromCoroutine(seed(reactor, args.config, args.user)))
    except ConfigFileError as e:
        sys.exit(f"seed_chat_link: {e}")


if __name__ == "__main__":
    main()
