"""
The access log (C{[server] access_log}): one line per request, in the
Apache/NCSA combined format or as JSON, with the client's address as the
flows see it (behind trusted proxies, the forwarded one) and query strings
redacted, in the request target and the Referer alike: only the values of
L{SHOWN} parameters are written, every other value is C{[redacted]}, so no
code, token, state, hint or secret reaches the file.

It is on the hot path: a line is formatted with no per-request dict and
written to a buffered L{LineFile}, flushed once a second.
"""

from __future__ import annotations

import json
import re
import time

from authsrv.isotime import iso_utc_ms
from authsrv.logfile import LineFile
from authsrv.web.forms import client_address_of

SHOWN = frozenset(
    b"response_type client_id redirect_uri scope prompt max_age code_challenge_method ui_locales"
    b" response_mode display claims_locales grant_type token_type_hint post_logout_redirect_uri error"
    b" error_description".split()
)
"""
Parameters whose values are no secret and help an operator read the log. Not C{request}: a
request object carries the request's other parameters (state, nonce, login_hint, id_token_hint),
readable by anyone who decodes it, whatever this list redacts.
"""
REDACTED = b"[redacted]"

_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(0x20), *range(0x7F, 0xA0))}
"""C0 and C1 controls (NEL and CSI among them, which terminals and line readers act on), escaped."""
_PAIRS = re.compile(rb"(&)")
"""
Query pairs end at '&' alone, as L{authsrv.web.request.parse_query} reads
them: a ';' is data, so what follows one is part of the value before it
(a client's state C{xyz;error=...}), never a parameter of its own to show.
"""
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def redact_target(target: bytes) -> bytes:
    """C{target} (a path with its query, or a whole URL) with every value not in L{SHOWN} replaced."""
    path, mark, query = target.partition(b"?")
    if not mark:
        return target
    query, hash_mark, _ = query.partition(b"#")
    kept = []
    for piece in _PAIRS.split(query):
        if piece == b"&":
            kept.append(piece)
            continue
        name, equals, value = piece.partition(b"=")
        shown = name in SHOWN and b";" not in value  # a client that took ';' for a separator sent more in it
        kept.append(piece if shown else name + b"=" + REDACTED if equals else REDACTED)
    return path + b"?" + b"".join(kept) + (b"#" + REDACTED if hash_mark else b"")


def log_text(value: bytes | None) -> str:
    """Header and target bytes as log text: quotes, backslashes and control characters escaped."""
    if not value:
        return "-"
    text = value.decode("latin-1")
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return text.translate(_ESCAPES)


class AccessLog:
    """Writes one line per finished request to C{file}, in C{format} C{"combined"} or C{"json"}."""

    def __init__(self, file: LineFile, format: str, trusted_proxies=()):
        self.file = file
        self._trusted_proxies = trusted_proxies
        self._line = self._combined if format == "combined" else self._json

    def __call__(self, request, timestamp: str) -> None:
        """C{timestamp}: the site's cached C{[day/month/year:time zone]} of the current second."""
        self.file.write(self._line(request, timestamp))

    def _combined(self, request, timestamp: str) -> str:
        headers = request.requestHeaders
        referrer = headers.getRawHeaders(b"referer")
        agent = headers.getRawHeaders(b"user-agent")
        return '%s - - %s "%s %s %s" %d %s "%s" "%s"\n' % (
            client_address_of(request, self._trusted_proxies),
            timestamp,
            log_text(request.method),
            log_text(redact_target(request.uri)),
            log_text(request.clientproto),
            request.code,
            request.sentLength or "-",
            log_text(redact_target(referrer[0])) if referrer else "-",
            log_text(agent[0]) if agent else "-",
        )

    def _json(self, request, timestamp: str) -> str:
        headers = request.requestHeaders
        referrer = headers.getRawHeaders(b"referer")
        agent = headers.getRawHeaders(b"user-agent")
        return json.dumps({
            "time": iso_utc_ms(time.time()),
            "address": client_address_of(request, self._trusted_proxies),
            "method": request.method.decode("latin-1"),
            "target": redact_target(request.uri).decode("latin-1"),
            "protocol": request.clientproto.decode("latin-1"),
            "status": request.code,
            "bytes": request.sentLength,
            "referrer": redact_target(referrer[0]).decode("latin-1") if referrer else None,
            "user_agent": agent[0].decode("latin-1") if agent else None,
        }, separators=(",", ":")) + "\n"
