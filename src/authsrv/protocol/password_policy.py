"""
The rules a new password must meet, after NIST SP 800-63B (5.1.1.2): a
minimum length, a maximum generous enough for passphrases, no control
character (the sign-in form refuses a NUL, and a browser's password field
takes no line break), not one of the passwords attackers try first, not the
user's own login or email. No composition rules and no expiry; existing
passwords are not checked again.

Every place that sets a password (the operator command, the admin API)
calls L{password_problem}, so the rules are the same everywhere.
"""

from __future__ import annotations

import unicodedata
from functools import cache
from importlib.resources import files

MIN_LENGTH = 8
"""The least a config may ask for (SP 800-63B's floor), and the default."""
MAX_LENGTH = 1024
SELF_MATCH_MIN = 4
"""A login or email local part this long or longer is refused inside a password too."""


@cache
def common_passwords() -> frozenset[str]:
    """The shipped list of common passwords, read once per process (lower case, NFKC)."""
    text = files("authsrv.protocol").joinpath("data/common-passwords.txt").read_text(encoding="utf-8")
    return frozenset(
        _folded(line) for line in text.splitlines() if line and not line.startswith("#")
    )


def _folded(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def _own_names(login: str | None, email: str | None) -> list[str]:
    """The login, the email and the email's local part, folded, empty ones left out."""
    names = [login or "", email or ""]
    if email and "@" in email:
        names.append(email.rsplit("@", 1)[0])
    return [_folded(n) for n in names if n.strip()]


def password_problem(
    password: str, *, login: str | None = None, email: str | None = None, min_length: int = MIN_LENGTH
) -> str | None:
    """
    What is wrong with C{password} as a new password for the user with
    C{login} and C{email}, as a sentence the person can act on; None when
    it may be used. Lengths count characters after NFKC normalisation.
    """
    normalised = unicodedata.normalize("NFKC", password)
    if len(normalised) < min_length:
        return (f"the password must be at least {min_length} characters long"
                f" (it has {len(normalised)}); a few unrelated words make a good one")
    if len(normalised) > MAX_LENGTH:
        return f"the password must be at most {MAX_LENGTH:,} characters long (it has {len(normalised):,})"
    if any(unicodedata.category(c) == "Cc" for c in password):
        return ("the password must not hold control characters (such as NUL, a tab or a line break),"
                " which the sign-in form cannot send")
    folded = normalised.casefold()
    for name in _own_names(login, email):
        if folded == name or (len(name) >= SELF_MATCH_MIN and name in folded):
            return "the password must not contain the user's login or email address; choose another"
    if folded in common_passwords():
        return "the password is one of the most common passwords, which attackers try first; choose another"
    return None
