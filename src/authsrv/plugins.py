"""
Plugin factories and their discovery.

A factory is what a dropin module instantiates: it names its plugin and the
module that builds it, and imports that module only when the config selects
it, so scanning for plugins stays cheap (the dropin imports only this module).
"""

from __future__ import annotations

from typing import Iterable

from twisted.plugin import IPlugin, getPlugins
from twisted.python.reflect import namedAny
from zope.interface import implementer

from authsrv.interfaces import (
    IIdentityBackendFactory,
    IKeystoreFactory,
    IStoreFactory,
)


class UnknownPlugin(Exception):
    """No plugin of a role has the configured name."""

    def __init__(self, role: str, name: str, available: Iterable[str]):
        names = ", ".join(sorted(available)) or "none installed"
        super().__init__(f"no {role} plugin named {name!r}; available: {names}")


class _LazyFactory:
    """
    Builds its object with C{module.from_config(section, context)}, importing
    C{module} only then.
    """

    def __init__(self, name: str, module: str, description: str):
        self.name = name
        self.module = module
        self.description = description

    def from_config(self, section, context):
        return namedAny(self.module).from_config(section, context)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} from {self.module}>"


@implementer(IPlugin, IIdentityBackendFactory)
class IdentityBackendFactory(_LazyFactory):
    """A lazily imported identity backend plugin."""


@implementer(IPlugin, IStoreFactory)
class StoreFactory(_LazyFactory):
    """A lazily imported store plugin."""


@implementer(IPlugin, IKeystoreFactory)
class KeystoreFactory(_LazyFactory):
    """A lazily imported keystore plugin."""


ROLES = {
    "identity": IIdentityBackendFactory,
    "store": IStoreFactory,
    "keystore": IKeystoreFactory,
}


def factories(role: str) -> dict:
    """Every installed factory of a role, by name."""
    return {f.name: f for f in getPlugins(ROLES[role])}


def find_factory(role: str, name: str):
    """The factory of C{role} named C{name}, or L{UnknownPlugin} listing the others."""
    found = factories(role)
    if name not in found:
        raise UnknownPlugin(role, name, found)
    return found[name]
