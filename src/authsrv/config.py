"""
The server's TOML config file, read strictly into frozen values.

Plugin sections (C{[store]}, C{[keystore]}, C{[[identity]]}) are checked here
only for their C{plugin} name; the rest of each is handed to that plugin's
factory, which validates it with the same L{Section} rules.
"""

from __future__ import annotations

import hmac
import os
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
from attrs import field, frozen

from authsrv.chat.config import ChatConfig, chat_config
from authsrv.client_secrets import SecretKeeper
from authsrv.configsection import ConfigError, Problems, Section
from authsrv.flows.device import DevicePolicy
from authsrv.flows.grants import GRANT_TYPES
from authsrv.identity.cache import DEFAULT_SIZE as DEFAULT_STANDING_CACHE_SIZE, MAX_SECONDS as MAX_STANDING_CACHE
from authsrv.flows.mfa import MFA_CHOICES, MfaPolicy
from authsrv.flows.passkeys import PASSKEYS_CEILING
from authsrv.flows.ratelimit import DEFAULT_RATE, RateSettings
from authsrv.identity.passwords import DEFAULT_MEMORY_KIB, DEFAULT_PARALLELISM, DEFAULT_TIME_COST
from authsrv.protocol.device import DEVICE_CODE_GRANT
from authsrv.flows.registration import DEFAULT_MAX_CLIENTS
from authsrv.flows.registration import DEFAULT_RATE as REGISTRATION_RATE
from authsrv.flows.registration import RegistrationPolicy, host_pattern_problem
from authsrv.protocol.client_assertion import HMAC_BITS
from authsrv.protocol.clientauth import AUTH_METHODS, CLIENT_SECRET_JWT, auth_settings_problem
from authsrv.protocol.clients import CLIENT_ID_MAX, client_id_problem, is_loopback_host, redirect_uri_problem
from authsrv.protocol.dpop import DpopPolicy, unoffered_dpop
from authsrv.protocol.forwarded import Network, parse_networks
from authsrv.protocol.password_policy import MAX_LENGTH, MIN_LENGTH
from authsrv.protocol.profiles import PROFILES, profile_problems
from authsrv.protocol.pushed import unoffered_push
from authsrv.protocol.rates import Rate, parse_rate
from authsrv.protocol.signing import DEFAULT_ALG, SETTINGS, TOKEN_SETTINGS, SigningOffer
from authsrv.protocol.targets import backchannel_uri_problem
from authsrv.records import DEFAULT_GRANT_TYPES, Client, ThrottlePolicy
from authsrv.remote_documents import FetchPolicy, fetch_policy, url_problem
from authsrv.sealing import key_from_text
from authsrv.tls import MAX_PORT
from authsrv.tokens import token_hash, weak_secret_problem

DEFAULT_LISTEN = "tcp:8080:interface=127.0.0.1"
DEFAULT_PUBLIC_URL = "http://127.0.0.1:8080"
PUBLIC_URL_ENV = "AUTHSRV_PUBLIC_URL"
ISSUER_PATH = "/api/auth"
HSTS_MAX_AGE = 365 * 86400
NO_PROFILE = "none"
ACCESS_LOG_FORMATS = ("combined", "json", "off")
LOG_FORMATS = ("text", "json")
MAX_WORKERS = 256
"""
The most C{[server] workers} (and C{--workers}): far above any machine's
useful count, low enough that a mistyped number is an error, not a fork bomb.
"""
MAX_REGISTERED_CLIENTS = 10_000_000
"""The highest [registration] max_clients: a larger value is a typo, not a bound."""


@frozen
class Limits:
    """Lifetimes and sizes (docs/design.md, Limits), all in seconds or bytes."""

    code_ttl: int = 60
    access_token_ttl: int = 3600
    id_token_ttl: int = 3600
    refresh_token_idle_ttl: int = 30 * 86400
    refresh_token_absolute_ttl: int = 90 * 86400
    refresh_grace: int = 10
    """Confidential clients' refresh grace window; their tokens are useless without the client's secret."""
    refresh_grace_public: int = 0
    """Public clients' window: strict one-time refresh tokens (RFC 9700 section 4.14.2)."""
    session_ttl: int = 14 * 86400
    pending_request_ttl: int = 1800
    """How long a signed-in user's request waits for their consent."""
    login_request_ttl: int = 600
    """
    How long an anonymous request waits for the login form: shorter than
    consent's, since anyone can start one, so an abandoned one frees its
    address's place in L{pending_per_address} sooner.
    """
    pending_per_address: int = 100
    """Anonymous requests one client address may keep waiting for the login form; 0 for no cap."""
    max_body_bytes: int = 64 * 1024

    @property
    def max_token_lifetime(self) -> int:
        """How long a retired signing key must stay published."""
        return max(self.access_token_ttl, self.id_token_ttl)


PARAMETER_CAPS = {
    "state": 512,
    "nonce": 512,
    "scope": 1024,
    "redirect_uri": 2048,
    "post_logout_redirect_uri": 2048,
    "login_hint": 256,
    "code_challenge": 128,
    "code_verifier": 128,
    "client_id": CLIENT_ID_MAX,
}
"""Default maximum length, in characters, of each OAuth parameter ([limits.parameters])."""


@frozen
class InputLimits:
    """
    What one client may send and how slowly (C{[limits]}, docs/design.md, Limits):
    sizes in bytes or counts, times in seconds, 0 for no cap on connections.
    """

    max_header_count: int = 100
    max_header_bytes: int = 16 * 1024
    max_request_line: int = 8 * 1024
    max_query_bytes: int = 6 * 1024
    max_form_fields: int = 64
    header_timeout: int = 10
    body_timeout: int = 30
    idle_timeout: int = 60
    max_connections: int = 1024
    max_connections_per_address: int = 128
    parameters: dict = field(factory=lambda: dict(PARAMETER_CAPS))


@frozen
class Shutdown:
    """How a stopping server drains (C{[server] drain_delay}, C{drain_timeout}), in seconds."""

    delay: int = 5
    timeout: int = 30


ADMIN_ACTOR = "admin-api"


@frozen
class AdminSettings:
    """
    C{[admin]}: the admin API's secret (none: the API is not served), the
    actor name its changes are audited under, and where it is served: its
    own C{listen} addresses, else the internal API's listeners, and the
    public listener only with C{serve_on_main}.
    """

    secret: str | None = None
    name: str = ADMIN_ACTOR
    listen: tuple[str, ...] = ()
    serve_on_main: bool = False


@frozen
class PushedRequestSettings:
    """
    C{[par]}: whether the pushed authorization request endpoint (RFC 9126)
    is offered, and whether every client must use it; requiring it offers it.
    """

    enabled: bool = False
    required: bool = False


@frozen
class PasswordHashing:
    """
    C{[passwords]} argon2id parameters for new hashes. The default is the
    first of OWASP's equal-strength argon2id set (m=19 MiB, t=2, p=1): as
    strong against guessing as its bigger-memory siblings, about a third of
    the RFC 9106 low-memory profile's CPU per login on one core, and 19 MiB
    a check, so a login burst neither starves other requests nor the
    machine's memory. Hashes made with other parameters are replaced on
    their user's next successful login.
    """

    memory_kib: int = DEFAULT_MEMORY_KIB
    time_cost: int = DEFAULT_TIME_COST
    parallelism: int = DEFAULT_PARALLELISM


@frozen
class PluginChoice:
    """A configured plugin: its name and the rest of its section."""

    name: str
    section: Section
    standing_cache: int | None = None
    """For an identity backend: seconds its users are kept (L{authsrv.identity.cache}); None: its default."""
    standing_cache_size: int = DEFAULT_STANDING_CACHE_SIZE


@frozen
class Config:
    path: Path | None
    public_url: str
    listen: tuple[str, ...]
    access_log: str
    internal_secret: str | None
    internal_listen: tuple[str, ...]
    internal_on_main: bool
    limits: Limits
    store: PluginChoice
    keystore: PluginChoice
    identity: tuple[PluginChoice, ...]
    clients: tuple[Client, ...]
    chat: ChatConfig | None = None
    input_limits: InputLimits = InputLimits()
    shutdown: Shutdown = Shutdown()
    workers: int = 1
    """Processes serving the listeners (L{authsrv.workers}); 1: this process alone."""
    hsts_max_age: int = HSTS_MAX_AGE
    trusted_proxies: tuple[Network, ...] = ()
    throttle: ThrottlePolicy = ThrottlePolicy()
    show_ban_reason: bool = False
    rate_limits: RateSettings = RateSettings()
    password_min_length: int = MIN_LENGTH
    password_hashing: PasswordHashing = PasswordHashing()
    metrics_listen: tuple[str, ...] = ()
    """C{[metrics] listen}: where C{/metrics} is served; empty, no metrics at all."""
    access_log_path: str = "-"
    audit_path: str | None = None
    log_format: str | None = None
    admin: AdminSettings = AdminSettings()
    mfa: MfaPolicy = MfaPolicy()
    par: PushedRequestSettings = PushedRequestSettings()
    signing: SigningOffer = SigningOffer()
    """What clients may choose to have signed, and how: C{[keystore] algorithms}, C{[userinfo] signing}."""
    device: DevicePolicy = DevicePolicy()
    remote_documents: FetchPolicy = FetchPolicy()
    """C{[remote_documents]}: how documents that clients name (C{jwks_uri}) are fetched."""
    registration: RegistrationPolicy = RegistrationPolicy()
    """C{[registration]}: clients that register themselves, off unless configured."""
    dpop: DpopPolicy | None = None
    """C{[dpop]}: how proofs are checked; None when DPoP is off."""
    client_secret_key: bytes | None = field(default=None, repr=False)
    """C{[client_secrets]}: the key client_secret_jwt secrets are sealed with; None, that method is not offered."""

    @property
    def secret_keeper(self) -> SecretKeeper | None:
        """What seals and opens client_secret_jwt secrets, when offered."""
        return SecretKeeper(self.client_secret_key) if self.client_secret_key is not None else None

    @property
    def link_provider(self) -> str | None:
        """The chat platform whose links are kept (C{[chat] provider}); None without C{[chat]}."""
        return self.chat.provider if self.chat else None

    @property
    def issuer(self) -> str:
        return self.public_url + ISSUER_PATH

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()


class ConfigErrors(ConfigError):
    """Every mistake found in one config file; it reads as the first of them."""

    def __init__(self, errors: list[ConfigError]):
        super().__init__(errors[0].key, errors[0].problem)
        self.errors = tuple(errors)


def _checked_public_url(url: str, key: str) -> str:
    url = url.rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as e:
        raise ConfigError(key, f"{url!r} is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(key, f"{url!r} must be an absolute http(s) URL")
    if parts.query or parts.fragment or "#" in url or "?" in url:
        raise ConfigError(key, "must not have a query or fragment")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise ConfigError(key, "must use https (plain http is only for the loopback interface)")
    return url


def derived_public_url(listen: tuple[str, ...]) -> str:
    """
    The public URL of a server nobody named one for: the first listener's
    port on the loopback interface (https for an C{ssl:} listener), so that
    C{--listen tcp:9090} alone moves the issuer to port 9090. Listeners
    without a port (C{unix:}) keep the default, and so does a port out of
    range, which the listener's own check names (L{authsrv.tls.endpoint_of}).
    """
    first = listen[0].removeprefix("haproxy:") if listen else ""
    kind, *args = [part.replace("\\:", ":") for part in re.split(r"(?<!\\):", first)]
    positional = [a for a in args if "=" not in a]
    named = dict(a.split("=", 1) for a in args if "=" in a)
    port = named.get("port", positional[0] if positional else "")
    if kind not in ("tcp", "tcp6", "ssl") or not (port.isascii() and port.isdigit()) or int(port) > MAX_PORT:
        return DEFAULT_PUBLIC_URL
    interface = named.get("interface", "")
    host = interface if interface and is_loopback_host(interface) else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if kind == 'ssl' else 'http'}://{host}:{int(port)}"


def _public_url(section: Section, listen: tuple[str, ...], given: tuple[str, str] | None) -> str:
    """
    C{given} (the command line's or the environment's, with its name) wins;
    then the file's C{public_url} unless it is the loopback default, which,
    like no value at all, follows the listener (L{derived_public_url}).
    """
    in_file = section.str("public_url", None)
    if in_file is not None:
        in_file = _checked_public_url(in_file, section.key("public_url"))
    if given is not None:
        return _checked_public_url(given[1], given[0])
    if in_file is not None and in_file != DEFAULT_PUBLIC_URL:
        return in_file
    return derived_public_url(listen)


def _nonzero_durations(section: Section, checked: Problems, names, defaults) -> dict:
    """Durations that must be longer than zero; a mistaken one keeps its default."""
    values = {}
    for name in names:
        default = getattr(defaults, name)
        values[name] = checked.take(section.duration, name, default, fallback=default)
        if values[name] == 0:
            checked.add(section.error(name, "must be longer than zero"))
            values[name] = default
    return values


def _limits(section: Section, checked: Problems) -> Limits:
    defaults = Limits()
    values = _nonzero_durations(section, checked, (
        "code_ttl",
        "access_token_ttl",
        "id_token_ttl",
        "refresh_token_idle_ttl",
        "refresh_token_absolute_ttl",
        "session_ttl",
        "pending_request_ttl",
        "login_request_ttl",
    ), defaults)
    for name in ("refresh_grace", "refresh_grace_public"):
        values[name] = checked.take(section.duration, name, getattr(defaults, name), fallback=getattr(defaults, name))
    values["max_body_bytes"] = checked.take(
        section.int, "max_body_bytes", defaults.max_body_bytes, minimum=1024, fallback=defaults.max_body_bytes)
    values["pending_per_address"] = checked.take(
        section.int, "pending_per_address", defaults.pending_per_address, minimum=0,
        fallback=defaults.pending_per_address)
    checked.done(section)
    return Limits(**values)


def _input_limits(section: Section, checked: Problems) -> InputLimits:
    """Takes its own keys of C{[limits]}; L{_limits} reads the rest."""
    defaults = InputLimits()
    sizes = {
        "max_header_count": 10,
        "max_header_bytes": 1024,
        "max_request_line": 256,
        "max_query_bytes": 256,
        "max_form_fields": 8,
        "max_connections": 0,
        "max_connections_per_address": 0,
    }
    values = {
        name: checked.take(section.int, name, getattr(defaults, name), minimum=low, fallback=getattr(defaults, name))
        for name, low in sizes.items()
    }
    values.update(_nonzero_durations(section, checked, ("header_timeout", "body_timeout", "idle_timeout"), defaults))
    if values["max_query_bytes"] > values["max_request_line"]:
        checked.add(section.error("max_query_bytes", "must not exceed max_request_line"))
    caps = checked.take(section.table, "parameters", None)
    parameters = dict(PARAMETER_CAPS)
    if caps is not None:
        for name in PARAMETER_CAPS:
            parameters[name] = checked.take(caps.int, name, PARAMETER_CAPS[name], minimum=16,
                                            fallback=PARAMETER_CAPS[name])
        checked.done(caps)
    return InputLimits(**values, parameters=parameters)


def _shutdown(section: Section, checked: Problems) -> Shutdown:
    """C{[server] drain_delay} and C{drain_timeout}."""
    defaults = Shutdown()
    return Shutdown(
        delay=checked.take(section.duration, "drain_delay", defaults.delay, fallback=defaults.delay),
        timeout=checked.take(section.duration, "drain_timeout", defaults.timeout, fallback=defaults.timeout),
    )


def _trusted_proxies(server: Section, checked: Problems) -> tuple[Network, ...]:
    """C{[server] trusted_proxies}: the peers whose Forwarded and X-Forwarded-For headers are believed."""
    values = checked.take(server.str_list, "trusted_proxies", [], fallback=[])
    good = []
    for index, value in enumerate(values):
        try:
            parse_networks([value])
        except ValueError as e:
            checked.add(ConfigError(f"{server.key('trusted_proxies')}[{index}]", str(e)))
        else:
            good.append(value)
    return parse_networks(good)


def _throttle(section: Section, checked: Problems) -> ThrottlePolicy:
    """The login throttle's limits (C{[throttle]}); see L{ThrottlePolicy}."""
    defaults = ThrottlePolicy()
    values = {
        name: checked.take(section.int, name, getattr(defaults, name), minimum=1, fallback=getattr(defaults, name))
        for name in ("failures_per_pair", "failures_per_address", "failures_per_account",
                     "checks_in_flight", "checks_per_address")
    }
    values.update(_nonzero_durations(section, checked, ("window", "max_delay"), defaults))
    checked.done(section)
    return ThrottlePolicy(**values)


def _rate(section: Section, name: str, default: str) -> Rate | None:
    try:
        return parse_rate(section.str(name, default))
    except ValueError as e:
        raise section.error(name, str(e)) from None


def _rate_limits(section: Section, checked: Problems) -> RateSettings:
    """C{[rate_limits]}: the default per-client rate, the internal API's per-address rate, the exemption."""
    defaults = RateSettings()
    settings = RateSettings(
        default=checked.take(_rate, section, "default", DEFAULT_RATE, fallback=defaults.default),
        internal=checked.take(_rate, section, "internal", DEFAULT_RATE, fallback=defaults.internal),
        exempt_first_party=checked.take(section.bool, "exempt_first_party", False, fallback=False),
    )
    checked.done(section)
    return settings


def _passwords(section: Section, checked: Problems) -> tuple[int, PasswordHashing]:
    """C{[passwords]}: the rules for new passwords and the argon2id parameters of their hashes."""
    length = checked.take(section.int, "min_length", MIN_LENGTH, minimum=MIN_LENGTH, fallback=MIN_LENGTH)
    if length > MAX_LENGTH:
        checked.add(section.error("min_length", f"must be at most {MAX_LENGTH}, the longest password taken"))
        length = MIN_LENGTH
    default = PasswordHashing()
    hashing = PasswordHashing(
        # OWASP's floor (m=7 MiB with t=5) and at most 1 GiB per check.
        memory_kib=checked.take(section.int, "argon2_memory_kib", default.memory_kib, minimum=7168,
                                maximum=1048576, fallback=default.memory_kib),
        time_cost=checked.take(section.int, "argon2_time_cost", default.time_cost, minimum=1, maximum=20,
                               fallback=default.time_cost),
        parallelism=checked.take(section.int, "argon2_parallelism", default.parallelism, minimum=1, maximum=16,
                                 fallback=default.parallelism),
    )
    checked.done(section)
    return length, hashing


def _plugin(section: Section, checked: Problems, default: str | None = None) -> PluginChoice | None:
    """The plugin a section names (C{default} when it names none), or None when that name is mistaken."""
    name = checked.take(section.str, "plugin", default) if default else checked.take(section.str, "plugin")
    return None if name is None else PluginChoice(name, section)


def _identity(section: Section, checked: Problems) -> PluginChoice | None:
    """An C{[[identity]]} backend (the static file unless it names another) with its standing cache."""
    choice = _plugin(section, checked, "static")
    seconds = checked.take(section.duration, "standing_cache", None, maximum=MAX_STANDING_CACHE)
    size = checked.take(section.int, "standing_cache_size", DEFAULT_STANDING_CACHE_SIZE, minimum=1,
                        fallback=DEFAULT_STANDING_CACHE_SIZE)
    return None if choice is None else attrs.evolve(choice, standing_cache=seconds, standing_cache_size=size)


def _uris(section: Section, checked: Problems, name: str) -> list[str]:
    """A client's list of URIs, each mistaken one noted."""
    uris = checked.take(section.str_list, name, [], fallback=[])
    for index, uri in enumerate(uris):
        if problem := redirect_uri_problem(uri):
            checked.add(ConfigError(f"{section.key(name)}[{index}]", problem))
    return uris


def _strong_secret(section: Section, name: str, demo: bool) -> str | None:
    """
    The secret C{name} (from C{NAME_env} or C{NAME_file}), refused when it
    has under 128 bits of entropy, unless the server is a loopback demo.
    """
    source = section.secret_source(name)
    secret = section.secret(name, required=False)
    if secret is not None and not demo and (problem := weak_secret_problem(secret)):
        raise section.error(source, problem)
    return secret


def _admin(section: Section, checked: Problems, demo: bool, internal_secret: str | None,
           internal_listen: tuple[str, ...]) -> AdminSettings:
    """C{[admin]}, every key checked on its own (a bad secret leaves the rest checked); see L{AdminSettings}."""
    source = section.secret_source("secret")
    secret = checked.take(_strong_secret, section, "secret", demo)
    name = checked.take(section.str, "name", ADMIN_ACTOR, fallback=ADMIN_ACTOR)
    if not name.strip() or len(name) > 64 or not name.isprintable():
        checked.add(section.error("name", "must be 1 to 64 printable characters (the actor named in audit events)"))
        name = ADMIN_ACTOR
    listen = tuple(checked.take(section.str_list, "listen", [], fallback=[]))
    serve_on_main = checked.take(section.bool, "serve_on_main", False, fallback=False)
    checked.done(section)
    if secret is not None and internal_secret is not None and hmac.compare_digest(
        secret.encode(), internal_secret.encode()
    ):
        checked.add(section.error(source, "must differ from the internal API secret"))
        secret = None
    if secret is not None and not (listen or internal_listen or serve_on_main):
        checked.add(section.error(
            "listen", "is empty and so is internal.listen: the admin API would be served nowhere"
            " (it is never on the public listener unless admin.serve_on_main = true)"
        ))
    return AdminSettings(secret, name, listen, serve_on_main)


def client_from_config(section: Section, checked: Problems, demo: bool = False,
                       offer: SigningOffer = SigningOffer(), fetching: FetchPolicy = FetchPolicy(),
                       keeper: SecretKeeper | None = None) -> Client | None:
    """
    A client declared in the config file (C{[[clients]]}); C{demo} when the
    public URL is on the loopback interface, where weak secrets are allowed;
    its signing algorithms must be among those C{offer} holds; C{fetching}
    decides which C{jwks_uri} may be fetched; C{keeper} seals the secret of
    a client_secret_jwt client. Every key is checked on its own, each
    mistake noted in C{checked}; an entry with any is no client (None), and
    its keys are checked against each other only once each is right, so that
    one mistake is not blamed again on another key.
    """
    before = len(checked.errors)
    client_id = checked.take(section.str, "client_id", fallback="")
    if client_id and (problem := client_id_problem(client_id)):
        checked.add(section.error("client_id", problem))
    source = section.secret_source("secret")
    secret = checked.take(_strong_secret, section, "secret", demo)
    backchannel = checked.take(section.str, "backchannel_logout_uri", None)
    if backchannel is not None and (backchannel_problem := backchannel_uri_problem(backchannel)):
        checked.add(section.error("backchannel_logout_uri", backchannel_problem))
    flags = {name: checked.take(section.bool, name, False, fallback=False) for name in (
        "end_session_enabled", "first_party", "introspect_any", "require_mfa",
        "require_pushed_authorization_requests", "dpop_bound_access_tokens")}
    jwks_uri = checked.take(section.str, "jwks_uri", None)
    if jwks_uri is not None and (uri_problem := url_problem(jwks_uri, fetching)):
        checked.add(section.error("jwks_uri", uri_problem))
    client = Client(
        client_id=client_id,
        secret_hash=token_hash(secret) if secret is not None else None,
        name=checked.take(section.str, "name", client_id, fallback=client_id),
        redirect_uris=_uris(section, checked, "redirect_uris"),
        post_logout_redirect_uris=_uris(section, checked, "post_logout_redirect_uris"),
        resources=checked.take(section.str_list, "resources", [], fallback=[]),
        backchannel_logout_uri=backchannel,
        grant_types=_grant_types(section, checked),
        source="config",
        refresh_grace=checked.take(section.duration, "refresh_grace", None),
        rate_limit=_rate_limit(section, checked),
        audiences=_uris(section, checked, "audiences"),
        profile=_profile(section, checked),
        **_signing_algorithms(section, checked, offer),
        token_endpoint_auth_method=checked.take(section.str, "token_endpoint_auth_method", None,
                                                choices=AUTH_METHODS),
        jwks=checked.take(section.str, "jwks", None),
        jwks_uri=jwks_uri,
        scopes=checked.take(section.str_list, "scopes", [], fallback=[]),
        **flags,
    )
    checked.done(section)
    if len(checked.errors) > before:
        return None
    if client.token_endpoint_auth_method == CLIENT_SECRET_JWT and secret is not None:
        if len(secret.encode()) < MIN_HMAC_SECRET:
            checked.add(section.error(source,
                                      f"a client_secret_jwt secret needs at least {MIN_HMAC_SECRET} bytes"
                                      " (HS256's key size, RFC 7518 section 3.2)"))
            return None
        if keeper is not None:
            client = attrs.evolve(client, sealed_secret=keeper.seal(client_id, secret))
    if auth_problem := auth_settings_problem(client):
        checked.add(section.error(*auth_problem))
        return None
    return client


def _profile(section: Section, checked: Problems) -> str | None:
    """A client's security profile; C{"none"} (TOML has no null) is the default, no profile."""
    profile = checked.take(section.str, "profile", NO_PROFILE, choices=(NO_PROFILE, *PROFILES), fallback=NO_PROFILE)
    return None if profile == NO_PROFILE else profile


def _par(section: Section, checked: Problems) -> PushedRequestSettings:
    """
    C{[par]}; see L{PushedRequestSettings}. A mistaken C{enabled} stands in
    as on, so that the clients requiring pushed requests are not blamed too.
    """
    required = checked.take(section.bool, "require_pushed_authorization_requests", False, fallback=False)
    enabled = checked.take(section.bool, "enabled", False, fallback=True)
    checked.done(section)
    return PushedRequestSettings(enabled=enabled or required, required=required)


def _signing_algorithms(section: Section, checked: Problems, offer: SigningOffer) -> dict[str, Any]:
    """A client's C{*_signed_response_alg} settings, each one the server can honour."""
    chosen = {}
    for name in SETTINGS:
        default = DEFAULT_ALG if name in TOKEN_SETTINGS else None
        chosen[name] = alg = checked.take(section.str, name, default, fallback=default)
        if (problem := offer.problem(name, alg)) is not None:
            checked.add(section.error(name, problem))
    return chosen


def offered_algorithms(data: dict) -> tuple[str, ...]:
    """
    The algorithms C{[keystore] algorithms} offers, read without taking the
    key (the keystore plugin reads and checks it); RS256 alone, the
    keystores' default, when the file says nothing usable.
    """
    algorithms = _raw(data, "keystore", "algorithms")
    if isinstance(algorithms, str):
        algorithms = [algorithms]
    if not isinstance(algorithms, list) or not all(isinstance(alg, str) for alg in algorithms):
        return (DEFAULT_ALG,)
    return tuple(dict.fromkeys(algorithms))


def _raw(data: dict, table: str, name: str):
    """A value as the file wrote it, when C{table} is a table; None otherwise."""
    section = data.get(table)
    return section.get(name) if isinstance(section, dict) else None


def _access_log(server: Section, raw) -> str:
    """C{[server] access_log}: a format or C{"off"}; C{raw} true or false as before (combined, off)."""
    if isinstance(raw, bool):
        return "combined" if server.bool("access_log") else "off"
    return server.str("access_log", "combined", choices=ACCESS_LOG_FORMATS)


def _log_path(section: Section, name: str, default: str | None) -> str | None:
    """A log file's path, relative to the config file's folder, or C{"-"} for standard output."""
    value = section.str(name, default)
    if value is None or value == "-":
        return value
    return str((section.base_dir / Path(value).expanduser()).resolve())


def _rate_limit(section: Section, checked: Problems) -> str | None:
    """A client's own request rate (C{[[clients]] rate_limit}), checked now."""
    text = checked.take(section.str, "rate_limit", None)
    if text is not None:
        try:
            parse_rate(text)
        except ValueError as e:
            checked.add(section.error("rate_limit", str(e)))
    return text


def _grant_types(section: Section, checked: Problems) -> list[str]:
    """The grants a client may use: any the token endpoint offers, each once."""
    names = checked.take(section.str_list, "grant_types", list(DEFAULT_GRANT_TYPES),
                         fallback=list(DEFAULT_GRANT_TYPES))
    if not names:
        checked.add(section.error("grant_types", "must name at least one grant type"))
    for index, name in enumerate(names):
        if name not in GRANT_TYPES:
            checked.add(ConfigError(f"{section.key('grant_types')}[{index}]",
                                    f"{name!r} is not a grant type this server offers; use {', '.join(GRANT_TYPES)}"))
        elif names.index(name) != index:
            checked.add(ConfigError(f"{section.key('grant_types')}[{index}]", f"{name!r} is listed twice"))
    return names


def _mfa(section: Section, checked: Problems) -> MfaPolicy:
    """
    C{[mfa]}: second factors off, optional or required of everyone, the
    grace to enrol, how recent a sign-in changing factors must be, and how
    many passkeys a user keeps.
    """
    defaults = MfaPolicy()
    required = checked.take(section.str, "required", defaults.required, choices=MFA_CHOICES,
                            fallback=defaults.required)
    enrol_grace = checked.take(section.duration, "enrol_grace", defaults.enrol_grace, fallback=defaults.enrol_grace)
    recent_sign_in = checked.take(section.duration, "recent_sign_in", defaults.recent_sign_in,
                                  fallback=defaults.recent_sign_in)
    if not 60 <= recent_sign_in <= 86400:
        checked.add(section.error("recent_sign_in", "must be between 1m and 1d: time to change factors after signing"
                                                    " in, short enough that a stolen session cookie cannot"))
        recent_sign_in = defaults.recent_sign_in
    max_passkeys = checked.take(section.int, "max_passkeys", defaults.max_passkeys, minimum=1,
                                maximum=PASSKEYS_CEILING, fallback=defaults.max_passkeys)
    checked.done(section)
    return MfaPolicy(required=required, enrol_grace=enrol_grace, recent_sign_in=recent_sign_in,
                     max_passkeys=max_passkeys)


def _device(section: Section, checked: Problems, clients: tuple[Client, ...]) -> DevicePolicy:
    """
    C{[device]}: the device authorization grant (RFC 8628), on when
    C{enabled} says so or, by default, when a C{[[clients]]} entry names it.
    """
    defaults = DevicePolicy()
    wanted = any(DEVICE_CODE_GRANT in client.grant_types for client in clients)
    enabled = checked.take(section.bool, "enabled", wanted, fallback=wanted)
    code_ttl = checked.take(section.duration, "code_ttl", defaults.code_ttl, fallback=defaults.code_ttl)
    if not 60 <= code_ttl <= 3600:
        checked.add(section.error("code_ttl", "must be between 1m and 1h: long enough to type a code, short for"
                                              " guessing"))
        code_ttl = defaults.code_ttl
    interval = checked.take(section.duration, "interval", defaults.interval, fallback=defaults.interval)
    if not 1 <= interval <= 60:
        checked.add(section.error("interval", "must be between 1s and 60s"))
        interval = defaults.interval
    failures_per_address = checked.take(section.int, "user_code_failures_per_address", defaults.failures_per_address,
                                        minimum=1, fallback=defaults.failures_per_address)
    failures = checked.take(section.int, "user_code_failures", defaults.failures, minimum=1,
                            fallback=defaults.failures)
    if wanted and not enabled:
        checked.add(section.error("enabled", f"is false, but a client's grant_types names {DEVICE_CODE_GRANT}"))
    checked.done(section)
    return DevicePolicy(enabled=enabled, code_ttl=code_ttl, interval=interval,
                        failures_per_address=failures_per_address, failures=failures)


def _registration(section: Section, checked: Problems, demo: bool) -> RegistrationPolicy:
    """
    C{[registration]}: who may register a client (RFC 7591), and client ID
    metadata documents. A mistaken token or host list stands in as a policy
    given, so that registration is not also called open.
    """
    defaults = RegistrationPolicy()
    enabled = checked.take(section.bool, "enabled", False, fallback=False)
    token = checked.take(_strong_secret, section, "initial_access_token", demo, fallback="")
    hosts = checked.take(section.str_list, "allowed_redirect_hosts", [], fallback=None)
    for index, pattern in enumerate(hosts or ()):
        if problem := host_pattern_problem(pattern):
            checked.add(ConfigError(f"{section.key('allowed_redirect_hosts')}[{index}]", problem))
    policy = RegistrationPolicy(
        enabled=enabled, initial_access_token=token, allowed_redirect_hosts=tuple(hosts or ()),
        allow_confidential=checked.take(section.bool, "allow_confidential", False, fallback=False),
        rate=checked.take(_rate, section, "rate", REGISTRATION_RATE, fallback=defaults.rate),
        max_clients=checked.take(section.int, "max_clients", DEFAULT_MAX_CLIENTS, minimum=1,
                                 maximum=MAX_REGISTERED_CLIENTS, fallback=DEFAULT_MAX_CLIENTS),
        metadata_documents=checked.take(section.bool, "client_id_metadata_documents", False, fallback=False),
        resources=tuple(checked.take(section.str_list, "resources", [], fallback=[])),
    )
    checked.done(section)
    if enabled and token is None and hosts == []:
        checked.add(section.error("enabled", "open registration needs a policy: set initial_access_token_env (or"
                                             " _file), allowed_redirect_hosts, or both"))
    return policy


def _dpop(section: Section, checked: Problems) -> DpopPolicy | None:
    """
    C{[dpop]}: DPoP offered (RFC 9449), the iat window of proofs and the
    optional server nonce. A mistaken C{enabled} stands in as on, so that
    the clients asking for DPoP are not blamed too.
    """
    defaults = DpopPolicy()
    enabled = checked.take(section.bool, "enabled", False, fallback=True)
    policy = DpopPolicy(
        **_nonzero_durations(section, checked, ("max_age", "nonce_lifetime"), defaults),
        leeway=checked.take(section.duration, "leeway", defaults.leeway, fallback=defaults.leeway),
        use_nonce=checked.take(section.bool, "use_nonce", defaults.use_nonce, fallback=defaults.use_nonce),
    )
    checked.done(section)
    return policy if enabled else None


MIN_HMAC_SECRET = min(HMAC_BITS.values()) // 8


def _client_secrets(section: Section, checked: Problems) -> bytes | None:
    """C{[client_secrets]}: the key of client_secret_jwt secrets (L{authsrv.client_secrets}), if any."""
    source = section.secret_source("encryption_key")
    text = checked.take(section.secret, "encryption_key", required=False)
    checked.done(section)
    if text is None:
        return None
    try:
        return key_from_text(text)
    except ValueError as e:
        checked.add(section.error(source, str(e)))
        return None


def _table(top: Section, checked: Problems, name: str) -> Section:
    """C{[name]}, or an empty one when the file has none (or has something else by that name)."""
    return checked.take(top.table, name, None) or Section({}, name, top.base_dir)


def read_config_document(
    data: dict, path: Path | None, *, listen: str | None = None, public_url_override: tuple[str, str] | None = None
) -> tuple[Config, list[ConfigError]]:
    """
    Validate a parsed TOML document, going on after each mistake: the
    config, with stand-ins for what was mistaken (fit only for checking
    the rest, such as the plugin sections), and every mistake found.
    C{listen} replaces C{server.listen}; C{public_url_override} is a
    (source, value) pair that replaces C{server.public_url}.
    """
    checked = Problems()
    base_dir = path.parent if path else Path.cwd()
    top = Section(data, "", base_dir)
    server = _table(top, checked, "server")
    listeners = tuple(checked.take(server.str_list, "listen", [DEFAULT_LISTEN], fallback=[DEFAULT_LISTEN]))
    if listen is not None:
        listeners = (listen,)
    if not listeners:
        checked.add(server.error("listen", "is empty: the server would listen nowhere; name at least one endpoint"))
        listeners = (DEFAULT_LISTEN,)
    public_url = checked.take(_public_url, server, listeners, public_url_override, fallback=DEFAULT_PUBLIC_URL)
    demo = is_loopback_host(urlsplit(public_url).hostname or "")
    access_log = checked.take(_access_log, server, _raw(data, "server", "access_log"), fallback="off")
    access_log_path = checked.take(_log_path, server, "access_log_path", None) or "-"
    shutdown = _shutdown(server, checked)
    workers = checked.take(server.int, "workers", 1, minimum=1, maximum=MAX_WORKERS, fallback=1)
    hsts_max_age = checked.take(server.duration, "hsts_max_age", HSTS_MAX_AGE, fallback=HSTS_MAX_AGE)
    trusted_proxies = _trusted_proxies(server, checked)
    checked.done(server)
    internal = _table(top, checked, "internal")
    internal_secret = checked.take(_strong_secret, internal, "secret", demo)
    internal_listen = tuple(checked.take(internal.str_list, "listen", [], fallback=[]))
    internal_on_main = checked.take(internal.bool, "serve_on_main", True, fallback=True)
    if not internal_on_main and not internal_listen:
        checked.add(internal.error(
            "serve_on_main", "is false but internal.listen is empty: the internal API would be served nowhere"))
    checked.done(internal)
    admin = _admin(_table(top, checked, "admin"), checked, demo, internal_secret, internal_listen)
    limits_section = _table(top, checked, "limits")
    input_limits = _input_limits(limits_section, checked)
    limits = _limits(limits_section, checked)
    throttle = _throttle(_table(top, checked, "throttle"), checked)
    rate_limits = _rate_limits(_table(top, checked, "rate_limits"), checked)
    audit = _table(top, checked, "audit")
    audit_path = checked.take(_log_path, audit, "path", None)
    checked.done(audit)
    log_section = _table(top, checked, "log")
    log_format = checked.take(log_section.str, "format", None, choices=LOG_FORMATS)
    checked.done(log_section)
    ui = _table(top, checked, "ui")
    show_ban_reason = checked.take(ui.bool, "show_ban_reason", False, fallback=False)
    checked.done(ui)
    password_min_length, password_hashing = _passwords(_table(top, checked, "passwords"), checked)
    mfa = _mfa(_table(top, checked, "mfa"), checked)
    remote_documents = fetch_policy(_table(top, checked, "remote_documents"), checked)
    registration = _registration(_table(top, checked, "registration"), checked, demo)
    dpop = _dpop(_table(top, checked, "dpop"), checked)
    metrics = _table(top, checked, "metrics")
    metrics_listen = tuple(checked.take(metrics.str_list, "listen", [], fallback=[]))
    checked.done(metrics)
    store = _plugin(_table(top, checked, "store"), checked, "sqlite") or PluginChoice("sqlite", Section({}, "store", base_dir))
    keystore = (_plugin(_table(top, checked, "keystore"), checked, "jwk-file")
                or PluginChoice("jwk-file", Section({}, "keystore", base_dir)))
    identity_sections = checked.take(top.tables, "identity", fallback=[])
    identity = tuple(choice for s in identity_sections if (choice := _identity(s, checked)) is not None)
    if not identity_sections:
        identity = (PluginChoice("static", Section({}, "identity[0]", base_dir)),)
    par = _par(_table(top, checked, "par"), checked)
    userinfo = _table(top, checked, "userinfo")
    offer = SigningOffer(offered_algorithms(data), checked.take(userinfo.bool, "signing", False, fallback=False))
    checked.done(userinfo)
    client_secret_key = _client_secrets(_table(top, checked, "client_secrets"), checked)
    keeper = SecretKeeper(client_secret_key) if client_secret_key is not None else None
    clients: list[Client] = []
    for index, section in enumerate(checked.take(top.tables, "clients", fallback=[])):
        client = client_from_config(section, checked, demo, offer, remote_documents, keeper)
        if client is None:
            continue
        for setting, problem in filter(None, (unoffered_push(client, par.enabled),
                                              unoffered_dpop(client, dpop is not None), *profile_problems(client))):
            checked.add(ConfigError(f"clients[{index}].{setting}", problem))
        if any(c.client_id == client.client_id for c in clients):
            checked.add(ConfigError(f"clients[{index}].client_id", f"{client.client_id!r} is declared twice"))
        else:
            clients.append(client)
    chat = chat_config(checked.take(top.table, "chat", None), checked)
    device = _device(_table(top, checked, "device"), checked, tuple(clients))
    checked.done(top)
    config = Config(
        path=path,
        public_url=public_url,
        listen=listeners,
        access_log=access_log,
        internal_secret=internal_secret,
        internal_listen=internal_listen,
        internal_on_main=internal_on_main,
        limits=limits,
        store=store,
        keystore=keystore,
        identity=identity,
        clients=tuple(clients),
        chat=chat,
        input_limits=input_limits,
        shutdown=shutdown,
        workers=workers,
        hsts_max_age=hsts_max_age,
        throttle=throttle,
        show_ban_reason=show_ban_reason,
        rate_limits=rate_limits,
        mfa=mfa,
        par=par,
        device=device,
        remote_documents=remote_documents,
        registration=registration,
        dpop=dpop,
        trusted_proxies=trusted_proxies,
        password_min_length=password_min_length,
        password_hashing=password_hashing,
        metrics_listen=metrics_listen,
        access_log_path=access_log_path,
        audit_path=audit_path,
        log_format=log_format,
        admin=admin,
        signing=offer,
        client_secret_key=client_secret_key,
    )
    return config, checked.errors


def parse_config(
    data: dict, path: Path | None, *, listen: str | None = None, public_url_override: tuple[str, str] | None = None
) -> Config:
    """Validate a parsed TOML document; raises L{ConfigErrors} naming every mistaken key."""
    config, errors = read_config_document(data, path, listen=listen, public_url_override=public_url_override)
    if errors:
        raise ConfigErrors(errors)
    return config


class ConfigFileError(Exception):
    """
    A config file that cannot be used, with a one-line explanation;
    C{problems} holds one line for each mistake in it.
    """

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        super().__init__(message)
        self.problems = problems or (message,)


@frozen
class ConfigSource:
    """A config file and its bytes as read at start: the config in force, whatever the file holds since."""

    path: Path
    data: bytes

    def edited(self) -> bool:
        """Whether the file now holds other bytes (or none that can be read) than the config in force."""
        try:
            return self.path.read_bytes() != self.data
        except OSError:
            return True


def read_config_file(path: Path) -> bytes:
    """A config file's bytes; raises L{ConfigFileError} with one line."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {path}: {e.strerror}") from None


def read_toml(path: Path, source: bytes | None = None) -> dict:
    """
    The TOML document in a config file, or in C{source}, the bytes read from
    it earlier; raises L{ConfigFileError} with one line. A byte order mark,
    which some editors begin UTF-8 files with, is read past: TOML has none.
    """
    try:
        text = (read_config_file(path) if source is None else source).decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path}: not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"{path}: invalid TOML: {e}") from None


def public_url_given(public_url: str | None = None, environ=os.environ) -> tuple[str, str] | None:
    """The public URL from the command line, else C{AUTHSRV_PUBLIC_URL}, with where it came from."""
    if public_url is not None:
        return ("--public-url", public_url)
    if environ.get(PUBLIC_URL_ENV):
        return (PUBLIC_URL_ENV, environ[PUBLIC_URL_ENV])
    return None


def load_config(
    path: Path, *, listen: str | None = None, public_url: str | None = None, environ=os.environ,
    source: bytes | None = None,
) -> Config:
    """
    Read and validate a config file (its bytes C{source} when given: what a
    worker's parent read at start); raises L{ConfigFileError} whose message
    is the first mistake (and how many more there are), one line. The public
    URL comes from C{public_url} (the command line), else
    C{AUTHSRV_PUBLIC_URL}, else the file; C{listen} replaces the file's.
    """
    config, errors = read_config_document(
        read_toml(path, source), path.resolve(), listen=listen, public_url_override=public_url_given(public_url, environ)
    )
    if errors:
        problems = tuple(f"{path}: {e}" for e in errors)
        more = f" (and {len(problems) - 1} more: authsrv-admin check-config lists them all)" if len(problems) > 1 else ""
        raise ConfigFileError(problems[0] + more, problems)
    return config
