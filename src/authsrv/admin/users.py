"""
C{authsrv-admin user ...} and C{hash-password}: users of the first
configured identity backend that can write them (L{IUserManagement}),
through L{authsrv.operations.users} as the admin API.
"""

from __future__ import annotations

from authsrv.admin.common import Console, read_password, with_plugins
from authsrv.identity.passwords import hash_password
from authsrv.service import user_operations

BY = "operator"
"""Who the audit events name as the actor."""


async def _with_users(reactor, args, act):
    """C{act(operations)} with the user operations over every configured plugin."""

    async def use(config, context, store, keystore, identity):
        return await act(user_operations(config, reactor, store, keystore, identity, context))

    return await with_plugins(reactor, args, use)


async def hash_password_command(reactor, args, console: Console):
    console.out(hash_password(read_password(args, console)))


async def user_add(reactor, args, console: Console):
    data = {"login": args.login, "sub": args.sub, "name": args.name, "email": args.email,
            "email_verified": args.email_verified, "picture": args.picture, "chat_user_id": args.chat_user_id}

    async def add(users):
        location = users.users_location
        added = await users.create({**data, "password": read_password(args, console)}, actor=BY)
        console.out(f"added user {added.login} (sub {added.sub}) to {location}")

    await _with_users(reactor, args, add)


async def user_passwd(reactor, args, console: Console):
    async def change(users):
        await users.set_password(args.login, read_password(args, console), actor=BY)
        console.out(f"password of {args.login} changed")

    await _with_users(reactor, args, change)


async def user_disable(reactor, args, console: Console):
    async def disable(users):
        await users.set_disabled(args.login, True, reason=args.reason, actor=BY)
        console.out(f"disabled {args.login}")

    await _with_users(reactor, args, disable)


async def user_enable(reactor, args, console: Console):
    async def enable(users):
        await users.set_disabled(args.login, False, actor=BY)
        console.out(f"enabled {args.login}")

    await _with_users(reactor, args, enable)


def register(commands) -> None:
    """Add C{user add|passwd|disable|enable} and C{hash-password} to the top-level subparsers."""
    user = commands.add_parser("user", help="users of the static users file or of PostgreSQL").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    add = user.add_parser("add", help="add a user; asks for the password")
    add.add_argument("login")
    add.add_argument("--sub", help="stable user id (default: a random UUID)")
    add.add_argument("--name")
    add.add_argument("--email")
    add.add_argument("--email-verified", action="store_true")
    add.add_argument("--picture", help="URL of a picture")
    add.add_argument("--chat-user-id", help="linked chat-platform user id")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.set_defaults(run=user_add)
    passwd = user.add_parser("passwd", help="set a user's password; asks for it")
    passwd.add_argument("login")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    passwd.set_defaults(run=user_passwd)
    disable = user.add_parser("disable", help="disable a user (counts as banned)")
    disable.add_argument("login")
    disable.add_argument("--reason", required=True, help="reported as banReason")
    disable.set_defaults(run=user_disable)
    enable = user.add_parser("enable", help="enable a disabled user")
    enable.add_argument("login")
    enable.set_defaults(run=user_enable)

    hasher = commands.add_parser("hash-password", help="print an argon2id hash for a users file")
    hasher.add_argument("--password-stdin", action="store_true")
    hasher.set_defaults(run=hash_password_command)
