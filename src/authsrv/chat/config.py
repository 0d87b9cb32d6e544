"""
The C{[chat]} section: which chat platform users link, how to reach it, and
the key that encrypts its tokens at rest (docs/design.md, Linked chat accounts).

Endpoints are configurable so that tests and operators can point at any
OAuth 2 provider, such as L{authsrv.testing.fake_chat}. Without C{client_id}
nothing can be linked or refreshed, but links already stored are still
served while their token is fresh.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from attrs import field, frozen

from authsrv.chat.crypto import key_from_text
from authsrv.configsection import Section
from authsrv.protocol.clients import is_loopback_host

DISCORD_AUTHORIZE_URL = "https://discord.com/oauth2/authorize"
DISCORD_TOKEN_URL = "https://discord.com/api/oauth2/token"
DISCORD_USER_URL = "https://discord.com/api/users/@me"
DISCORD_REVOCATION_URL = "https://discord.com/api/oauth2/token/revoke"
DEFAULT_SCOPES = ("identify", "guilds.join")


def _tuple(value) -> tuple:
    return tuple(value)


@frozen
class ChatConfig:
    """The parsed C{[chat]} section; durations in seconds."""

    encryption_key: bytes = field(repr=False)
    provider: str = "discord"
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    authorize_url: str = DISCORD_AUTHORIZE_URL
    token_url: str = DISCORD_TOKEN_URL
    user_url: str = DISCORD_USER_URL
    revocation_url: str | None = field()
    scopes: tuple[str, ...] = field(default=DEFAULT_SCOPES, converter=_tuple)
    pkce: bool = True
    refresh_margin: int = 300
    timeout: int = 10
    lock_ttl: int = 30

    @revocation_url.default
    def _discord_revocation(self) -> str | None:
        """Discord's RFC 7009 endpoint while the token endpoint is Discord's; no guess for another provider."""
        return DISCORD_REVOCATION_URL if self.token_url == DISCORD_TOKEN_URL else None

    @property
    def can_link(self) -> bool:
        """Whether a provider client is configured (linking and refreshing possible)."""
        return self.client_id is not None


def _url(section: Section, name: str, default: str) -> str:
    """An absolute https URL (plain http only on the loopback interface)."""
    url = section.str(name, default)
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as e:
        raise section.error(name, f"{url!r} is not a valid URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise section.error(name, f"{url!r} must be an absolute http(s) URL without a fragment")
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        raise section.error(name, "must use https (plain http is only for the loopback interface)")
    return url


def _revocation(section: Section) -> dict[str, str]:
    """The C{revocation_url} key when given; without it the class default applies."""
    return {"revocation_url": _url(section, "revocation_url", "")} if section.has("revocation_url") else {}


def _positive(section: Section, name: str, default: int) -> int:
    value = section.duration(name, default)
    if value <= 0:
        raise section.error(name, "must be longer than zero")
    return value


def chat_config(section: Section | None) -> ChatConfig | None:
    """
    Validate the C{[chat]} table (None when the file has none: no chat
    platform at all); raises L{authsrv.configsection.ConfigError} naming the
    key.
    """
    if section is None:
        return None
    provider = section.str("provider", "discord")
    client_id = section.str("client_id", None)
    client_secret = section.secret("client_secret", required=client_id is not None)
    if client_id is None and client_secret is not None:
        raise section.error("client_id", "is required when a client secret is given")
    raw_key = section.secret("encryption_key")
    try:
        key = key_from_text(raw_key)
    except ValueError as e:
        raise section.error("encryption_key", str(e)) from None
    config = ChatConfig(
        encryption_key=key,
        provider=provider,
        client_id=client_id,
        client_secret=client_secret,
        authorize_url=_url(section, "authorize_url", DISCORD_AUTHORIZE_URL),
        token_url=_url(section, "token_url", DISCORD_TOKEN_URL),
        user_url=_url(section, "user_url", DISCORD_USER_URL),
        **_revocation(section),
        scopes=section.str_list("scopes", list(DEFAULT_SCOPES)),
        pkce=section.bool("pkce", True),
        refresh_margin=section.duration("refresh_margin", 300),
        timeout=_positive(section, "timeout", 10),
        lock_ttl=_positive(section, "lock_ttl", 30),
    )
    section.done()
    if any(" " in scope for scope in config.scopes):
        raise section.error("scopes", "each scope is one word; give them as an array")
    if config.lock_ttl <= config.timeout:
        raise section.error(
            "lock_ttl",
            f"must be longer than timeout ({config.timeout}s), so that a refresh ends before its lock does",
        )
    return config
