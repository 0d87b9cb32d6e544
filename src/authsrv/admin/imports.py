"""
C{authsrv-admin import better-auth}: bring a Better Auth deployment's users,
bans, Discord links, clients, consents and live refresh tokens into this
server's store and identity backend (L{authsrv.operations.better_auth} does
the work; this module parses and words it). Progress goes to standard error,
the report to standard output.
"""

from __future__ import annotations

from twisted.internet.threads import deferToThreadPool

from authsrv.admin.common import ACTOR, AdminError, AdminUnavailable, Console, with_plugins
from authsrv.chat.crypto import TokenCipher
from authsrv.identity.postgres import BETTER_AUTH_PROVIDER
from authsrv.operations.better_auth import (
    Offer,
    SourceError,
    SourceUnavailable,
    import_better_auth,
    read_source,
)


async def better_auth(reactor, args, console: Console):
    def progress(line: str) -> None:
        console.err(f"import: {line}")

    async def use(config, context, store, keystore, identity):
        now = int(reactor.seconds())
        provider = config.link_provider or BETTER_AUTH_PROVIDER
        pool = context.threadpool("import", 1)
        try:
            source = await deferToThreadPool(reactor, pool, read_source, args.dsn, provider, now, progress)
        except SourceUnavailable as e:
            raise AdminUnavailable(f"{e} (try again once it answers)") from None
        except SourceError as e:
            raise AdminError(str(e)) from None
        cipher = TokenCipher(config.chat.encryption_key) if config.chat else None
        return await import_better_auth(
            source, store=store, identity=identity, cipher=cipher, provider=provider, now=now,
            dry_run=args.dry_run, progress=progress, actor=ACTOR,
            offer=Offer(dpop=config.dpop is not None, fetching=config.remote_documents),
        )

    report = await with_plugins(reactor, args, use)
    if args.json:
        console.out_json({"dry_run": args.dry_run, "found": report.found, "written": report.written,
                          "problems": list(report.problems)})
        return
    verb = "would import" if args.dry_run else "imported"
    for kind, found in report.found.items():
        written = "" if args.dry_run else f" ({report.written[kind]} new)"
        console.out(f"{verb} {found} {kind.replace('_', ' ')}{written}")
    if report.users_location and not args.dry_run:
        console.out(f"users written to {report.users_location}")
    for problem in report.problems:
        console.out(f"problem: {problem}")


def register(commands) -> None:
    """Add C{import better-auth} to the top-level subparsers."""
    group = commands.add_parser("import", help="bring users and grants over from another server")
    sources = group.add_subparsers(dest="source", required=True, metavar="SOURCE")
    command = sources.add_parser(
        "better-auth", help="import a Better Auth database (PostgreSQL): users, bans, Discord links, clients,"
        " consents, live refresh tokens",
    )
    command.add_argument("--dsn", required=True,
                         help="the Better Auth database, as a libpq DSN or URL (a password is better kept in"
                              " PGPASSWORD or ~/.pgpass than on the command line)")
    command.add_argument("--dry-run", action="store_true", help="report what would be imported; write nothing")
    command.set_defaults(run=better_auth)
