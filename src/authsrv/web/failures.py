"""
A route's failure that nothing foresaw: a bug, or a plugin that raised
something of its own. It is logged with its traceback and answered 500 in
the form the caller reads (an OAuth error for a relying party, the error
shape of the internal and admin APIs, a page for a browser), never with
Twisted's bare HTML page; the answer names nothing of the failure.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger
from twisted.python.failure import Failure
from werkzeug.exceptions import HTTPException

from authsrv.protocol.errors import ServerError
from authsrv.web.headers import oauth_error

SERVER_ERROR = "server_error"
MESSAGE = "the server failed to answer this request; try again, and tell its operator if this keeps happening"

_log = Logger(namespace="authsrv.web")


def oauth_server_error(request) -> bytes:
    """The 500 of a route that relying parties call: an OAuth error (RFC 6749 section 5.2), no-store."""
    return oauth_error(request, ServerError(MESSAGE))


def unforeseen(request, failure: Failure, answer: Callable[[object], bytes]) -> bytes:
    """
    C{answer(request)}, the site's 500, after logging C{failure} with the
    request's method and path (never its query or body, which may carry a
    secret).
    """
    _log.failure("unforeseen failure answering {method} {path}", failure,
                 method=request.method.decode("latin-1"), path=request.path.decode("latin-1"))
    return answer(request)


def unforeseen_in_klein(request, failure: Failure, answer: Callable[[object], bytes]) -> "bytes | Failure":
    """
    L{unforeseen}, as a Klein app's last error handler: werkzeug's own
    exceptions (a redirect to a rule's canonical form, say) go back to
    Klein, which answers them itself.
    """
    if failure.check(HTTPException):
        return failure
    return unforeseen(request, failure, answer)
