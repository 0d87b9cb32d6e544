"""
C{authsrv-admin client ...}: relying parties kept in the store, through
L{authsrv.operations.clients} as the admin API; this module turns options
into settings and words the results.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from authsrv.admin.common import ACTOR, AdminError, Console, with_plugin
from authsrv.configsection import parse_duration
from authsrv.isotime import iso_utc
from authsrv.operations.clients import DEFAULT_OVERLAP
from authsrv.operations.errors import OperationError
from authsrv.operations.views import client_view
from authsrv.protocol.profiles import PROFILES
from authsrv.protocol.signing import ALGORITHMS
from authsrv.protocol.clientauth import AUTH_METHODS
from authsrv.records import Client
from authsrv.service import client_operations


OPTIONS = {
    "post_logout_redirect_uris": "--post-logout-redirect-uri",
    "redirect_uris": "--redirect-uri",
    "backchannel_logout_uri": "--backchannel-logout-uri",
    "end_session_enabled": "--end-session",
    "first_party": "--first-party",
    "introspect_any": "--introspect-any",
    "resources": "--resource",
    "audiences": "--audience",
    "grant_types": "--grant-type",
    "refresh_grace": "--refresh-grace",
    "rate_limit": "--rate-limit",
    "require_mfa": "--require-mfa",
    "require_pushed_authorization_requests": "--require-par",
    "dpop_bound_access_tokens": "--require-dpop",
    "profile": "--profile",
    "id_token_signed_response_alg": "--id-token-alg",
    "access_token_signed_response_alg": "--access-token-alg",
    "userinfo_signed_response_alg": "--userinfo-alg",
    "token_endpoint_auth_method": "--auth-method",
    "jwks_uri": "--jwks-uri",
    "jwks": "--jwks",
    "scopes": "--scope",
    "client_id": "client id",
}
"""Each setting's option, which the operator's messages name instead of the field."""
CLEARABLE = ("post-logout-redirect-uris", "backchannel-logout-uri", "resources", "audiences", "refresh-grace",
             "rate-limit", "profile", "userinfo-alg", "jwks", "jwks-uri", "scopes")
NULLABLE = ("backchannel_logout_uri", "refresh_grace", "rate_limit", "profile", "userinfo_signed_response_alg", "jwks",
            "jwks_uri")


def _worded(error: OperationError) -> AdminError:
    """The operation's message in the command's words: options for fields, and no JSON null (--clear is that)."""
    message = error.message.replace(", or null", "")
    for field, option in OPTIONS.items():
        message = re.sub(rf"\b{field}\b", option, message)
    return AdminError(message)


def _print_client(client: Client, console: Console) -> None:
    for key, value in client_view(client).items():
        if isinstance(value, list):
            value = " ".join(value) or "-"
        elif isinstance(value, dict):
            value = json.dumps(value)
        console.out(f"{key + ':':<27} {value}")


async def _run(reactor, args, act):
    """C{act(operations)} with the client operations on the configured store."""

    async def use(config, store):
        try:
            return await act(client_operations(config, reactor, store))
        except OperationError as e:
            raise _worded(e) from None

    return await with_plugin(reactor, args, "store", use)


def _settings(args) -> dict:
    """The settings the options name; a repeated list option replaces the whole list."""
    settings: dict = {}
    for field, value in (
        ("name", args.name), ("redirect_uris", args.redirect_uri),
        ("post_logout_redirect_uris", args.post_logout_redirect_uri),
        ("backchannel_logout_uri", args.backchannel_logout_uri), ("end_session_enabled", args.end_session),
        ("first_party", args.first_party), ("introspect_any", args.introspect_any), ("resources", args.resource),
        ("audiences", args.audience), ("grant_types", args.grant_type), ("refresh_grace", args.refresh_grace),
        ("rate_limit", args.rate_limit), ("require_mfa", args.require_mfa),
        ("require_pushed_authorization_requests", args.require_par),
        ("dpop_bound_access_tokens", args.require_dpop),
        ("profile", args.profile), ("id_token_signed_response_alg", args.id_token_alg),
        ("access_token_signed_response_alg", args.access_token_alg),
        ("userinfo_signed_response_alg", args.userinfo_alg), ("token_endpoint_auth_method", args.auth_method),
        ("jwks", _read_jwks(args.jwks)), ("jwks_uri", args.jwks_uri), ("scopes", args.scope),
    ):
        if value is not None:
            settings[field] = value
    return settings


def _read_jwks(path: str | None) -> str | None:
    """The JWK set in the file C{--jwks} names (the client's public keys), as its text."""
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise AdminError(f"--jwks: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise AdminError(f"--jwks: {path} is not UTF-8 text") from None


async def client_add(reactor, args, console: Console):
    data = {"client_id": args.client_id, "public": args.public, **_settings(args)}
    client, secret = await _run(reactor, args, lambda ops: ops.create(data, actor=ACTOR))
    _print_client(client, console)
    if secret:
        console.out(f"client_secret:              {secret}")
        console.err("Keep the secret now: only its hash is stored, it cannot be shown again.")


async def client_update(reactor, args, console: Console):
    data = _settings(args)
    for name in args.clear:
        field = "userinfo_signed_response_alg" if name == "userinfo-alg" else name.replace("-", "_")
        data[field] = None if field in NULLABLE else []
    if not data:
        raise AdminError("nothing to change: give at least one option (see client update --help)")
    client = await _run(reactor, args, lambda ops: ops.update(args.client_id, data, actor=ACTOR))
    _print_client(client, console)


async def client_rotate_secret(reactor, args, console: Console):
    try:
        overlap = parse_duration(args.overlap) if args.overlap else DEFAULT_OVERLAP
    except ValueError:
        raise AdminError(f"--overlap {args.overlap!r} is not a duration such as 24h or 0s") from None
    client, secret = await _run(reactor, args, lambda ops: ops.rotate_secret(args.client_id, actor=ACTOR,
                                                                             overlap=overlap))
    console.out(f"client_secret:              {secret}")
    if client.previous_secret_until:
        console.out(f"previous secret works until {iso_utc(client.previous_secret_until)}")
    else:
        console.out("the previous secret no longer works")
    console.err("Keep the secret now: only its hash is stored, it cannot be shown again.")


async def client_list(reactor, args, console: Console):
    async def every(ops):
        clients, cursor = [], None
        while True:
            page = await ops.list(100, cursor)
            clients += page.items
            if page.next_cursor is None:
                return clients
            cursor = page.next_cursor

    clients = await _run(reactor, args, every)
    if args.json:
        console.out_json([client_view(c) for c in clients])
        return
    for client in clients:
        kind = "public" if client.is_public else "confidential"
        flags = [f for f, on in (("first-party", client.first_party),
                                 ("end-session", client.end_session_enabled),
                                 ("introspect-any", client.introspect_any)) if on]
        console.out(f"{client.client_id}\t{kind}\t{','.join(flags) or '-'}\t{client.name}")


async def client_show(reactor, args, console: Console):
    client = await _run(reactor, args, lambda ops: ops.get(args.client_id))
    if args.json:
        console.out_json(client_view(client))
    else:
        _print_client(client, console)


async def client_remove(reactor, args, console: Console):
    await _run(reactor, args, lambda ops: ops.delete(args.client_id, actor=ACTOR))
    console.out(f"removed client {args.client_id}")


def _setting_options(parser, *, adding: bool) -> None:
    """The options of the settings; on update every one is optional and only the given ones change."""
    flag = "store_true" if adding else argparse.BooleanOptionalAction
    default_list: list[str] | None = [] if adding else None
    parser.add_argument("--name", help="shown on the consent page")
    parser.add_argument("--redirect-uri", action="append", default=None,
                        help="repeat for several" + ("" if adding else "; replaces the list"))
    parser.add_argument("--post-logout-redirect-uri", action="append", default=default_list,
                        help="where RP-initiated logout may return to (repeat; needs --end-session)")
    parser.add_argument("--end-session", action=flag, default=False if adding else None,
                        help="allow RP-initiated logout")
    parser.add_argument("--first-party", action=flag, default=False if adding else None,
                        help="skip the consent page")
    parser.add_argument("--resource", action="append", default=default_list,
                        help="an audience it may request (RFC 8707)")
    parser.add_argument("--introspect-any", action=flag, default=False if adding else None,
                        help="a resource server that may introspect any token")
    parser.add_argument("--backchannel-logout-uri", help="where back-channel logout tokens are posted")
    parser.add_argument("--audience", action="append", default=None,
                        help="a resource it serves: it may introspect tokens meant for it")
    parser.add_argument("--grant-type", action="append", default=None, help="a grant it may use (repeat)")
    parser.add_argument("--refresh-grace", help="its refresh grace window, e.g. 30s")
    parser.add_argument("--rate-limit", help="its request rate, e.g. 50/s or off")
    parser.add_argument("--require-mfa", action=flag, default=False if adding else None,
                        help="every user signing in to it gives (or enrols) a second factor")
    parser.add_argument("--require-par", action=flag, default=False if adding else None,
                        help="accept only pushed authorization requests (RFC 9126)")
    parser.add_argument("--require-dpop", action=flag, default=False if adding else None,
                        help="every token request must come with a DPoP proof (RFC 9449; needs [dpop] enabled)")
    parser.add_argument("--profile", choices=PROFILES, help="hold it to a security profile (FAPI 2.0)")
    parser.add_argument("--id-token-alg", choices=ALGORITHMS,
                        help="id_token_signed_response_alg: how its ID tokens are signed (default RS256)")
    parser.add_argument("--access-token-alg", choices=ALGORITHMS,
                        help="access_token_signed_response_alg: how its JWT access tokens are signed (default RS256)")
    parser.add_argument("--userinfo-alg", choices=ALGORITHMS,
                        help="userinfo_signed_response_alg: sign its UserInfo answers (default: plain JSON)")
    parser.add_argument("--auth-method", choices=AUTH_METHODS,
                        help="how it authenticates at the token endpoint (private_key_jwt: with --jwks or --jwks-uri)")
    parser.add_argument("--jwks", metavar="FILE", help="a file with its public JWK set (private_key_jwt)")
    parser.add_argument("--jwks-uri", help="where its public JWK set is fetched (private_key_jwt)")
    parser.add_argument("--scope", action="append", default=None,
                        help="a scope it may ask for with client_credentials (repeat)")


def register(commands) -> None:
    """Add C{client add|update|rotate-secret|list|show|remove} to the top-level subparsers."""
    client = commands.add_parser("client", help="provision relying parties").add_subparsers(
        dest="client_command", required=True, metavar="ACTION"
    )
    add = client.add_parser("add", help="add a client; prints a generated secret once")
    add.add_argument("client_id", help="the client's id")
    add.add_argument("--public", action="store_true", help="no secret: a browser or native app (PKCE only)")
    _setting_options(add, adding=True)
    add.set_defaults(run=client_add)
    update = client.add_parser("update", help="change a client's settings; the others keep their values")
    update.add_argument("client_id", help="the client's id")
    _setting_options(update, adding=False)
    update.add_argument("--clear", action="append", default=[], choices=CLEARABLE, metavar="SETTING",
                        help=f"empty a setting: one of {', '.join(CLEARABLE)}")
    update.set_defaults(run=client_update)
    rotate = client.add_parser("rotate-secret", help="give a client a new secret; prints it once")
    rotate.add_argument("client_id", help="the client's id")
    rotate.add_argument("--overlap", metavar="DURATION",
                        help="how long the old secret keeps working (default 24h; 0s: not at all)")
    rotate.set_defaults(run=client_rotate_secret)
    listing = client.add_parser("list", help="list clients")
    listing.set_defaults(run=client_list)
    show = client.add_parser("show", help="show one client")
    show.add_argument("client_id", help="the client's id")
    show.set_defaults(run=client_show)
    remove = client.add_parser("remove", help="remove a client")
    remove.add_argument("client_id", help="the client's id")
    remove.set_defaults(run=client_remove)
