"""
Which JWS algorithms the server signs with, and which of them a client may
ask for (OIDC Dynamic Client Registration 1.0 section 2: the client's
C{id_token_signed_response_alg} and C{userinfo_signed_response_alg}; and
C{access_token_signed_response_alg}, this server's name for the same choice
over RFC 9068 JWT access tokens). The keystore offers the algorithms its
config lists; a client may only choose among those, so that discovery
never lists what cannot be produced. Pure: values in, values out.
"""

from __future__ import annotations

import hashlib

from attrs import frozen

ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")
"""Every algorithm a keystore can be configured to sign with; RS256 is always offered (OIDC Core 15.1)."""

DEFAULT_ALG = "RS256"

HASHES = {"RS256": hashlib.sha256, "PS256": hashlib.sha256, "ES256": hashlib.sha256, "EdDSA": hashlib.sha512}
"""The hash of each algorithm, for at_hash (EdDSA with Ed25519: SHA-512)."""

TOKEN_SETTINGS = ("id_token_signed_response_alg", "access_token_signed_response_alg")
"""The client settings that choose a token's algorithm; RS256 when not set."""
USERINFO_SETTING = "userinfo_signed_response_alg"
"""The client setting that asks for signed UserInfo responses; JSON when not set."""
SETTINGS = (*TOKEN_SETTINGS, USERINFO_SETTING)


@frozen
class SigningOffer:
    """
    What the server can sign: C{algorithms}, its keystore's; C{userinfo},
    whether UserInfo answers may be signed at all (C{[userinfo] signing}).
    """

    algorithms: tuple[str, ...] = (DEFAULT_ALG,)
    userinfo: bool = False

    def problem(self, setting: str, alg: str | None) -> str | None:
        """What is wrong with a client's C{setting} being C{alg}, or None."""
        if alg is None:
            return None if setting == USERINFO_SETTING else "must be set"
        if setting == USERINFO_SETTING and not self.userinfo:
            return (
                "needs signed UserInfo responses, which this server does not offer:"
                " set [userinfo] signing = true first"
            )
        if alg not in ALGORITHMS:
            return f"{alg!r} is not a signing algorithm; choose among {', '.join(ALGORITHMS)}"
        if alg not in self.algorithms:
            return (
                f"{alg} is not offered by this server: add it to [keystore] algorithms"
                f" (now {', '.join(self.algorithms)}) or choose among those"
            )
        return None

    def problems(self, client) -> list[tuple[str, str]]:
        """Each of C{client}'s algorithm settings that cannot be honoured, with what is wrong."""
        return [
            (setting, problem)
            for setting in SETTINGS
            if (problem := self.problem(setting, getattr(client, setting))) is not None
        ]
