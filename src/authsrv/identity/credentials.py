"""What every identity backend does first with a login or password it is given."""

from __future__ import annotations


def credential_text(value: str | bytes) -> str | None:
    """
    A credential field as text, or None for what no user can have: bytes
    that are not UTF-8 and strings with lone surrogates. twisted.cred hands
    over bytes; the login form hands over text.
    """
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value
