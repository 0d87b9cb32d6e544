"""
The site's root: exact paths of static documents and of the hottest routes
answer from a dict lookup, everything else goes to the Klein applications.
"""

from __future__ import annotations

from twisted.web.resource import Resource

from authsrv.config import InputLimits
from authsrv.web.admin import PREFIX as ADMIN_PATH
from authsrv.web.limits import INTERNAL_PREFIX, Refused, parameter_caps, parameter_problem
from authsrv.web.routes import ExactPaths

ADMIN_PREFIX = (ADMIN_PATH + "/").encode()
TOO_LARGE = Refused(413, "the request body is too large", close=True)
"""413 for a body over the limit (L{authsrv.web.request.BoundedRequest})."""
NOT_TEXT = Refused(400, "the path is not UTF-8 text once its %-escapes are decoded")
"""
400 for a path Klein could not route: it answers one in plain text and logs
a critical failure with a traceback, which any caller could fill the log with.
"""


def _text_path(segments: list[bytes]) -> bool:
    """Whether a request's path segments (%-decoded, as twisted.web splits them) are UTF-8, as Klein needs."""
    try:
        b"/".join(segments).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _leaves(resource: Resource | None) -> dict[bytes, Resource]:
    return resource.leaves if isinstance(resource, ExactPaths) else {}


def _router(resource: Resource | None) -> Resource | None:
    return resource.router if isinstance(resource, ExactPaths) else resource


class Root(Resource):
    """
    Dispatches on the whole request path before any routing, so discovery,
    JWKS and the hottest routes of C{app} and C{internal} (their
    L{ExactPaths} leaves) cost one dict lookup (docs/design.md, Speed
    targets). Oversized bodies and parameters over C{limits} are refused
    before any routing too.
    """

    def __init__(
        self, static: dict[bytes, Resource], app: Resource, internal: Resource | None = None,
        limits: InputLimits = InputLimits(), admin: Resource | None = None,
    ):
        super().__init__()
        self._exact = {**_leaves(internal), **_leaves(app), **static}
        self._app = _router(app)
        self._internal = _router(internal)
        self._admin = admin
        self._max_fields = limits.max_form_fields
        self._caps = parameter_caps(limits)

    def getChildWithDefault(self, name, request):
        if getattr(request, "body_too_large", False):
            return TOO_LARGE
        if request.args:
            problem = parameter_problem(request.args, self._max_fields, self._caps)
            if problem is not None:
                return Refused(400, problem)
        exact = self._exact.get(request.path)
        if exact is not None:
            return exact
        request.postpath.insert(0, request.prepath.pop())
        if not _text_path(request.postpath):
            return NOT_TEXT
        if self._internal is not None and request.path.startswith(INTERNAL_PREFIX):
            return self._internal
        if self._admin is not None and request.path.startswith(ADMIN_PREFIX):
            return self._admin
        return self._app
