"""
The settings of a client as an operator writes them (JSON fields of the
admin API, options of the operator command), checked field by field: each
problem names its field.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from authsrv.configsection import parse_duration
from authsrv.flows.grants import GRANT_TYPES
from authsrv.operations.errors import InvalidInput
from authsrv.protocol.client_assertion import public_keyset
from authsrv.protocol.clientauth import AUTH_METHODS
from authsrv.protocol.clients import redirect_uri_problem
from authsrv.protocol.profiles import PROFILES
from authsrv.protocol.rates import parse_rate
from authsrv.protocol.signing import SETTINGS, USERINFO_SETTING
from authsrv.protocol.targets import backchannel_uri_problem

NAME_MAX = 200
LIST_MAX = 50
VALUE_MAX = 2048
GRACE_MAX = 365 * 86400
JWKS_MAX = 16 * 1024

EDITABLE = (
    "name", "redirect_uris", "post_logout_redirect_uris", "backchannel_logout_uri", "first_party",
    "end_session_enabled", "introspect_any", "resources", "audiences", "grant_types", "refresh_grace", "rate_limit",
    "require_mfa", "require_pushed_authorization_requests", "profile", "dpop_bound_access_tokens",
    *SETTINGS,
    "token_endpoint_auth_method", "jwks", "jwks_uri", "scopes",
)
"""What an update may change; a new client takes these and C{client_id}, C{public}."""


_JOINERS = frozenset("\u200c\u200d")
"""The format characters names need: the zero-width non-joiner and joiner (Persian, emoji sequences)."""


def has_controls(text: str) -> bool:
    """
    Whether C{text} holds a control character, a line or paragraph
    separator, a lone surrogate or a format character other than a joiner:
    what no name or reason needs, PostgreSQL cannot store (NUL), or turns a
    name shown on a consent page around (a bidi override). Spaces of every
    kind are text.
    """
    return any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp", "Cf") and c not in _JOINERS for c in text)


def _text(field: str, value: Any, maximum: int = VALUE_MAX) -> str:
    if not isinstance(value, str) or not value or len(value) > maximum:
        raise InvalidInput(f"{field} must be a non-empty string of at most {maximum} characters", field)
    if has_controls(value):
        raise InvalidInput(f"{field} must not hold control characters (such as NUL or a line break)", field)
    return value


def _flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{field} must be true or false", field)
    return value


def _strings(field: str, value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > LIST_MAX:
        raise InvalidInput(f"{field} must be a list of at most {LIST_MAX} strings", field)
    return [_text(field, item) for item in value]


def _uris(field: str, value: Any) -> list[str]:
    uris = _strings(field, value)
    for uri in uris:
        problem = redirect_uri_problem(uri)
        if problem:
            raise InvalidInput(f"{field}: {problem}", field)
    return uris


def _auth_method(field: str, value: Any) -> str | None:
    if value is not None and value not in AUTH_METHODS:
        raise InvalidInput(f"{field} must be one of {', '.join(AUTH_METHODS)}, or null", field)
    return value


def _jwks(field: str, value: Any) -> str | None:
    """A JWK set as a JSON object (or its text), kept as JSON text; null for none."""
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, dict) else None
    if text is None or len(text) > JWKS_MAX:
        raise InvalidInput(f"{field} must be a JWK set object of at most {JWKS_MAX} characters, or null", field)
    try:
        public_keyset(text)
    except ValueError as e:
        raise InvalidInput(f"{field}: {e}", field) from None
    return text


def _optional_text(field: str, value: Any) -> str | None:
    return None if value is None else _text(field, value)


def _backchannel(field: str, value: Any) -> str | None:
    if value is None:
        return None
    problem = backchannel_uri_problem(_text(field, value))
    if problem:
        raise InvalidInput(f"{field}: {problem}", field)
    return value


def _grant_types(field: str, value: Any) -> list[str]:
    names = _strings(field, value)
    if not names:
        raise InvalidInput(f"{field} must name at least one grant type", field)
    for index, name in enumerate(names):
        if name not in GRANT_TYPES:
            raise InvalidInput(f"{field}: {name!r} is not a grant type this server offers; use"
                               f" {', '.join(GRANT_TYPES)}", field)
        if names.index(name) != index:
            raise InvalidInput(f"{field}: {name!r} is listed twice", field)
    return names


def _grace(field: str, value: Any) -> int | None:
    """Seconds, as a whole number or a duration such as C{"30s"}, up to a year; null for the server's default."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = parse_duration(value)
        except ValueError:
            pass
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= GRACE_MAX:
        return value
    raise InvalidInput(f"{field} must be seconds (a whole number) or a duration such as 30s, up to 365d,"
                       " or null", field)


def _rate(field: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        parse_rate(_text(field, value, 32))
    except ValueError as e:
        raise InvalidInput(f"{field}: {e}", field) from None
    return value


def _profile(field: str, value: Any) -> str | None:
    """A security profile the client is held to, or null for none."""
    if value is not None and value not in PROFILES:
        raise InvalidInput(f"{field} must be one of {', '.join(PROFILES)}, or null", field)
    return value


def _alg(field: str, value: Any) -> str | None:
    """An algorithm's name (whether the server offers it is the operation's check); null only for UserInfo."""
    if value is None and field == USERINFO_SETTING:
        return None
    if value is None:
        raise InvalidInput(f"{field} must be an algorithm's name such as RS256", field)
    return _text(field, value, 32)


_CHECKS = {
    "name": lambda f, v: _text(f, v, NAME_MAX),
    "redirect_uris": _uris,
    "post_logout_redirect_uris": _uris,
    "backchannel_logout_uri": _backchannel,
    "first_party": _flag,
    "end_session_enabled": _flag,
    "introspect_any": _flag,
    "resources": _strings,
    "audiences": _uris,
    "grant_types": _grant_types,
    "refresh_grace": _grace,
    "rate_limit": _rate,
    "require_mfa": _flag,
    "require_pushed_authorization_requests": _flag,
    "dpop_bound_access_tokens": _flag,
    "profile": _profile,
    **{setting: _alg for setting in SETTINGS},
    "token_endpoint_auth_method": _auth_method,
    "jwks": _jwks,
    "jwks_uri": _optional_text,
    "scopes": _strings,
}


def checked_settings(data: Any, allowed: tuple[str, ...] = EDITABLE) -> dict[str, Any]:
    """C{data} (a JSON object) with every field checked; an unknown field is refused by name."""
    if not isinstance(data, dict):
        raise InvalidInput("the body must be a JSON object")
    for field in data:
        if field not in allowed:
            raise InvalidInput(f"{field} is not a client setting that can be set here", field)
    return {field: _CHECKS[field](field, value) for field, value in data.items() if field in _CHECKS}
