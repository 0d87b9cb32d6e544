"""
Routing below and beside Klein. Which route answered a request, for labels
that stay bounded: a Klein app that names on each request the pattern of the
rule it matched, and a wrapper that names a static document. A request that
matched nothing keeps C{route = None}; its raw path is never a label.

The hottest dynamic routes, and the two a browser's sign-in passes through
(authorize and the login page), skip Klein altogether (docs/design.md, Speed
targets): L{ExactPaths} finds them by their whole path in one dict lookup and
each is an L{Endpoint}, a plain twisted.web leaf that runs the route's
coroutine and writes its answer as Klein would, without Klein's URL binding,
rule matching and chain of Deferreds per request.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Awaitable, Callable, Mapping
from urllib.parse import unquote

from klein import Klein
from twisted.internet.defer import CancelledError, Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from authsrv.web.failures import unforeseen


@lru_cache(maxsize=16)
def _patterns(url_map) -> dict[str, str]:
    """Each endpoint's rule pattern; an app's rules are all declared with its class."""
    return {rule.endpoint: rule.rule for rule in url_map.iter_rules()}


class RoutedKlein(Klein):
    """
    A L{Klein} that sets C{request.route} to the matched rule's pattern
    before the route runs, and matches paths exactly, as the contract's
    are: a trailing or doubled slash is no other spelling of a route,
    neither served as it nor redirected to it (werkzeug's redirect builds
    its absolute Location from the request's Host header, which anyone can
    write). Strict slashes redirect only to a rule that ends with '/', and
    no route may (L{route}).

    Rules match the path's segments as sent (L{SegmentsAsSent}), and a
    route's parameters are %-decoded after: a C{%2F} in an id (a user's, in
    the admin API) is part of it, never a separator that could reach
    another route, and an escaped letter (C{rev%6Fke}) spells no path, as
    it spells none of the exact paths (L{ExactPaths}). The site's root has
    refused a path that is not UTF-8 once decoded.
    """

    def __init__(self):
        super().__init__()
        self.url_map.merge_slashes = False
        self.url_map.strict_slashes = True

    def route(self, url, *args, **kwargs):
        if url.endswith("/"):
            raise ValueError(f"{url}: a route ending with '/' would redirect the path without it")
        return super().route(url, *args, **kwargs)

    def resource(self):
        return SegmentsAsSent(super().resource())

    def execute_endpoint(self, endpoint, request, *args, **kwargs):
        request.route = _patterns(self.url_map)[endpoint]  # type: ignore[attr-defined]
        decoded = {name: unquote(value, errors="strict") for name, value in kwargs.items()}
        return super().execute_endpoint(endpoint, request, *args, **decoded)


class SegmentsAsSent(Resource):
    """
    A Klein app's resource, routed on the request path's segments as sent:
    twisted.web has already decoded each segment's %-escapes.
    """

    isLeaf = True

    def __init__(self, app: Resource):
        super().__init__()
        self._app = app

    def render(self, request):
        request.postpath = request.path[1:].split(b"/")
        return self._app.render(request)


class Named(Resource):
    """A leaf resource that labels its requests C{route} and lets C{resource} answer them."""

    isLeaf = True

    def __init__(self, resource: Resource, route: str):
        super().__init__()
        self._resource = resource
        self._route = route

    def render(self, request):
        request.route = self._route
        return self._resource.render(request)


class ExactPaths(Resource):
    """
    C{leaves} by their whole request path, every other path by C{router}
    (a Klein app's resource). L{authsrv.web.root.Root} takes C{leaves} into
    its own lookup, so that on a site they cost no step of their own.
    """

    def __init__(self, leaves: dict[bytes, Resource], router: Resource):
        super().__init__()
        self.leaves = leaves
        self.router = router

    def getChildWithDefault(self, name, request):
        leaf = self.leaves.get(request.path)
        if leaf is not None:
            return leaf
        request.postpath.insert(0, request.prepath.pop())
        return self.router


Handler = Callable[[Any], "bytes | Awaitable[bytes]"]
"""A route: the request in, the body out, directly (a preflight) or from a coroutine."""


def _not_answered(request, error: Exception) -> bytes | None:
    return None


def _send(request, body: bytes) -> None:
    """The body written and the request finished, exactly as Klein writes a route's answer."""
    request.write(body)
    request.finish()


class Endpoint(Resource):
    """
    One route as a plain leaf: C{handlers} by request method, labelled
    C{route} for the metrics; C{wrong_method} answers any other method (with
    its C{Allow}). C{refusal} renders what a handler raised as the site's
    error handlers do, or returns None for what they do not handle, which
    is logged and answered by C{server_error}, as under Klein
    (L{authsrv.web.failures}).
    When the client goes away, the work in flight is cancelled and nothing
    is written.
    """

    isLeaf = True
    log = Logger()

    def __init__(self, route: str, handlers: Mapping[bytes, Handler], wrong_method: Callable[[Any], bytes],
                 server_error: Callable[[Any], bytes],
                 refusal: Callable[[Any, Exception], bytes | None] = _not_answered):
        super().__init__()
        self.route = route
        self.handlers = handlers
        self._wrong_method = wrong_method
        self._server_error = server_error
        self._refusal = refusal

    def render(self, request):
        handler = self.handlers.get(request.method)
        if handler is None:
            _send(request, self._wrong_method(request))
            return NOT_DONE_YET
        request.route = self.route
        answering = Deferred.fromCoroutine(self._answer(request, handler))
        if not answering.called:
            request.notifyFinish().addErrback(lambda _: answering.cancel())
        return NOT_DONE_YET

    async def _answer(self, request, handler: Handler) -> None:
        try:
            answer = handler(request)
            body = answer if isinstance(answer, bytes) else await answer
        except Exception as error:
            if request.channel is None:
                if not isinstance(error, CancelledError):
                    self.log.failure("route failed after its client went away", Failure(error))
                return
            refused = self._refusal(request, error)
            body = unforeseen(request, Failure(error), self._server_error) if refused is None else refused
        if request.channel is not None:
            _send(request, body)
