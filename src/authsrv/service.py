"""
Assembles the running server from a L{Config}: plugins, web site, listeners
and periodic housekeeping, as one L{MultiService}.

Everything that can fail because of the operator's input (config, plugin
sections, files, ports) fails in L{build} before the reactor runs, so that
C{twist authsrv} stops with one line and a non-zero status.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import attrs
from attrs import frozen
from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import HTTPConnectionPool
from twisted.web.resource import Resource

from authsrv.chat.crypto import TokenCipher
from authsrv.chat.provider import ChatProvider, http_client
from authsrv.chat.tokens import ChatTokens
from authsrv.config import Config
from authsrv.configsection import ConfigError
from authsrv.context import PluginContext
from authsrv.drain import Drain
from authsrv.flows import backchannel
from authsrv.flows.claims import ClaimsSource
from authsrv.flows.clients import ClientCache
from authsrv.flows.end_session import EndSessionFlow
from authsrv.flows.grants import GrantRegistry
from authsrv.flows.grants.authorization_code import AuthorizationCodeGrant
from authsrv.flows.grants.refresh_token import RefreshTokenGrant
from authsrv.flows.grants.users import GrantUsers
from authsrv.flows.account import AccountFactors, AccountPage
from authsrv.flows.interaction import InteractionFlow
from authsrv.flows.introspect import IntrospectionFlow
from authsrv.flows.issue import TokenMinter
from authsrv.flows.link import ChatLinking
from authsrv.flows.passkeys import Passkeys
from authsrv.flows.login import PasswordLogin
from authsrv.flows.mfa import SecondFactors
from authsrv.flows.ratelimit import ClientRateLimits
from authsrv.flows.revoke import RevocationFlow
from authsrv.flows.sessions import SessionEnder
from authsrv.flows.token import TokenFlow
from authsrv.flows.userinfo import UserInfoFlow
from authsrv.identity.chain import IdentityChain
from authsrv.plugins import UnknownPlugin, find_factory
from authsrv.protocol.discovery import authorization_server_metadata, openid_configuration
from authsrv.records import Client
from authsrv.tls import hsts_headers, listen_problem, resolve_tls_paths
from authsrv.tokens import CLIENT_SECRET_KEY, keyed_form
from authsrv.web.cookies import Cookies
from authsrv.web.internal import InternalAPI
from authsrv.web.limits import LimitedSite
from authsrv.web.public import PublicSite
from authsrv.web.request import bounded_request_factory
from authsrv.web.root import Root
from authsrv.web.static import StaticBytes

MAINTENANCE_INTERVAL = 60.0
JWKS_MAX_AGE = 600
"""
How long relying parties may cache the JWKS: a next key must have been
published at least this long before it is promoted and signs.
"""
GC_BATCH = 500
STARTUP_RETRY = 5.0
"""Seconds between attempts to store the config's clients while the store is down at start."""


log = Logger()


class StartupError(Exception):
    """Something the operator must fix before the server can start."""


def build_plugin(role: str, choice, context):
    """Build a configured plugin, turning its mistakes into L{StartupError}."""
    try:
        return find_factory(role, choice.name).from_config(choice.section, context)
    except UnknownPlugin as e:
        raise StartupError(f"{choice.section.key('plugin')}: {e}") from None
    except ConfigError as e:
        raise StartupError(str(e)) from None


def build_identity(config: Config, context) -> IdentityChain:
    """
    Every C{[[identity]]} backend, in the configured order, as the one
    chain that the portal checks passwords with and every flow asks.
    """
    return IdentityChain([build_plugin("identity", choice, context) for choice in config.identity])


def with_keyed_secret(client: Client, key: bytes) -> Client:
    """C{client} with its secret hash in the keyed form (see L{authsrv.tokens})."""
    if client.secret_hash is None:
        return client
    return attrs.evolve(client, secret_hash=keyed_form(client.secret_hash, key))


async def sync_config_clients(store, declared) -> None:
    """
    The store's config clients become exactly the config file's: each
    declared one is stored, its secret hash keyed with the server key
    (loaded, or made, first), and one the file no longer declares is removed
    with its privileges; clients the operator made stay.
    """
    key = await store.server_key(CLIENT_SECRET_KEY)
    await gatherResults([store.put_client(with_keyed_secret(c, key)) for c in declared], consumeErrors=True)
    names = {c.client_id for c in declared}
    for client in await store.list_clients():
        if client.source == "config" and client.client_id not in names:
            await store.remove_client(client.client_id)
            log.info("client {client_id} removed: the config file no longer declares it", client_id=client.client_id)


class AuthsrvService(MultiService):
    """
    The server: owns the plugins and thread pools and closes them on stop,
    after draining its listeners when given a L{Drain}.
    """

    log = Logger()

    def __init__(
        self, *, reactor, config: Config, context, store, keystore, identity, ports, http_pool=None, drain=None
    ):
        super().__init__()
        self._reactor = reactor
        self.config = config
        self._context = context
        self.store = store
        self.keystore = keystore
        self.identity = identity
        self._ports = ports
        self._http_pool = http_pool
        self._drain = drain
        self._started = False
        self._retry = None
        timer = TimerService(MAINTENANCE_INTERVAL, self._maintain)
        timer.clock = reactor
        timer.setServiceParent(self)

    def readiness_problem(self) -> str | None:
        if self._drain is not None and self._drain.draining:
            return "draining"
        return None if self._started else "starting"

    def startService(self):
        super().startService()
        self._store_clients()

    def _store_clients(self):
        """Ready once the config's clients are stored; retried while the store is down."""
        self._retry = None
        d = Deferred.fromCoroutine(sync_config_clients(self.store, self.config.clients))
        d.addCallbacks(self._ready, self._startup_failed)

    def _ready(self, _):
        self._started = True
        self.log.info(
            "authsrv ready: issuer {issuer}, listening on {listen}",
            issuer=self.config.issuer,
            listen=", ".join(self.config.listen),
        )

    def _startup_failed(self, failure: Failure):
        self.log.failure(
            "could not store the clients declared in the config file; trying again in {delay}s", failure,
            delay=STARTUP_RETRY,
        )
        if self.running:
            self._retry = self._reactor.callLater(STARTUP_RETRY, self._store_clients)

    def _maintain(self):
        """Key schedule and housekeeping; a failure is logged and retried next round."""
        now = int(self._reactor.seconds())
        d = gatherResults(
            [self.keystore.maintain(now), self.store.gc(now, GC_BATCH)], consumeErrors=True
        )
        d.addErrback(lambda f: self.log.failure("maintenance failed", f))
        return d

    def stopService(self):
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self):
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._drain is not None:
            await self._drain.run(self._ports)
        else:
            await gatherResults([port.stopListening() for port in self._ports])
        await super().stopService()
        if self._http_pool is not None:
            await self._http_pool.closeCachedConnections()
        await self.store.close()
        await self.identity.close()
        self._context.stop()


def _listen(reactor, key, descriptions, site_for, ports, base_dir):
    """
    Bind every listener now, each with its own site from C{site_for()}, so
    that a taken port or a bad TLS file is a start-up error.
    """
    for index, description in enumerate(descriptions):
        problem = listen_problem(f"{key}[{index}]", description, base_dir)
        if problem:
            raise StartupError(problem)
        try:
            endpoint = serverFromString(reactor, resolve_tls_paths(description, base_dir))
        except (ValueError, KeyError, TypeError) as e:
            raise StartupError(f"{key}[{index}]: {description!r} is not a valid endpoint ({e})")
        results: list = []
        endpoint.listen(site_for()).addBoth(results.append)
        if results and isinstance(results[0], Failure):
            for port in ports:
                port.stopListening()
            raise StartupError(
                f"{key}[{index}]: cannot listen on {description!r}: {results[0].getErrorMessage()}"
            )
        ports.extend(results)


def grant_registry(config: Config, store, keystore, identity) -> GrantRegistry:
    """Every grant type the token endpoint offers, with what each needs."""
    users = GrantUsers(store=store, identity=identity, claims=_claims(config, store))
    minter = TokenMinter(keystore=keystore, issuer=config.issuer, limits=config.limits)
    return GrantRegistry([
        AuthorizationCodeGrant(store=store, users=users, minter=minter),
        RefreshTokenGrant(store=store, users=users, minter=minter, limits=config.limits),
    ])


def _claims(config: Config, store) -> ClaimsSource:
    return ClaimsSource(store, config.chat.provider if config.chat else None)


def _documents(config: Config, keystore, grant_types: tuple[str, ...]) -> dict[bytes, Resource]:
    issuer_path = config.issuer[len(config.public_url):]
    oidc = json.dumps(openid_configuration(config.issuer, keystore.algorithms, grant_types)).encode()
    oauth = json.dumps(authorization_server_metadata(config.issuer, keystore.algorithms, grant_types)).encode()
    long_lived = b"public, max-age=3600"
    return {
        f"{issuer_path}/.well-known/openid-configuration".encode(): StaticBytes(
            lambda: oidc, b"application/json", long_lived
        ),
        f"{issuer_path}/.well-known/oauth-authorization-server".encode(): StaticBytes(
            lambda: oauth, b"application/json", long_lived
        ),
        f"{issuer_path}/jwks".encode(): StaticBytes(
            keystore.jwks_bytes, b"application/jwk-set+json", f"public, max-age={JWKS_MAX_AGE}".encode()
        ),
    }


@frozen
class PublicFlows:
    """The flows behind the public site's routes."""

    interaction: InteractionFlow
    token: TokenFlow
    userinfo: UserInfoFlow
    introspection: IntrospectionFlow
    revocation: RevocationFlow
    end_session: EndSessionFlow
    account: AccountFactors
    account_page: AccountPage
    linking: ChatLinking | None


def public_flows(config: Config, reactor, store, keystore, identity, grants: GrantRegistry, clients: ClientCache,
                 chat_link=None) -> PublicFlows:
    """Each flow built with exactly the collaborators it uses (fosite's compose)."""
    notifier = backchannel.BackchannelNotifier(reactor, backchannel.default_http_client(reactor))
    sessions = SessionEnder(
        store=store, notify=lambda session: notifier.session_ended(store, keystore, config.issuer, session)
    )
    login = PasswordLogin(identity=identity, store=store, policy=config.throttle)
    factors = SecondFactors(store=store, policy=config.mfa, throttle=config.throttle,
                            issuer_label=urlsplit(config.public_url).hostname or config.public_url)
    passkeys = None
    if config.mfa.enabled:
        passkeys = Passkeys(store=store, public_url=config.public_url,
                            rp_name=urlsplit(config.public_url).hostname or config.public_url)
    return PublicFlows(
        interaction=InteractionFlow(
            store=store, clients=clients, identity=identity, login=login, sessions=sessions,
            limits=config.limits, issuer=config.issuer, factors=factors, show_ban_reason=config.show_ban_reason,
            passkeys=passkeys,
        ),
        token=TokenFlow(clients=clients, grants=grants),
        userinfo=UserInfoFlow(store=store, identity=identity, claims=_claims(config, store), issuer=config.issuer),
        introspection=IntrospectionFlow(store=store, clients=clients, identity=identity, issuer=config.issuer),
        revocation=RevocationFlow(store=store, clients=clients),
        end_session=EndSessionFlow(store=store, keystore=keystore, issuer=config.issuer, sessions=sessions),
        account=AccountFactors(store=store, identity=identity, factors=factors),
        account_page=AccountPage(store=store, identity=identity, clients=clients, sessions=sessions, login=login,
                                 factors=factors, passkeys=passkeys, linking=chat_link),
        linking=chat_link,
    )


def web_root(
    config: Config, reactor, store, keystore, identity, readiness, internal=None, chat_link=None
) -> Root:
    """
    The main site's HTTP surface; C{readiness()} returns a problem or None,
    C{internal} is the internal API's resource when served here too, and
    C{chat_link} the chat-platform link flow when one is configured.
    """
    grants = grant_registry(config, store, keystore, identity)
    clients = ClientCache(store, reactor)
    site = PublicSite(
        clock=reactor,
        issuer=config.issuer,
        cookies=Cookies(
            path=urlsplit(config.issuer).path or "/", secure=config.issuer.startswith("https:"),
            session_ttl=config.limits.session_ttl,
        ),
        flows=public_flows(config, reactor, store, keystore, identity, grants, clients, chat_link),
        ping=lambda: store.ping(),
        readiness=readiness,
        rates=ClientRateLimits(clock=reactor, clients=clients, settings=config.rate_limits),
        trusted_proxies=config.trusted_proxies,
    )
    return Root(_documents(config, keystore, grants.grant_types), site.resource(), internal, config.input_limits)


@frozen
class Chat:
    """The chat-platform parts; C{pool} is the provider's HTTP connection pool, if any."""

    tokens: ChatTokens
    linking: ChatLinking | None
    pool: HTTPConnectionPool | None


def chat_parts(config: Config, reactor, store, identity) -> Chat:
    """
    Fresh provider tokens for the internal API and, when a provider client
    is configured, the link flow.
    """
    chat = config.chat
    cipher = TokenCipher(chat.encryption_key) if chat else None
    if chat is None or not chat.can_link:
        return Chat(ChatTokens(reactor, store, identity, None, cipher, chat), None, None)
    http, pool = http_client(reactor, chat.timeout)
    provider = ChatProvider(reactor, http, chat)
    linking = ChatLinking(
        store=store, identity=identity, provider=provider, cipher=cipher, issuer=config.issuer,
        pkce_enabled=chat.pkce,
    )
    return Chat(ChatTokens(reactor, store, identity, provider, cipher, chat), linking, pool)


def site_factory(root, config: Config, drain: Drain, reactor):
    """A new L{LimitedSite} for C{root} per call: connection caps are per listener."""
    headers = hsts_headers(config.public_url, config.hsts_max_age)
    request_factory = bounded_request_factory(config.limits.max_body_bytes, drain, headers)

    def site() -> LimitedSite:
        made = LimitedSite(
            root, limits=config.input_limits, access_log=config.access_log, headers=headers,
            trusted_proxies=config.trusted_proxies, requestFactory=request_factory, reactor=reactor,
        )
        made.displayTracebacks = False
        return made

    return site


def build(config: Config, reactor) -> AuthsrvService:
    """Build every part of the server; raises L{StartupError} with one line."""
    context = PluginContext(reactor, config.base_dir, config.limits.max_token_lifetime)
    try:
        store = build_plugin("store", config.store, context)
        keystore = build_plugin("keystore", config.keystore, context)
        identity = build_identity(config, context)
        holder: list[AuthsrvService] = []
        chat = chat_parts(config, reactor, store, identity)
        internal = InternalAPI(
            reactor=reactor, secret=config.internal_secret, store=store, identity=identity,
            chat_tokens=chat.tokens, rate=config.rate_limits.internal, trusted_proxies=config.trusted_proxies,
        ).resource()
        root = web_root(
            config, reactor, store, keystore, identity, lambda: holder[0].readiness_problem(),
            internal if config.internal_on_main else None, chat.linking,
        )
        ports: list = []
        drain = Drain(reactor, config.shutdown.delay, config.shutdown.timeout)
        _listen(reactor, "server.listen", config.listen, site_factory(root, config, drain, reactor), ports, config.base_dir)
        _listen(reactor, "internal.listen", config.internal_listen,
                site_factory(Root({}, internal, internal, config.input_limits), config, drain, reactor), ports,
                config.base_dir)
    except BaseException:
        context.stop()
        raise
    service = AuthsrvService(
        reactor=reactor,
        config=config,
        context=context,
        store=store,
        keystore=keystore,
        identity=identity,
        ports=ports,
        http_pool=chat.pool,
        drain=drain,
    )
    holder.append(service)
    return service
