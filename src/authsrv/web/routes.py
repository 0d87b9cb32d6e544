"""
Which route answered a request, for labels that stay bounded: a Klein app
that names on each request the pattern of the rule it matched, and a wrapper
that names a static document. A request that matched nothing keeps
C{route = None}; its raw path is never a label.
"""

from __future__ import annotations

from functools import lru_cache

from klein import Klein
from twisted.web.resource import Resource


@lru_cache(maxsize=16)
def _patterns(url_map) -> dict[str, str]:
    """Each endpoint's rule pattern; an app's rules are all declared with its class."""
    return {rule.endpoint: rule.rule for rule in url_map.iter_rules()}


class RoutedKlein(Klein):
    """A L{Klein} that sets C{request.route} to the matched rule's pattern before the route runs."""

    def execute_endpoint(self, endpoint, request, *args, **kwargs):
        request.route = _patterns(self.url_map)[endpoint]  # type: ignore[attr-defined]
        return super().execute_endpoint(endpoint, request, *args, **kwargs)


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
