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
from authsrv.configsection import Problems, Section
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


def _url(section: Section, checked: Problems, name: str, default: str) -> str:
    """An absolute https URL (plain http only on the loopback interface); a mistaken one stands in as C{default}."""
    url = checked.take(section.str, name, default, fallback=default)
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as e:
        checked.add(section.error(name, f"{url!r} is not a valid URL ({e})"))
        return default
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        checked.add(section.error(name, f"{url!r} must be an absolute http(s) URL without a fragment"))
        return default
    if parts.scheme == "http" and not is_loopback_host(parts.hostname):
        checked.add(section.error(name, "must use https (plain http is only for the loopback interface)"))
        return default
    return url


def _revocation(section: Section, checked: Problems) -> dict[str, str]:
    """The C{revocation_url} key when given; without it the class default applies."""
    return {"revocation_url": _url(section, checked, "revocation_url", "")} if section.has("revocation_url") else {}


def _positive(section: Section, checked: Problems, name: str, default: int) -> int:
    value = checked.take(section.duration, name, default, fallback=default)
    if value <= 0:
        checked.add(section.error(name, "must be longer than zero"))
        return default
    return value


def chat_config(section: Section | None, checked: Problems) -> ChatConfig | None:
    """
    Validate the C{[chat]} table, noting each mistake in C{checked}: None
    when the file has none (no chat platform at all), or when its
    encryption key is mistaken (nothing could stand in for it).
    """
    if section is None:
        return None
    provider = checked.take(section.str, "provider", "discord", fallback="discord")
    client_id = checked.take(section.str, "client_id", None, fallback="")
    client_secret = checked.take(section.secret, "client_secret", required=client_id is not None)
    if client_id is None and client_secret is not None:
        checked.add(section.error("client_id", "is required when a client secret is given"))
    key_source = section.secret_source("encryption_key")
    raw_key = checked.take(section.secret, "encryption_key")
    key = None
    if raw_key is not None:
        try:
            key = key_from_text(raw_key)
        except ValueError as e:
            checked.add(section.error(key_source, str(e)))
    config = ChatConfig(
        encryption_key=key or b"",
        provider=provider,
        client_id=client_id,
        client_secret=client_secret,
        authorize_url=_url(section, checked, "authorize_url", DISCORD_AUTHORIZE_URL),
        token_url=_url(section, checked, "token_url", DISCORD_TOKEN_URL),
        user_url=_url(section, checked, "user_url", DISCORD_USER_URL),
        **_revocation(section, checked),
        scopes=checked.take(section.str_list, "scopes", list(DEFAULT_SCOPES), fallback=list(DEFAULT_SCOPES)),
        pkce=checked.take(section.bool, "pkce", True, fallback=True),
        refresh_margin=checked.take(section.duration, "refresh_margin", 300, fallback=300),
        timeout=_positive(section, checked, "timeout", 10),
        lock_ttl=_positive(section, checked, "lock_ttl", 30),
    )
    checked.done(section)
    if any(" " in scope for scope in config.scopes):
        checked.add(section.error("scopes", "each scope is one word; give them as an array"))
    if config.lock_ttl <= config.timeout:
        checked.add(section.error(
            "lock_ttl",
            f"must be longer than timeout ({config.timeout}s), so that a refresh ends before its lock does",
        ))
    return config if key is not None else None
