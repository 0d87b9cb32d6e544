"""
C{authsrv-admin user ...} and C{hash-password}: users of the first
configured identity backend that can write them (L{IUserManagement}),
through L{authsrv.operations.users} as the admin API (every new password
meets L{authsrv.protocol.password_policy}; the ones users have already
are left alone), and C{user reset-factors}, which works with any backend
since factors live in authsrv's own store.
"""

from __future__ import annotations

from attrs import asdict

from authsrv.admin.common import (
    ACTOR,
    AdminError,
    Console,
    config_of,
    plugin_context,
    read_password,
    with_user_operations,
)
from authsrv.flows.mfa import reset_factors
from authsrv.identity.passwords import DEFAULT_HASHER, hash_password, hasher_of
from authsrv.protocol.password_policy import MIN_LENGTH, password_problem
from authsrv.service import build_identity, build_plugin


async def hash_password_command(reactor, args, console: Console):
    password = read_password(args, console)
    problem = password_problem(password, min_length=config_of(args).password_min_length if args.config else MIN_LENGTH)
    if problem:
        raise AdminError(problem)
    console.out(hash_password(password, hasher_of(config_of(args)) if args.config else DEFAULT_HASHER))


async def user_add(reactor, args, console: Console):
    data = {"login": args.login, "sub": args.sub, "name": args.name, "email": args.email,
            "email_verified": args.email_verified, "picture": args.picture, "chat_user_id": args.chat_user_id}

    async def add(users):
        location = users.users_location
        await users.login_free(args.login)
        added = await users.create({**data, "password": read_password(args, console)}, actor=ACTOR)
        console.out(f"added user {added.login} (sub {added.sub}) to {location}")

    await with_user_operations(reactor, args, add)


async def user_passwd(reactor, args, console: Console):
    async def change(users):
        await users.find(args.login)  # before asking for a password, as add checks the login first
        await users.set_password(args.login, read_password(args, console), actor=ACTOR)
        console.out(f"password of {args.login} changed")

    await with_user_operations(reactor, args, change)


async def user_disable(reactor, args, console: Console):
    async def disable(users):
        _, ended = await users.set_disabled(args.login, True, reason=args.reason, actor=ACTOR)
        console.out(f"disabled {args.login}; {ended} browser sessions ended")

    await with_user_operations(reactor, args, disable)


async def user_enable(reactor, args, console: Console):
    async def enable(users):
        await users.set_disabled(args.login, False, actor=ACTOR)
        console.out(f"enabled {args.login}")

    await with_user_operations(reactor, args, enable)


async def user_remove(reactor, args, console: Console):
    async def remove(users):
        location = users.users_location
        await users.delete(args.login, actor=ACTOR)
        console.out(f"removed user {args.login} from {location}")

    await with_user_operations(reactor, args, remove)


async def user_list(reactor, args, console: Console):
    async def show(users):
        listed = await users.list_written()
        if args.json:
            console.out_json([asdict(u) for u in listed])
            return
        for user in listed:
            state = "disabled" if user.disabled else "enabled"
            console.out(f"{user.login}\t{user.sub}\t{state}\t{user.name or '-'}")

    await with_user_operations(reactor, args, show)


async def user_show(reactor, args, console: Console):
    async def show(users):
        user = await users.find(args.login)
        if args.json:
            console.out_json(asdict(user))
            return
        for key, value in asdict(user).items():
            console.out(f"{key + ':':<16} {'-' if value is None else value}")

    await with_user_operations(reactor, args, show)


async def user_reset_factors(reactor, args, console: Console):
    """Remove a user's second factors (a lost phone); named by id or login in any identity backend."""
    config = config_of(args)
    async with plugin_context(reactor, config) as context:
        identity = build_identity(config, context)
        store = build_plugin("store", config.store, context)
        try:
            user = await identity.user_by_id(args.user) or await identity.user_by_login(args.user)
            if user is None:
                raise AdminError(f"no user {args.user!r} (by id or login)")
            if await reset_factors(store, user.sub, actor=ACTOR):
                console.out(f"second factors of {user.login} (sub {user.sub}) removed; they enrol again at sign-in")
            else:
                console.out(f"{user.login} (sub {user.sub}) had no second factors")
        finally:
            await store.close()
            await identity.close()


LOGIN_HELP = "the name the user signs in with"
USER_HELP = "the user's id (sub) or login"


def register(commands) -> None:
    """Add C{user add|passwd|disable|enable|remove|list|show} and C{hash-password} to the top-level subparsers."""
    user = commands.add_parser("user", help="users of the static users file or of PostgreSQL").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    add = user.add_parser("add", help="add a user; asks for the password")
    add.add_argument("login", help=LOGIN_HELP)
    add.add_argument("--sub", help="stable user id (default: a random UUID)")
    add.add_argument("--name", help="shown to relying parties (the name claim)")
    add.add_argument("--email", help="the email claim")
    add.add_argument("--email-verified", action="store_true", help="the email address was verified")
    add.add_argument("--picture", help="http(s) URL of a picture, at most 2048 characters")
    add.add_argument("--chat-user-id", help="linked chat-platform user id")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.set_defaults(run=user_add)
    passwd = user.add_parser("passwd", help="set a user's password; asks for it")
    passwd.add_argument("login", help=USER_HELP)
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    passwd.set_defaults(run=user_passwd)
    disable = user.add_parser("disable", help="disable a user (counts as banned)")
    disable.add_argument("login", help=USER_HELP)
    disable.add_argument("--reason", required=True, help="reported as banReason")
    disable.set_defaults(run=user_disable)
    enable = user.add_parser("enable", help="enable a disabled user")
    enable.add_argument("login", help=USER_HELP)
    enable.set_defaults(run=user_enable)
    remove = user.add_parser("remove", help="remove a user and their password")
    remove.add_argument("login", help=USER_HELP)
    remove.set_defaults(run=user_remove)
    user.add_parser("list", help="list users, ordered by login").set_defaults(run=user_list)
    show = user.add_parser("show", help="show one user")
    show.add_argument("login", help=USER_HELP)
    show.set_defaults(run=user_show)
    reset = user.add_parser("reset-factors", help="remove a user's second factors (TOTP, recovery codes, passkeys)")
    reset.add_argument("user", help="the user's id or login")
    reset.set_defaults(run=user_reset_factors)

    hasher = commands.add_parser("hash-password", help="print an argon2id hash for a users file")
    hasher.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    hasher.set_defaults(run=hash_password_command)
