"""C{authsrv-admin client ...}: relying parties kept in the store."""

from __future__ import annotations

from attrs import asdict
from twisted.internet.defer import Deferred

from authsrv import events
from authsrv.admin.common import ACTOR, AdminError, Console, with_plugin
from authsrv.config import Config
from authsrv.flows.backchannel import ATTEMPT_TIMEOUT, RefusedTarget, pinned_address, resolve_host
from authsrv.protocol.clients import client_id_problem, redirect_uri_problem
from authsrv.protocol.targets import backchannel_uri_problem
from authsrv.records import Client
from authsrv.store.errors import AlreadyExists
from authsrv.tokens import CLIENT_SECRET_KEY, client_secret_hash, new_token


def _check_uris(option: str, uris: list[str]) -> None:
    for uri in uris:
        problem = redirect_uri_problem(uri)
        if problem:
            raise AdminError(f"{option}: {problem}")


async def _check_backchannel_uri(reactor, uri: str) -> None:
    """
    Refuse a back-channel logout URI whose host is or now resolves to an
    address the server must not reach; a name that does not resolve yet
    passes (every delivery checks it again).
    """
    problem = backchannel_uri_problem(uri)
    if problem:
        raise AdminError(f"--backchannel-logout-uri: {problem}")
    resolving = Deferred.fromCoroutine(pinned_address(lambda host: resolve_host(reactor, host), uri))
    try:
        await resolving.addTimeout(ATTEMPT_TIMEOUT, reactor)
    except RefusedTarget as e:
        raise AdminError(f"--backchannel-logout-uri: {uri!r} is refused: {e}") from None
    except Exception:
        return


def _client_dict(client: Client) -> dict:
    data = asdict(client, recurse=True)
    data["type"] = "public" if client.is_public else "confidential"
    del data["secret_hash"]
    for key in ("redirect_uris", "post_logout_redirect_uris", "resources"):
        data[key] = list(data[key])
    return data


def _print_client(client: Client, console: Console) -> None:
    for key, value in _client_dict(client).items():
        if isinstance(value, list):
            value = " ".join(value) or "-"
        console.out(f"{key + ':':<27} {value}")


def _declared(config: Config, client_id: str) -> bool:
    return any(c.client_id == client_id for c in config.clients)


async def client_add(reactor, args, console: Console):
    problem = client_id_problem(args.client_id)
    if problem:
        raise AdminError(f"client id {problem}")
    _check_uris("--redirect-uri", args.redirect_uri)
    _check_uris("--post-logout-redirect-uri", args.post_logout_redirect_uri)
    if args.backchannel_logout_uri:
        await _check_backchannel_uri(reactor, args.backchannel_logout_uri)
    if args.post_logout_redirect_uri and not args.end_session:
        raise AdminError("--post-logout-redirect-uri needs --end-session")
    secret = None if args.public else new_token(32)

    async def add(config, store):
        if _declared(config, args.client_id):
            raise AdminError(f"client {args.client_id!r} is declared in {config.path}; edit it there")
        key = await store.server_key(CLIENT_SECRET_KEY) if secret else b""
        client = Client(
            client_id=args.client_id,
            secret_hash=client_secret_hash(secret, key) if secret else None,
            name=args.name or args.client_id,
            redirect_uris=args.redirect_uri,
            post_logout_redirect_uris=args.post_logout_redirect_uri,
            end_session_enabled=args.end_session,
            first_party=args.first_party,
            resources=args.resource,
            introspect_any=args.introspect_any,
            backchannel_logout_uri=args.backchannel_logout_uri,
            created_at=int(reactor.seconds()),
        )
        try:
            await store.add_client(client)
        except AlreadyExists:
            raise AdminError(f"client {args.client_id!r} exists already") from None
        events.client_created(client_id=client.client_id, source=client.source, actor=ACTOR)
        _print_client(client, console)

    await with_plugin(reactor, args, "store", add)
    if secret:
        console.out(f"client_secret:              {secret}")
        console.err("Keep the secret now: only its hash is stored, it cannot be shown again.")


async def client_list(reactor, args, console: Console):
    async def show(config, store):
        clients = await store.list_clients()
        if args.json:
            console.out_json([_client_dict(c) for c in clients])
            return
        for client in clients:
            kind = "public" if client.is_public else "confidential"
            flags = [f for f, on in (("first-party", client.first_party),
                                     ("end-session", client.end_session_enabled),
                                     ("introspect-any", client.introspect_any)) if on]
            console.out(f"{client.client_id}\t{kind}\t{','.join(flags) or '-'}\t{client.name}")

    await with_plugin(reactor, args, "store", show)


async def _get_client(store, client_id: str) -> Client:
    client = await store.get_client(client_id)
    if client is None:
        raise AdminError(f"no client {client_id!r}")
    return client


async def client_show(reactor, args, console: Console):
    async def show(config, store):
        client = await _get_client(store, args.client_id)
        if args.json:
            console.out_json(_client_dict(client))
        else:
            _print_client(client, console)

    await with_plugin(reactor, args, "store", show)


async def client_remove(reactor, args, console: Console):
    async def remove(config, store):
        if _declared(config, args.client_id):
            raise AdminError(f"client {args.client_id!r} is declared in {config.path}; remove it there")
        if not await store.remove_client(args.client_id):
            raise AdminError(f"no client {args.client_id!r}")
        events.client_deleted(client_id=args.client_id, source="operator", actor=ACTOR)
        console.out(f"removed client {args.client_id}")

    await with_plugin(reactor, args, "store", remove)


def register(commands) -> None:
    """Add C{client add|list|show|remove} to the top-level subparsers."""
    client = commands.add_parser("client", help="provision relying parties").add_subparsers(
        dest="client_command", required=True, metavar="ACTION"
    )
    add = client.add_parser("add", help="add a client; prints a generated secret once")
    add.add_argument("client_id")
    add.add_argument("--public", action="store_true", help="no secret: a browser or native app (PKCE only)")
    add.add_argument("--name", help="shown on the consent page")
    add.add_argument("--redirect-uri", action="append", required=True, help="repeat for several")
    add.add_argument("--post-logout-redirect-uri", action="append", default=[])
    add.add_argument("--end-session", action="store_true", help="allow RP-initiated logout")
    add.add_argument("--first-party", action="store_true", help="skip the consent page")
    add.add_argument("--resource", action="append", default=[], help="an audience it may request (RFC 8707)")
    add.add_argument("--introspect-any", action="store_true", help="a resource server that may introspect any token")
    add.add_argument("--backchannel-logout-uri")
    add.set_defaults(run=client_add)
    listing = client.add_parser("list", help="list clients")
    listing.set_defaults(run=client_list)
    show = client.add_parser("show", help="show one client")
    show.add_argument("client_id")
    show.set_defaults(run=client_show)
    remove = client.add_parser("remove", help="remove a client")
    remove.add_argument("client_id")
    remove.set_defaults(run=client_remove)
