"""
C{authsrv-admin ban|unban|revoke|bans}: the operator's actions on a user,
done by L{authsrv.flows.moderation}; this module parses and words them.
"""

from __future__ import annotations

from datetime import datetime

from attrs import asdict

from authsrv.admin.common import ACTOR, AdminError, Console, config_of, plugin_context, with_plugin
from authsrv.configsection import parse_duration
from authsrv.flows import backchannel, moderation
from authsrv.isotime import iso_utc
from authsrv.service import build_identity, build_plugin

"""Who the audit events name as the actor."""


def _until(args, now: int) -> int | None:
    """The end of a ban from --until (ISO 8601) or --for (a duration)."""
    if args.until and args.for_:
        raise AdminError("give --until or --for, not both")
    if args.for_:
        try:
            return now + parse_duration(args.for_)
        except ValueError:
            raise AdminError(f"--for {args.for_!r} is not a duration such as 12h or 7d") from None
    if args.until:
        try:
            moment = datetime.fromisoformat(args.until.replace("Z", "+00:00"))
        except ValueError:
            raise AdminError(f"--until {args.until!r} is not an ISO 8601 time such as 2030-01-31T12:00:00Z") from None
        if moment.tzinfo is None:
            raise AdminError("--until needs a time zone, e.g. 2030-01-31T12:00:00Z")
        until = int(moment.timestamp())
        if until <= now:
            raise AdminError("--until is in the past")
        return until
    return None


async def _with_user(reactor, args, act):
    """
    Run C{act(store, sub, now, notify)} for the user named by id or login;
    C{notify(session)} sends the back-channel logouts of an ended session
    from this process, and the command waits for them (bounded retries).
    """
    config = config_of(args)
    async with plugin_context(reactor, config) as context:
        identity = build_identity(config, context)
        store = build_plugin("store", config.store, context)
        keystore = build_plugin("keystore", config.keystore, context)
        notifier = backchannel.BackchannelNotifier(reactor, backchannel.default_http_client(reactor))

        def notify(session):
            return notifier.session_ended(store, keystore, config.issuer, session)

        try:
            user = await identity.user_by_id(args.user) or await identity.user_by_login(args.user)
            if user is None:
                raise AdminError(f"no user {args.user!r} (by id or login)")
            await act(store, user.sub, int(reactor.seconds()), notify)
        finally:
            await store.close()
            await identity.close()


async def ban(reactor, args, console: Console):
    async def act(store, sub, now, notify):
        banned = await moderation.ban_user(
            store, sub, reason=args.reason, until=_until(args, now), now=now, by=ACTOR, notify=notify
        )
        console.out(f"banned {sub}" + (f" until {iso_utc(banned.until)}" if banned.until else "")
                    + f"; {banned.sessions_ended} browser sessions ended")

    await _with_user(reactor, args, act)


async def unban(reactor, args, console: Console):
    async def act(store, sub, now, notify):
        if not await moderation.unban_user(store, sub, by=ACTOR):
            raise AdminError(f"{sub} is not banned")
        console.out(f"unbanned {sub}")

    await _with_user(reactor, args, act)


async def revoke(reactor, args, console: Console):
    async def act(store, sub, now, notify):
        revoked = await moderation.revoke_user(store, sub, now=now, by=ACTOR, notify=notify)
        console.out(f"revoked {revoked.grants} grants of {sub}; {revoked.sessions_ended} browser sessions ended")

    await _with_user(reactor, args, act)


async def bans_list(reactor, args, console: Console):
    async def show(config, store):
        entries = await store.list_bans(int(reactor.seconds()))
        if args.json:
            console.out_json([asdict(entry) for entry in entries])
            return
        for entry in entries:
            until = iso_utc(entry.until) if entry.until else "-"
            console.out(f"{entry.sub}\t{until}\t{entry.reason or '-'}")

    await with_plugin(reactor, args, "store", show)


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
