"""
Assembles the running server from a L{Config}: plugins, web site, listeners
and periodic housekeeping, as one L{MultiService}.

Everything that can fail because of the operator's input (config, plugin
sections, files, ports) fails in L{build} before the reactor runs, so that
C{twist authsrv} stops with one line and a non-zero status.
"""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

import attrs
from attrs import frozen
from twisted.application.internet import TimerService
from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, FirstError, gatherResults, maybeDeferred
from twisted.internet.protocol import ServerFactory
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger, globalLogPublisher
from twisted.python.failure import Failure
from twisted.web.resource import Resource

from authsrv import events
from authsrv.chat.crypto import TokenCipher
from authsrv.chat.provider import LOOKUP_THREADS, LOOKUPS_WAITING, ChatProvider, PlatformClient
from authsrv.chat.tokens import ChatTokens
from authsrv.config import Config, ConfigSource
from authsrv.configsection import ConfigError, Unreachable
from authsrv.context import PluginContext
from authsrv.drain import Drain
from authsrv.flows import backchannel
from authsrv.flows.claims import ClaimsSource
from authsrv.flows.client_documents import DocumentClients
from authsrv.flows.clients import AssertionChecker, ClientCache
from authsrv.flows.dpop import DpopVerifier
from authsrv.flows.end_session import EndSessionFlow
from authsrv.flows.grants import GrantHandler, GrantRegistry
from authsrv.flows.grants.authorization_code import AuthorizationCodeGrant
from authsrv.flows.grants.client_credentials import ClientCredentialsGrant
from authsrv.flows.grants.device_code import DeviceCodeGrant
from authsrv.flows.grants.refresh_token import RefreshTokenGrant
from authsrv.flows.grants.users import GrantUsers
from authsrv.flows.account import AccountFactors, AccountPage
from authsrv.flows.device import DeviceAuthorizationFlow, DeviceVerification
from authsrv.flows.interaction import InteractionFlow
from authsrv.flows.introspect import IntrospectionFlow
from authsrv.flows.issue import TokenMinter
from authsrv.flows.link import ChatLinking
from authsrv.flows.passkeys import Passkeys
from authsrv.flows.login import PasswordLogin
from authsrv.flows.offered import OfferedFeatures, offered_grants
from authsrv.flows.mfa import SecondFactors
from authsrv.flows.pushed import PushedRequests
from authsrv.flows.ratelimit import ClientRateLimits
from authsrv.flows.readiness import Readiness
from authsrv.flows.registration import OperatorNames, Registration
from authsrv.flows.revoke import RevocationFlow
from authsrv.flows.sessions import SessionEnder
from authsrv.flows.token import TokenFlow
from authsrv.flows.userinfo import UserInfoFlow, UserInfoSigner
from authsrv.hostlookup import HostLookups
from authsrv.identity.cache import DEFAULT_SECONDS as DEFAULT_STANDING_CACHE, StandingCache
from authsrv.keys.postgres import KeystoreUnavailable
from authsrv.identity.chain import IdentityChain
from authsrv.identity.passwords import new_hashes
from authsrv.interfaces import IChatLinkSource, IUserManagement
from authsrv.logfile import LineFile
from authsrv.metrics import Metrics
from authsrv.operations import AdminOperations
from authsrv.operations.clients import ClientOperations
from authsrv.operations.keys import JWKS_MAX_AGE, KeyOperations
from authsrv.operations.users import UserOperations
from authsrv.plugins import UnknownPlugin, find_factory
from authsrv.protocol.discovery import (
    advertised_assertion_algs,
    authorization_server_metadata,
    endpoints,
    openid_configuration,
    pushed_request_endpoint,
    pushed_request_metadata,
    registration_metadata,
)
from authsrv.protocol.dpop import ALGORITHMS as DPOP_ALGORITHMS
from authsrv.protocol.pushed import REQUEST_URI_TTL
from authsrv.protocol.rates import Rate
from authsrv.records import Client, LinkedAccount
from authsrv.remote_documents import RemoteDocuments
from authsrv.store.errors import StoreUnavailable, outage_of
from authsrv.tls import endpoint_of, hsts_headers, listen_problem, shared_port_problems
from authsrv.tokens import CLIENT_SECRET_KEY, keyed_form
from authsrv.web.accesslog import AccessLog
from authsrv.web.admin import AdminAPI
from authsrv.web.cookies import Cookies
from authsrv.web.internal import InternalAPI
from authsrv.web.limits import LimitedSite
from authsrv.web.metrics import MetricsResource
from authsrv.web.public import PublicSite
from authsrv.web.request import bounded_request_factory
from authsrv.web.root import Root
from authsrv.web.routes import Named
from authsrv.web.static import StaticBytes
from authsrv.workers import METRICS_DIR_ENV, Adopter, Binder, Supervisor, WorkerRole

MAINTENANCE_INTERVAL = 60.0
GC_BATCH = 500
GC_ROUND_SECONDS = 10.0
"""
The longest a maintenance round goes on deleting batches while expired rows
are left: a batch of each kind a minute would let a store that sees more
expire in a minute grow for ever.
"""
STARTUP_RETRY = 5.0
"""Seconds between attempts to store the config's clients while the store is down at start."""


log = Logger()
CONFIG_ACTOR = "config file"
ACCESS_LOG_FLUSH = 1.0
"""Seconds an access log line may wait in its buffer."""


class StartupError(Exception):
    """Something the operator must fix before the server can start."""


class StartupUnreachable(StartupError):
    """A database or directory the config names did not answer: starting again later may work."""


def build_plugin(role: str, choice, context):
    """Build a configured plugin, turning its mistakes into L{StartupError}."""
    try:
        return find_factory(role, choice.name).from_config(choice.section, context)
    except UnknownPlugin as e:
        raise StartupError(f"{choice.section.key('plugin')}: {e}") from None
    except Unreachable as e:
        raise StartupUnreachable(str(e)) from None
    except ConfigError as e:
        raise StartupError(str(e)) from None


def backend_names(plugins: list[str]) -> list[str]:
    """Each identity backend's name: its plugin's, numbered by its place when a plugin is used twice."""
    return [name if plugins.count(name) == 1 else f"{name}-{index}" for index, name in enumerate(plugins)]


def standing_cache(choice, backend, clock) -> StandingCache | None:
    """
    The cache configured for a backend, or None when it is off. By default a
    backend authsrv writes users to (the static file, PostgreSQL's own table)
    is asked every time, so that disabling a user there acts at once, and one
    it only reads (LDAP, a mapped table, a third party's) keeps users for
    L{authsrv.identity.cache.DEFAULT_SECONDS}.
    """
    seconds = choice.standing_cache
    if seconds is None:
        seconds = 0 if IUserManagement.providedBy(backend) else DEFAULT_STANDING_CACHE
    return StandingCache(clock, seconds, choice.standing_cache_size) if seconds else None


def build_identity(config: Config, context, metrics: Metrics | None = None) -> IdentityChain:
    """
    Every C{[[identity]]} backend, in the configured order, as the one
    chain that the portal checks passwords with and every flow asks.
    """
    backends = [build_plugin("identity", choice, context) for choice in config.identity]
    return IdentityChain(
        backends,
        backend_names([choice.name for choice in config.identity]),
        metrics.identity_call if metrics else None,
        [standing_cache(choice, backend, context.reactor) for choice, backend in zip(config.identity, backends)],
    )


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
    with its privileges; clients the operator made stay. What changed is
    audited, with the config file as the actor.
    """
    key = await store.server_key(CLIENT_SECRET_KEY)
    stored = {c.client_id: c for c in await store.list_clients()}
    keyed = [with_keyed_secret(c, key) for c in declared]
    await gatherResults([store.put_client(c) for c in keyed], consumeErrors=True)
    for client in keyed:
        before = stored.get(client.client_id)
        if before is None:
            events.client_created(client_id=client.client_id, source="config", actor=CONFIG_ACTOR)
        elif attrs.evolve(before, sealed_secret=None) != attrs.evolve(client, sealed_secret=None):
            events.client_changed(client_id=client.client_id, source="config", actor=CONFIG_ACTOR)
    names = {c.client_id for c in declared}
    for client in stored.values():
        if client.source == "config" and client.client_id not in names:
            await store.remove_client(client.client_id)
            events.client_deleted(client_id=client.client_id, source="config", actor=CONFIG_ACTOR,
                                  reason="the config file no longer declares it")


class AuthsrvService(MultiService):
    """
    The server: owns the plugins and thread pools and closes them on stop,
    after draining its listeners when given a L{Drain} and letting the
    back-channel logouts of its C{notifier} finish (within the same time).
    """

    log = Logger()

    def __init__(
        self, *, reactor, config: Config, context, store, keystore, identity, ports, drain=None,
        metrics: Metrics | None = None,
        access_log: AccessLog | None = None,
        notifier: backchannel.BackchannelNotifier | None = None,
    ):
        super().__init__()
        self._reactor = reactor
        self.config = config
        self._context = context
        self.store = store
        self.keystore = keystore
        self.identity = identity
        self._ports = ports
        self._drain = drain
        self._notifier = notifier
        self._metrics = metrics
        self._started = False
        self._retry = None
        self.access_log = access_log
        timer = TimerService(MAINTENANCE_INTERVAL, self._maintain)
        timer.clock = reactor
        timer.setServiceParent(self)
        if access_log is not None:
            flush = TimerService(ACCESS_LOG_FLUSH, access_log.file.flush)
            flush.clock = reactor
            flush.setServiceParent(self)

    def readiness_problem(self) -> str | None:
        if self._drain is not None and self._drain.draining:
            return "draining"
        return None if self._started else "starting"

    def startService(self):
        super().startService()
        if self._metrics is not None:
            globalLogPublisher.addObserver(self._metrics.audit_observer)
        self._store_clients()

    def _store_clients(self):
        """Ready once the config's clients are stored; retried while the store is down."""
        self._retry = None
        d = Deferred.fromCoroutine(sync_config_clients(self.store, self.config.clients))
        d.addCallbacks(self._ready, self._startup_failed)

    def _ready(self, _):
        self._started = True
        self.log.info(
            "authsrv ready (pid {pid}): issuer {issuer}, listening on {listen}; store {store}, keystore {keystore},"
            " identity {identity}",
            issuer=self.config.issuer,
            listen=", ".join(self.config.listen),
            pid=os.getpid(),
            store=self.config.store.name,
            keystore=self.config.keystore.name,
            identity=", ".join(choice.name for choice in self.config.identity),
        )

    def _startup_failed(self, failure: Failure):
        """An outage is one line (the pool logs it too), anything else a failure; retried either way."""
        outage = outage_of(failure)
        if outage is not None:
            self.log.warn("could not store the clients declared in the config file ({error}); trying again in"
                          " {delay}s", error=str(outage), delay=STARTUP_RETRY)
        else:
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
            [self.keystore.maintain(now), Deferred.fromCoroutine(self._collect(now))], consumeErrors=True
        )
        d.addErrback(self._maintenance_failed)
        return d

    async def _collect(self, now: int) -> None:
        """
        Batches of what expired by C{now}, one after another (each statement
        short, so requests wait little), until a call removes less than a
        batch or L{GC_ROUND_SECONDS} are spent.
        """
        deadline = self._reactor.seconds() + GC_ROUND_SECONDS
        while await self.store.gc(now, GC_BATCH) >= GC_BATCH:
            if not self.running or self._reactor.seconds() >= deadline:
                return

    def _maintenance_failed(self, failure) -> None:
        """An outage puts the round off with one line (the pool logs the outage itself); anything else is a failure."""
        error = failure.value.subFailure.value if failure.check(FirstError) else failure.value
        if isinstance(error, (StoreUnavailable, KeystoreUnavailable)):
            self.log.warn("maintenance put off: {error}", error=str(error))
        else:
            self.log.failure("maintenance failed", failure)

    def stopService(self):
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self):
        # Back-channel logouts in flight share the requests' time: stopping takes drain_delay + drain_timeout at most.
        deadline = self._reactor.seconds() + self.config.shutdown.delay + self.config.shutdown.timeout
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._drain is not None:
            await self._drain.run(self._ports)
        else:
            await gatherResults([maybeDeferred(port.stopListening) for port in self._ports])
        if self._notifier is not None:
            cut = await self._notifier.settle(max(0.0, deadline - self._reactor.seconds()))
            if cut:
                self.log.warn("{count} sessions' back-channel logouts were still running and are cut off", count=cut)
        await super().stopService()
        if self._metrics is not None:
            globalLogPublisher.removeObserver(self._metrics.audit_observer)
        await self.store.close()
        await self.identity.close()
        self._context.stop()
        if self.access_log is not None:
            self.access_log.file.close()


def _ports_apart(groups) -> None:
    """Two listeners on one port are one line naming both, where the bind would blame another program."""
    problems = shared_port_problems(groups)
    if problems:
        raise StartupError(problems[0])


def _warn_of_certificate_dates(groups, base_dir: Path, now: float) -> None:
    """
    A certificate out of its dates is still served, since a restart must
    not take TLS away, but said once at start: clients refuse it.
    """
    for key, descriptions in groups:
        for index, description in enumerate(descriptions):
            if problem := listen_problem(f"{key}[{index}]", description, base_dir, now):
                log.warn("{problem}: clients refuse it; serving it until it is replaced", problem=problem)


def _listen(reactor, key, descriptions, site_for, ports, base_dir):
    """
    Bind every listener now, each with its own site from C{site_for()}, so
    that a taken port or a bad TLS file is a start-up error.
    """
    for index, description in enumerate(descriptions):
        try:
            endpoint = endpoint_of(reactor, f"{key}[{index}]", description, base_dir)
        except ValueError as e:
            raise StartupError(str(e)) from None
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
    handlers: list[GrantHandler] = [
        AuthorizationCodeGrant(store=store, users=users, minter=minter),
        RefreshTokenGrant(store=store, users=users, minter=minter, limits=config.limits),
        ClientCredentialsGrant(store=store, minter=minter, limits=config.limits),
    ]
    if config.device.enabled:
        handlers.append(DeviceCodeGrant(store=store, users=users, minter=minter))
    return GrantRegistry(handlers)


def _claims(config: Config, store) -> ClaimsSource:
    return ClaimsSource(store, config.link_provider)


def _documents(config: Config, keystore, grant_types: tuple[str, ...], offered: OfferedFeatures
               ) -> dict[bytes, Resource]:
    """
    Discovery (both documents, each kept as bytes per set of optional
    features in use: see L{OfferedFeatures}) and the JWKS.
    """
    issuer_path = config.issuer[len(config.public_url):]
    pushed = pushed_request_metadata(config.issuer, config.par.enabled, config.par.required)
    registration = registration_metadata(
        config.issuer, config.registration.enabled, config.registration.metadata_documents
    )
    dpop_algs = DPOP_ALGORITHMS if config.dpop is not None else ()
    registrable = config.registration.enabled and config.registration.allow_confidential
    made: dict[tuple[bool, frozenset[str]], bytes] = {}

    def document(oidc: bool) -> bytes:
        features = offered.current()
        if (oidc, features) not in made:
            grants = offered_grants(grant_types, features)
            assertion_algs = advertised_assertion_algs(features, config.client_secret_key is not None, registrable)
            if oidc:
                metadata = openid_configuration(config.issuer, keystore.algorithms, grants, pushed, assertion_algs,
                                                dpop_algs, signed_userinfo=config.signing.userinfo)
            else:
                metadata = authorization_server_metadata(config.issuer, keystore.algorithms, grants, pushed,
                                                         assertion_algs, dpop_algs)
            made[oidc, features] = json.dumps({**metadata, **registration}).encode()
        return made[oidc, features]

    long_lived = b"public, max-age=3600"
    oidc = Named(StaticBytes(lambda: document(True), b"application/json", long_lived), "openid-configuration")
    oauth = Named(StaticBytes(lambda: document(False), b"application/json", long_lived), "oauth-authorization-server")
    return {
        # Each where OIDC Discovery appends it to the issuer, and where RFC 8414 section 3.1 inserts it
        # between the host and the issuer's path (some clients look only there).
        f"{issuer_path}/.well-known/openid-configuration".encode(): oidc,
        f"/.well-known/openid-configuration{issuer_path}".encode(): oidc,
        f"{issuer_path}/.well-known/oauth-authorization-server".encode(): oauth,
        f"/.well-known/oauth-authorization-server{issuer_path}".encode(): oauth,
        f"{issuer_path}/jwks".encode(): Named(StaticBytes(
            keystore.jwks_bytes, b"application/jwk-set+json", f"public, max-age={JWKS_MAX_AGE}".encode()
        ), "jwks"),
    }


@frozen
class PublicFlows:
    """The flows behind the public site's routes."""

    interaction: InteractionFlow
    token: TokenFlow
    pushed: PushedRequests | None
    userinfo: UserInfoFlow
    introspection: IntrospectionFlow
    revocation: RevocationFlow
    end_session: EndSessionFlow
    account: AccountFactors
    account_page: AccountPage
    linking: ChatLinking | None
    device: DeviceAuthorizationFlow | None = None
    device_verification: DeviceVerification | None = None
    registration: Registration | None = None


def public_flows(config: Config, reactor, store, keystore, identity, grants: GrantRegistry, clients,
                 offered: OfferedFeatures, hash_password: Callable[[str], Deferred], chat_link=None,
                 notifier: backchannel.BackchannelNotifier | None = None) -> PublicFlows:
    """
    Each flow built with exactly the collaborators it uses (fosite's
    compose); ended sessions are told to their clients by C{notifier};
    C{offered} is what discovery advertises, which the token endpoint names;
    C{hash_password} makes the account page's new hashes on the password pool.
    """
    notifier = notifier or backchannel_notifier(reactor)
    sessions = SessionEnder(
        store=store, notify=lambda session: notifier.session_ended(store, keystore, config.issuer, session)
    )
    login = PasswordLogin(identity=identity, store=store, policy=config.throttle)
    factors = SecondFactors(store=store, policy=config.mfa, throttle=config.throttle,
                            issuer_label=urlsplit(config.public_url).hostname or config.public_url)
    passkeys = None
    if config.mfa.enabled:
        passkeys = Passkeys(store=store, public_url=config.public_url,
                            rp_name=urlsplit(config.public_url).hostname or config.public_url,
                            limit=config.mfa.max_passkeys)
    dpop = DpopVerifier(store=store, policy=config.dpop) if config.dpop is not None else None
    pushed = PushedRequests(store=store, clients=clients, required=config.par.required, dpop=dpop,
                            url=pushed_request_endpoint(config.issuer)) if config.par.enabled else None
    interaction = InteractionFlow(
        store=store, clients=clients, identity=identity, login=login, sessions=sessions,
        limits=config.limits, issuer=config.issuer, factors=factors, show_ban_reason=config.show_ban_reason,
        passkeys=passkeys, pushed=pushed, dpop=dpop is not None, keystore=keystore,
    )
    device = verification = None
    if config.device.enabled:
        device = DeviceAuthorizationFlow(store=store, clients=clients, policy=config.device, issuer=config.issuer)
        verification = DeviceVerification(store=store, clients=clients, identity=identity, interaction=interaction,
                                          policy=config.device, limits=config.limits, issuer=config.issuer)
    return PublicFlows(
        interaction=interaction,
        token=TokenFlow(clients=clients, grants=grants, features=offered.current, dpop=dpop,
                        url=config.issuer + "/oauth2/token"),
        pushed=pushed,
        userinfo=UserInfoFlow(
            store=store, identity=identity, claims=_claims(config, store), issuer=config.issuer,
            signer=UserInfoSigner(clients=clients, keystore=keystore, issuer=config.issuer)
            if config.signing.userinfo else None,
            dpop=dpop,
        ),
        introspection=IntrospectionFlow(store=store, clients=clients, identity=identity, issuer=config.issuer),
        revocation=RevocationFlow(store=store, clients=clients),
        end_session=EndSessionFlow(store=store, keystore=keystore, issuer=config.issuer, sessions=sessions),
        account=AccountFactors(store=store, identity=identity, factors=factors, interaction=interaction,
                               issuer=config.issuer),
        account_page=AccountPage(store=store, identity=identity, clients=clients, sessions=sessions, login=login,
                                 factors=factors, passkeys=passkeys, linking=chat_link, interaction=interaction,
                                 issuer=config.issuer, hash_password=hash_password,
                                 min_length=config.password_min_length),
        linking=chat_link,
        device=device,
        device_verification=verification,
        registration=Registration(store=store, clock=reactor, policy=config.registration,
                                  base=f"{config.issuer}/oauth2/register", dpop_offered=config.dpop is not None,
                                  secrets=config.secret_keeper)
        if config.registration.enabled else None,
    )


def _public_pushes(config: Config) -> Rate | None:
    """
    How many pushed requests of public clients one address may keep waiting
    for their minute: as many as sign-ins it may keep waiting for the login
    form ([limits] pending_per_address; 0: no cap).
    """
    count = config.limits.pending_per_address
    return Rate(count, REQUEST_URI_TTL) if count and config.par.enabled else None


def _public_devices(config: Config) -> Rate | None:
    """
    How many device authorizations of public clients one address may keep
    waiting for their code's life: as many as sign-ins ([limits]
    pending_per_address; 0: no cap).
    """
    count = config.limits.pending_per_address
    return Rate(count, config.device.code_ttl) if count and config.device.enabled else None


def web_root(
    config: Config, reactor, store, keystore, identity, readiness, internal=None, chat_link=None, admin=None,
    documents: RemoteDocuments | None = None, notifier: backchannel.BackchannelNotifier | None = None,
    lookups=None, *, hash_password: Callable[[str], Deferred],
) -> Root:
    """
    The main site's HTTP surface; C{readiness()} returns a problem or None,
    C{internal} is the internal API's resource when served here too,
    C{chat_link} the chat-platform link flow when one is configured,
    C{admin} the admin API's resource when C{[admin] serve_on_main} says so,
    and C{documents} fetches client ID metadata documents when they are on
    (by default on C{reactor}). Key sets of the operator's clients are fetched
    apart, so that URLs anyone names neither take their fetches in flight nor
    push them out of the cache. C{notifier} sends back-channel logouts (by
    default one of its own). C{lookups(name, size)} gives each fetcher the
    thread pool it looks host names up on (the plugin context's pools),
    else the reactor's resolver does. C{hash_password} makes the account
    page's new password hashes (L{new_hashes}: on the password pool).
    """
    grants = grant_registry(config, store, keystore, identity)
    offered = OfferedFeatures(store, reactor, config.clients)
    token_endpoint = endpoints(config.issuer)["token_endpoint"]
    clients: ClientCache | DocumentClients = ClientCache(store, reactor, assertions=AssertionChecker(
        store=store, documents=_fetcher(reactor, config, lookups, "key-set-lookups"),
        audiences=(config.issuer, token_endpoint), secrets=config.secret_keeper,
        pushed_endpoint=pushed_request_endpoint(config.issuer)))
    if config.registration.metadata_documents:
        clients = DocumentClients(clients, documents or _fetcher(reactor, config, lookups, "document-lookups"),
                                  config.registration, reactor, OperatorNames(store),
                                  dpop_offered=config.dpop is not None)
    site = PublicSite(
        clock=reactor,
        issuer=config.issuer,
        cookies=Cookies(
            path=urlsplit(config.issuer).path or "/", secure=config.issuer.startswith("https:"),
            session_ttl=config.limits.session_ttl,
        ),
        flows=public_flows(config, reactor, store, keystore, identity, grants, clients, offered, hash_password,
                           chat_link, notifier),
        readiness=Readiness(clock=reactor, startup=readiness, store=store, keystore=keystore, identity=identity),
        rates=ClientRateLimits(clock=reactor, clients=clients, settings=config.rate_limits,
                               public_pushes=_public_pushes(config), public_devices=_public_devices(config)),
        trusted_proxies=config.trusted_proxies,
    )
    return Root(
        _documents(config, keystore, grants.grant_types, offered),
        site.resource(), internal, config.input_limits, admin
    )


def _fetcher(reactor, config: Config, lookups, name: str) -> RemoteDocuments:
    """
    A fetcher of documents, looking host names up on the pool C{lookups}
    gives it by C{name}, if any, as many of them waiting for a thread as
    documents may be fetched at once.
    """
    if lookups is None:
        return RemoteDocuments(reactor, config.remote_documents)
    most = config.remote_documents.fetches_in_flight
    return RemoteDocuments(reactor, config.remote_documents, resolve=HostLookups(reactor, lookups(name, most), most))


def client_operations(config: Config, reactor, store) -> ClientOperations:
    """Client operations; back-channel hosts are resolved and checked on C{reactor}."""
    return ClientOperations(
        store=store, clock=reactor, declared=frozenset(c.client_id for c in config.clients),
        resolve=lambda host: backchannel.resolve_host(reactor, host), pushed_offered=config.par.enabled,
        dpop_offered=config.dpop is not None, signing=config.signing, fetching=config.remote_documents,
        secrets=config.secret_keeper,
    )


def backchannel_notifier(reactor) -> backchannel.BackchannelNotifier:
    """Back-channel logout to relying parties over plain HTTP(S) on C{reactor}."""
    return backchannel.BackchannelNotifier(reactor, backchannel.default_http_client(reactor))


def user_operations(config: Config, reactor, store, keystore, identity, context,
                    notifier: backchannel.BackchannelNotifier,
                    revoke_link: Callable[[LinkedAccount], object] | None = None) -> UserOperations:
    """
    User operations: ended sessions are told to their clients by
    C{notifier} (whose owner waits for it to settle before closing),
    passwords hashed on a thread of their own, a removed user's chat link's
    tokens revoked by C{revoke_link}.
    """
    hashing = context.threadpool("admin-passwords", 1)
    return UserOperations(
        store=store, identity=identity, clock=reactor,
        notify=lambda session: notifier.session_ended(store, keystore, config.issuer, session),
        hash_password=lambda password: deferToThreadPool(reactor, hashing, context.password_hasher.hash, password),
        min_length=config.password_min_length, link_provider=config.link_provider, revoke_link=revoke_link,
    )


def admin_operations(config: Config, reactor, store, keystore, identity, context,
                     notifier: backchannel.BackchannelNotifier, linking: ChatLinking | None) -> AdminOperations:
    """
    Every operation of the admin API (the operator command builds the group
    it needs); a removed user's chat link's tokens are revoked by C{linking}
    after the answer, as at unlinking.
    """
    return AdminOperations(
        clients=client_operations(config, reactor, store),
        users=user_operations(config, reactor, store, keystore, identity, context, notifier,
                              linking.revoke_removed if linking else None),
        keys=KeyOperations(keystore=keystore, clock=reactor),
    )


@frozen
class Chat:
    """The chat-platform parts."""

    tokens: ChatTokens
    linking: ChatLinking | None


def chat_parts(config: Config, reactor, store, identity, context) -> Chat:
    """
    Fresh provider tokens for the internal API and, when a provider client
    is configured, the link flow, whose requests look the platform's name
    up on a thread pool of the plugin context's.
    """
    chat = config.chat
    cipher = TokenCipher(chat.encryption_key) if chat else None
    source = next((b for b in getattr(identity, "backends", ()) if IChatLinkSource.providedBy(b)), None)
    if chat is None or not chat.can_link:
        return Chat(ChatTokens(reactor, store, identity, None, cipher, chat, source), None)
    lookups = HostLookups(reactor, context.threadpool("chat-lookups", LOOKUP_THREADS), LOOKUPS_WAITING)
    http = PlatformClient(reactor, lookups, chat.timeout)
    provider = ChatProvider(reactor, http, chat)
    linking = ChatLinking(
        store=store, identity=identity, provider=provider, cipher=cipher, issuer=config.issuer,
        pkce_enabled=chat.pkce,
    )
    return Chat(ChatTokens(reactor, store, identity, provider, cipher, chat, source), linking)


def access_log_of(config: Config) -> AccessLog | None:
    """The configured access log on its buffered file, or None when it is off."""
    if config.access_log == "off":
        return None
    try:
        file = LineFile(config.access_log_path, flush_each=False)
    except OSError as e:
        raise StartupError(f"server.access_log_path: cannot open {config.access_log_path}: {e.strerror}") from None
    return AccessLog(file, config.access_log, config.trusted_proxies)


def site_factory(root, config: Config, drain: Drain, reactor, metrics: Metrics | None = None,
                 access_log: AccessLog | None = None):
    """A new L{LimitedSite} for C{root} per call: connection caps are per listener."""
    headers = hsts_headers(config.public_url, config.hsts_max_age)
    request_factory = bounded_request_factory(config.limits.max_body_bytes, drain, headers, metrics)

    def site() -> LimitedSite:
        made = LimitedSite(
            root, limits=config.input_limits, access_log=access_log, headers=headers,
            trusted_proxies=config.trusted_proxies, requestFactory=request_factory, reactor=reactor,
        )
        made.displayTracebacks = False
        return made

    return site


def metrics_site(metrics: Metrics, config: Config, reactor):
    """The metrics listener's site: C{/metrics} only, its requests not counted, no access log."""
    site = LimitedSite(MetricsResource(metrics.registry), limits=config.input_limits, access_log=None,
                       reactor=reactor)
    site.displayTracebacks = False
    return site


def build(
    config: Config, reactor, role: WorkerRole | None = None, audit_file: LineFile | None = None,
) -> AuthsrvService:
    """
    Build every part of the server; raises L{StartupError} with one line.
    As a worker (L{authsrv.workers}), C{role} says which: it adopts the
    sockets its parent bound, and only worker 0 serves the admin and
    metrics listeners. The metrics count the lines C{audit_file} loses.
    """
    first = role is None or role.index == 0
    listening = reactor if role is None else Adopter(reactor, role.fds)
    shared_metrics = os.environ.get(METRICS_DIR_ENV) if role is not None else None
    metrics = Metrics(shared_metrics) if config.metrics_listen and (first or shared_metrics) else None
    context = PluginContext.of(reactor, config, store_observer=metrics.store_call if metrics else None)
    try:
        store = build_plugin("store", config.store, context)
        keystore = build_plugin("keystore", config.keystore, context)
        identity = build_identity(config, context, metrics)
        holder: list[AuthsrvService] = []
        chat = chat_parts(config, reactor, store, identity, context)
        internal = InternalAPI(
            reactor=reactor, secret=config.internal_secret, store=store, identity=identity,
            chat_tokens=chat.tokens, rate=config.rate_limits.internal, trusted_proxies=config.trusted_proxies,
        ).resource()
        notifier = backchannel_notifier(reactor)
        admin = None
        if config.admin.secret is not None:
            admin = AdminAPI(
                operations=admin_operations(config, reactor, store, keystore, identity, context, notifier, chat.linking),
                secret=config.admin.secret, actor=config.admin.name,
            ).resource()
        root = web_root(
            config, reactor, store, keystore, identity, lambda: holder[0].readiness_problem(),
            internal if config.internal_on_main else None, chat.linking,
            admin if config.admin.serve_on_main else None, notifier=notifier, lookups=context.threadpool,
            hash_password=new_hashes(context),
        )
        ports: list = []
        drain = Drain(reactor, config.shutdown.delay, config.shutdown.timeout)
        access_log = access_log_of(config)
        admin_on_internal = admin if not config.admin.listen else None
        sites = {
            "server.listen": site_factory(root, config, drain, reactor, metrics, access_log),
            "internal.listen": site_factory(Root({}, internal, internal, config.input_limits, admin_on_internal),
                                            config, drain, reactor, metrics, access_log),
        }
        if metrics is not None:
            sites["metrics.listen"] = partial(metrics_site, metrics, config, reactor)
        if admin is not None:
            sites["admin.listen"] = site_factory(Root({}, admin, None, config.input_limits, admin), config, drain,
                                                 reactor, metrics, access_log)
        shared, own = listener_groups(config)
        groups = shared + (own if first else [])
        _ports_apart(groups)
        for key, descriptions in groups:
            _listen(listening, key, descriptions, sites[key], ports, config.base_dir)
        if role is None:
            _warn_of_certificate_dates(groups, config.base_dir, reactor.seconds())
        if isinstance(listening, Adopter):
            listening.check_all_taken()
        if metrics is not None:
            metrics.watch_keys(keystore, reactor)
            for name, file in (("audit", audit_file), ("access", access_log and access_log.file)):
                if file is not None:
                    metrics.watch_log_file(name, file)
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
        drain=drain,
        metrics=metrics,
        access_log=access_log,
        notifier=notifier,
    )
    holder.append(service)
    return service


def listener_groups(config: Config) -> tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, tuple[str, ...]]]]:
    """
    The listener settings in the order they are bound: those every worker
    serves, then those of worker 0 alone (the admin API, metrics).
    """
    own = []
    if config.admin.secret is not None:
        own.append(("admin.listen", config.admin.listen))
    if config.metrics_listen:
        own.append(("metrics.listen", config.metrics_listen))
    return [("server.listen", config.listen), ("internal.listen", config.internal_listen)], own


def build_supervisor(config: Config, reactor, count: int, source: ConfigSource) -> Supervisor:
    """
    The parent of C{count} workers: binds every listener, migrates the store,
    the keystore and the identity backends now (their mistakes are start-up
    errors, as in L{build}), and stores the config's clients once before the
    workers start, so that no two of them race to do it. The workers run
    C{source}, the config file as C{config} was read from it.
    """
    context = PluginContext.of(reactor, config)
    bound: list = []
    try:
        store = build_plugin("store", config.store, context)
        build_plugin("keystore", config.keystore, context)
        identity = build_identity(config, context)
        binder = Binder(reactor)
        shared, own = listener_groups(config)
        _ports_apart(shared + own)
        for key, descriptions in shared:
            _listen(binder, key, descriptions, ServerFactory, bound, config.base_dir)
        shared_sockets = len(bound)
        for key, descriptions in own:
            _listen(binder, key, descriptions, ServerFactory, bound, config.base_dir)
        _warn_of_certificate_dates(shared + own, config.base_dir, reactor.seconds())
    except BaseException:
        for port in bound:
            port.stopListening()
        context.stop()
        raise

    async def prepare() -> None:
        await sync_config_clients(store, config.clients)
        await store.close()
        await identity.close()
        context.stop()

    return Supervisor(reactor, count, bound, shared_sockets, prepare, config=source,
                      shared_metrics=bool(config.metrics_listen))
