"""
C{authsrv-admin ban|unban|revoke|bans}: the operator's actions on a user,
done by L{authsrv.operations.users} as the admin API does them; this module
parses and words them.
"""

from __future__ import annotations

from attrs import asdict

from authsrv.admin.common import ACTOR, AdminError, Console, with_user_operations
from authsrv.configsection import parse_duration
from authsrv.isotime import iso_utc
from authsrv.operations.users import parse_until



def _until(args, now: int) -> int | None:
    """The end of a ban from --until (ISO 8601, checked by the operation) or --for (a duration)."""
    if args.until and args.for_:
        raise AdminError("give --until or --for, not both")
    if args.for_:
        try:
            return now + parse_duration(args.for_)
        except ValueError:
            raise AdminError(f"--for {args.for_!r} is not a duration such as 12h or 7d") from None
    return parse_until(args.until, now, "--until") if args.until else None


async def _with_users(reactor, args, act):
    """C{act(operations, now)} with the user operations over every configured plugin."""
    return await with_user_operations(reactor, args, lambda users: act(users, int(reactor.seconds())))


async def ban(reactor, args, console: Console):
    async def act(users, now):
        banned = await users.ban(args.user, reason=args.reason, until=_until(args, now), actor=ACTOR)
        console.out(f"banned {banned.sub}" + (f" until {iso_utc(banned.until)}" if banned.until else "")
                    + f"; {banned.sessions_ended} browser sessions ended")

    await _with_users(reactor, args, act)


async def unban(reactor, args, console: Console):
    async def act(users, now):
        console.out(f"unbanned {await users.unban(args.user, actor=ACTOR)}")

    await _with_users(reactor, args, act)


async def revoke(reactor, args, console: Console):
    async def act(users, now):
        revoked = await users.revoke_grants(args.user, actor=ACTOR)
        console.out(f"revoked {revoked.grants} grants of {revoked.sub}; {revoked.sessions_ended} browser sessions ended")

    await _with_users(reactor, args, act)


async def bans_list(reactor, args, console: Console):
    async def act(users, now):
        entries, cursor = [], None
        while True:
            page = await users.bans(100, cursor)
            entries.extend(page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        if args.json:
            console.out_json([asdict(entry) for entry in entries])
            return
        for entry in entries:
            until = iso_utc(entry.until) if entry.until else "-"
            console.out(f"{entry.sub}\t{until}\t{entry.reason or '-'}")

    await _with_users(reactor, args, act)


def register(commands) -> None:
    """Add C{ban}, C{unban}, C{revoke} and C{bans} to the top-level subparsers."""
    for name, run, help_text in (
        ("ban", ban, "ban a user everywhere at once (ends their browser sessions)"),
        ("unban", unban, "lift a user's ban"),
        ("revoke", revoke, "revoke all of a user's grants and end their browser sessions"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("user", help="the user's id (sub) or login")
        if name == "ban":
            command.add_argument("--reason", required=True, help="reported as banReason")
            command.add_argument("--until", help="an ISO 8601 time, e.g. 2030-01-31T12:00:00Z")
            command.add_argument("--for", dest="for_", metavar="DURATION", help="e.g. 12h or 7d")
        command.set_defaults(run=run)
    commands.add_parser("bans", help="list the bans in force").set_defaults(run=bans_list)
