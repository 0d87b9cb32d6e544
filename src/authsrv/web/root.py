"""
The site's root: exact paths of static documents answer from a dict lookup,
everything else goes to the Klein application.
"""

from __future__ import annotations

from twisted.web.resource import Resource

from authsrv.config import InputLimits
from authsrv.web.admin import PREFIX as ADMIN_PATH
from authsrv.web.internal import PREFIX
from authsrv.web.limits import Refused, parameter_problem

INTERNAL_PREFIX = (PREFIX + "/").encode()
ADMIN_PREFIX = (ADMIN_PATH + "/").encode()
TOO_LARGE = Refused(413, "the request body is too large", close=True)
"""413 for a body over the limit (L{authsrv.web.request.BoundedRequest})."""


class Root(Resource):
    """
    Dispatches on the whole request path before any routing, so discovery and
    JWKS cost one dict lookup (docs/design.md, Speed targets). Oversized bodies and
    parameters over C{limits} are refused before any routing too.
    """

    def __init__(
        self, static: dict[bytes, Resource], app: Resource, internal: Resource | None = None,
        limits: InputLimits = InputLimits(), admin: Resource | None = None,
    ):
        super().__init__()
        self._static = static
        self._app = app
        self._internal = internal
        self._admin = admin
        self._limits = limits

    def getChildWithDefault(self, name, request):
        if getattr(request, "body_too_large", False):
            return TOO_LARGE
        if request.args:
            problem = parameter_problem(request.args, self._limits)
            if problem is not None:
                return Refused(400, problem)
        static = self._static.get(request.path)
        if static is not None:
            return static
        request.postpath.insert(0, request.prepath.pop())
        if self._internal is not None and request.path.startswith(INTERNAL_PREFIX):
            return self._internal
        if self._admin is not None and request.path.startswith(ADMIN_PREFIX):
            return self._admin
        return self._app
