"""What every identity backend does first with a login or password it is given."""

from __future__ import annotations

import unicodedata
from functools import cache

MAX_PASSWORD_BYTES = 64 * 1024
"""
The longest password (in UTF-8 bytes) a backend checks: far more than a
new password may have (1024 characters), the sign-in form's limit too,
and less than a directory takes in one request before it drops the
connection (slapd's 256 KiB). A longer one is no user's password, refused
without hashing or binding, so a megabyte costs nothing and is no outage.
"""


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


def password_bytes(password: str | bytes) -> bytes:
    """
    A password as the bytes hashes are made of: text as UTF-8, a lone
    surrogate kept (surrogatepass), so that text that is not valid Unicode
    still costs a full check and matches nothing instead of failing.
    """
    return password.encode("utf-8", "surrogatepass") if isinstance(password, str) else password



MAX_LOGIN_BYTES = 8192
"""The longest login (in UTF-8 bytes) sign-in looks up: far more than any login (a new one has at most 256 characters)."""


def impossible_credential(value: str, max_bytes: int) -> str | None:
    """
    Why no user can have C{value} as a login or password, as the sign-in
    form read it: C{"text"} (not UTF-8), C{"nul"} (a NUL character, which
    no backend stores) or C{"long"} (over C{max_bytes}); None for any
    other. The form says so without checking it: no guess can come of it,
    so no failure is counted either.
    """
    if credential_text(value) is None:
        return "text"
    if "\x00" in value:
        return "nul"
    if len(password_bytes(value)) > max_bytes:
        return "long"
    return None


@cache
def _width_table() -> dict[int, str]:
    """Each full-width and half-width form (all in the BMP) to its decomposition, for L{str.translate}."""
    table = {}
    for code in range(0x10000):
        kind, _, target = unicodedata.decomposition(chr(code)).partition(" ")
        if kind in ("<wide>", "<narrow>"):
            table[code] = "".join(chr(int(part, 16)) for part in target.split())
    return table


def width_mapped(login: str) -> str:
    """
    C{login} as RFC 8265 prepares a username (sections 3.3.1 and 3.4.1,
    width mapping): full-width and half-width forms as their
    decompositions, so that C{ａｌｉｃｅ} is C{alice}; in NFC when that
    changed it (a half-width voiced mark becomes a combining one).
    """
    mapped = login.translate(_width_table())
    return login if mapped == login else unicodedata.normalize("NFC", mapped)


def look_alike_key(login: str) -> str:
    """
    The form in which two logins look alike: NFKC, case-folded, NFKC again
    (Unicode's NFKC_Casefold, near enough), which maps what RFC 8265's
    UsernameCaseMapped profile maps (width, case) and folds what it
    disallows (ligatures, font, circled or superscript forms): C{ａｌｉｃｅ},
    C{ALICE} and C{ﬁle} are C{alice}, C{alice} and C{file}.
    """
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", login).casefold())
