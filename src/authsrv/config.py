"""
The server's TOML config file, read strictly into frozen values.

Plugin sections (C{[store]}, C{[keystore]}, C{[[identity]]}) are checked here
only for their C{plugin} name; the rest of each is handed to that plugin's
factory, which validates it with the same L{Section} rules.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from attrs import field, frozen

from authsrv.chat.config import ChatConfig, chat_config
from authsrv.configsection import ConfigError, Section
from authsrv.flows.grants import GRANT_TYPES
from authsrv.flows.mfa import MFA_CHOICES, MfaPolicy
from authsrv.flows.ratelimit import DEFAULT_RATE, RateSettings
from authsrv.protocol.clients import CLIENT_ID_MAX, client_id_problem, is_loopback_host, redirect_uri_problem
from authsrv.protocol.forwarded import Network, parse_networks
from authsrv.protocol.rates import Rate, parse_rate
from authsrv.protocol.targets import backchannel_uri_problem
from authsrv.records import DEFAULT_GRANT_TYPES, Client, ThrottlePolicy
from authsrv.tokens import token_hash, weak_secret_problem

DEFAULT_LISTEN = "tcp:8080:interface=127.0.0.1"
DEFAULT_PUBLIC_URL = "http://127.0.0.1:8080"
ISSUER_PATH = "/api/auth"
HSTS_MAX_AGE = 365 * 86400


@frozen
class Limits:
    """Lifetimes and sizes (DESIGN.md, Limits), all in seconds or bytes."""

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
    What one client may send and how slowly (C{[limits]}, DESIGN.md, Limits):
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


@frozen
class PluginChoice:
    """A configured plugin: its name and the rest of its section."""

    name: str
    section: Section


@frozen
class Config:
    path: Path | None
    public_url: str
    listen: tuple[str, ...]
    access_log: bool
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
    hsts_max_age: int = HSTS_MAX_AGE
    trusted_proxies: tuple[Network, ...] = ()
    throttle: ThrottlePolicy = ThrottlePolicy()
    show_ban_reason: bool = False
    rate_limits: RateSettings = RateSettings()
    mfa: MfaPolicy = MfaPolicy()

    @property
    def issuer(self) -> str:
        return self.public_url + ISSUER_PATH

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()


def _public_url(section: Section) -> str:
    url = section.str("public_url", DEFAULT_PUBLIC_URL).rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as e:
        raise section.error("public_url", f"{url!r} is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise section.error("public_url", f"{url!r} must be an absolute http(s) URL")
    if parts.query or parts.fragment or "#" in url or "?" in url:
        raise section.error("public_url", "must not have a query or fragment")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise section.error(
            "public_url", "must use https (plain http is only for the loopback interface)"
        )
    return url


def _limits(section: Section) -> Limits:
    defaults = Limits()
    values = {
        name: section.duration(name, getattr(defaults, name))
        for name in (
            "code_ttl",
            "access_token_ttl",
            "id_token_ttl",
            "refresh_token_idle_ttl",
            "refresh_token_absolute_ttl",
            "refresh_grace",
            "refresh_grace_public",
            "session_ttl",
            "pending_request_ttl",
            "login_request_ttl",
        )
    }
    values["max_body_bytes"] = section.int("max_body_bytes", defaults.max_body_bytes, minimum=1024)
    values["pending_per_address"] = section.int("pending_per_address", defaults.pending_per_address, minimum=0)
    section.done()
    for name, value in values.items():
        if value == 0 and name.endswith("_ttl"):
            raise section.error(name, "must be longer than zero")
    return Limits(**values)


def _input_limits(section: Section) -> InputLimits:
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
    values = {name: section.int(name, getattr(defaults, name), minimum=low) for name, low in sizes.items()}
    for name in ("header_timeout", "body_timeout", "idle_timeout"):
        values[name] = section.duration(name, getattr(defaults, name))
        if values[name] == 0:
            raise section.error(name, "must be longer than zero")
    if values["max_query_bytes"] > values["max_request_line"]:
        raise section.error("max_query_bytes", "must not exceed max_request_line")
    caps = section.table("parameters", None)
    parameters = dict(PARAMETER_CAPS)
    if caps is not None:
        for name in PARAMETER_CAPS:
            parameters[name] = caps.int(name, PARAMETER_CAPS[name], minimum=16)
        caps.done()
    return InputLimits(**values, parameters=parameters)


def _shutdown(section: Section) -> Shutdown:
    """C{[server] drain_delay} and C{drain_timeout}."""
    defaults = Shutdown()
    return Shutdown(
        delay=section.duration("drain_delay", defaults.delay),
        timeout=section.duration("drain_timeout", defaults.timeout),
    )


def _trusted_proxies(server: Section) -> tuple[Network, ...]:
    """C{[server] trusted_proxies}: the peers whose Forwarded and X-Forwarded-For headers are believed."""
    values = server.str_list("trusted_proxies", [])
    for index, value in enumerate(values):
        try:
            parse_networks([value])
        except ValueError as e:
            raise ConfigError(f"{server.key('trusted_proxies')}[{index}]", str(e)) from None
    return parse_networks(values)


def _throttle(section: Section) -> ThrottlePolicy:
    """The login throttle's limits (C{[throttle]}); see L{ThrottlePolicy}."""
    defaults = ThrottlePolicy()
    values = {
        name: section.int(name, getattr(defaults, name), minimum=1)
        for name in ("failures_per_pair", "failures_per_address", "failures_per_account",
                     "checks_in_flight", "checks_per_address")
    }
    for name in ("window", "max_delay"):
        values[name] = section.duration(name, getattr(defaults, name))
        if values[name] == 0:
            raise section.error(name, "must be longer than zero")
    section.done()
    return ThrottlePolicy(**values)


def _rate(section: Section, name: str, default: str) -> Rate | None:
    try:
        return parse_rate(section.str(name, default))
    except ValueError as e:
        raise section.error(name, str(e)) from None


def _rate_limits(section: Section) -> RateSettings:
    """C{[rate_limits]}: the default per-client rate, the internal API's per-address rate, the exemption."""
    settings = RateSettings(
        default=_rate(section, "default", DEFAULT_RATE),
        internal=_rate(section, "internal", DEFAULT_RATE),
        exempt_first_party=section.bool("exempt_first_party", False),
    )
    section.done()
    return settings


def _plugin(section: Section, default: str | None = None) -> PluginChoice:
    return PluginChoice(section.str("plugin", default) if default else section.str("plugin"), section)


def _uris(section: Section, name: str, required: bool) -> list[str]:
    uris = section.str_list(name) if required else section.str_list(name, [])
    for index, uri in enumerate(uris):
        problem = redirect_uri_problem(uri)
        if problem:
            raise ConfigError(f"{section.key(name)}[{index}]", problem)
    return uris


def _strong_secret(section: Section, name: str, demo: bool) -> str | None:
    """
    The secret C{name} (from C{NAME_env} or C{NAME_file}), refused when it
    has under 128 bits of entropy, unless the server is a loopback demo.
    """
    source = f"{name}_env" if section.has(f"{name}_env") else f"{name}_file"
    secret = section.secret(name, required=False)
    if secret is not None and not demo and (problem := weak_secret_problem(secret)):
        raise section.error(source, problem)
    return secret


def client_from_config(section: Section, demo: bool = False) -> Client:
    """
    A client declared in the config file (C{[[clients]]}); C{demo} when the
    public URL is on the loopback interface, where weak secrets are allowed.
    """
    client_id = section.str("client_id")
    problem = client_id_problem(client_id)
    if problem:
        raise section.error("client_id", problem)
    secret = _strong_secret(section, "secret", demo)
    backchannel = section.str("backchannel_logout_uri", None)
    if backchannel is not None and (backchannel_problem := backchannel_uri_problem(backchannel)):
        raise section.error("backchannel_logout_uri", backchannel_problem)
    client = Client(
        client_id=client_id,
        secret_hash=token_hash(secret) if secret is not None else None,
        name=section.str("name", client_id),
        redirect_uris=_uris(section, "redirect_uris", True),
        post_logout_redirect_uris=_uris(section, "post_logout_redirect_uris", False),
        end_session_enabled=section.bool("end_session_enabled", False),
        first_party=section.bool("first_party", False),
        resources=section.str_list("resources", []),
        introspect_any=section.bool("introspect_any", False),
        backchannel_logout_uri=backchannel,
        grant_types=_grant_types(section),
        source="config",
        refresh_grace=section.duration("refresh_grace", None),
        rate_limit=_rate_limit(section),
        audiences=_uris(section, "audiences", False),
        require_mfa=section.bool("require_mfa", False),
    )
    section.done()
    return client


def _rate_limit(section: Section) -> str | None:
    """A client's own request rate (C{[[clients]] rate_limit}), checked now."""
    text = section.str("rate_limit", None)
    if text is not None:
        try:
            parse_rate(text)
        except ValueError as e:
            raise section.error("rate_limit", str(e)) from None
    return text


def _grant_types(section: Section) -> list[str]:
    """The grants a client may use: any the token endpoint offers, each once."""
    names = section.str_list("grant_types", list(DEFAULT_GRANT_TYPES))
    if not names:
        raise section.error("grant_types", "must name at least one grant type")
    for index, name in enumerate(names):
        if name not in GRANT_TYPES:
            raise ConfigError(f"{section.key('grant_types')}[{index}]",
                              f"{name!r} is not a grant type this server offers; use {', '.join(GRANT_TYPES)}")
        if names.index(name) != index:
            raise ConfigError(f"{section.key('grant_types')}[{index}]", f"{name!r} is listed twice")
    return names


def _mfa(section: Section) -> MfaPolicy:
    """C{[mfa]}: second factors off, optional or required of everyone, and the grace to enrol."""
    defaults = MfaPolicy()
    policy = MfaPolicy(
        required=section.str("required", defaults.required, choices=MFA_CHOICES),
        enrol_grace=section.duration("enrol_grace", defaults.enrol_grace),
    )
    section.done()
    return policy


def parse_config(data: dict, path: Path | None) -> Config:
    """Validate a parsed TOML document; raises L{ConfigError} naming the key."""
    base_dir = path.parent if path else Path.cwd()
    top = Section(data, "", base_dir)
    server = top.table("server", None) or Section({}, "server", base_dir)
    public_url = _public_url(server)
    demo = is_loopback_host(urlsplit(public_url).hostname or "")
    listen = tuple(server.str_list("listen", [DEFAULT_LISTEN]))
    access_log = server.bool("access_log", False)
    shutdown = _shutdown(server)
    hsts_max_age = server.duration("hsts_max_age", HSTS_MAX_AGE)
    trusted_proxies = _trusted_proxies(server)
    server.done()
    internal = top.table("internal", None) or Section({}, "internal", base_dir)
    internal_secret = _strong_secret(internal, "secret", demo)
    internal_listen = tuple(internal.str_list("listen", []))
    internal_on_main = internal.bool("serve_on_main", True)
    if not internal_on_main and not internal_listen:
        raise internal.error("serve_on_main", "is false but internal.listen is empty: the internal API would be served nowhere")
    internal.done()
    limits_section = top.table("limits", None) or Section({}, "limits", base_dir)
    input_limits = _input_limits(limits_section)
    limits = _limits(limits_section)
    throttle = _throttle(top.table("throttle", None) or Section({}, "throttle", base_dir))
    rate_limits = _rate_limits(top.table("rate_limits", None) or Section({}, "rate_limits", base_dir))
    ui = top.table("ui", None) or Section({}, "ui", base_dir)
    show_ban_reason = ui.bool("show_ban_reason", False)
    ui.done()
    mfa = _mfa(top.table("mfa", None) or Section({}, "mfa", base_dir))
    store = _plugin(top.table("store", None) or Section({}, "store", base_dir), "sqlite")
    keystore = _plugin(top.table("keystore", None) or Section({}, "keystore", base_dir), "jwk-file")
    identity = tuple(_plugin(s) for s in top.tables("identity"))
    if not identity:
        identity = (PluginChoice("static", Section({}, "identity[0]", base_dir)),)
    clients = tuple(client_from_config(s, demo) for s in top.tables("clients"))
    chat = chat_config(top.table("chat", None))
    seen: set[str] = set()
    for index, client in enumerate(clients):
        if client.client_id in seen:
            raise ConfigError(f"clients[{index}].client_id", f"{client.client_id!r} is declared twice")
        seen.add(client.client_id)
    top.done()
    return Config(
        path=path,
        public_url=public_url,
        listen=listen,
        access_log=access_log,
        internal_secret=internal_secret,
        internal_listen=internal_listen,
        internal_on_main=internal_on_main,
        limits=limits,
        store=store,
        keystore=keystore,
        identity=identity,
        clients=clients,
        chat=chat,
        input_limits=input_limits,
        shutdown=shutdown,
        hsts_max_age=hsts_max_age,
        throttle=throttle,
        show_ban_reason=show_ban_reason,
        rate_limits=rate_limits,
        mfa=mfa,
        trusted_proxies=trusted_proxies,
    )


class ConfigFileError(Exception):
    """A config file that cannot be used, with a one-line explanation."""


def load_config(path: Path) -> Config:
    """Read and validate a config file; raises L{ConfigFileError} with one line."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{path}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigFileError(f"{path}: invalid TOML: {e}") from None
    try:
        return parse_config(data, path.resolve())
    except ConfigError as e:
        raise ConfigFileError(f"{path}: {e}") from None
