"""
The dropin: found by getPlugins, cheap to scan, and every shipped factory and
what it builds provides its interface.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import pytest_twisted
from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins
from zope.interface.verify import verifyObject

from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.embedded import create_users_file
from authsrv.interfaces import (
    IIdentityBackend,
    IIdentityBackendFactory,
    IKeystore,
    IKeystoreFactory,
    IPluginContext,
    IStore,
    IStoreFactory,
)
from authsrv.config import parse_config
from authsrv.plugins import factories
from authsrv.service import StartupError, build_plugin

SHIPPED = {
    "identity": ({"static"}, IIdentityBackendFactory, IIdentityBackend),
    "store": ({"sqlite"}, IStoreFactory, IStore),
    "keystore": ({"jwk-file", "pem"}, IKeystoreFactory, IKeystore),
}
"""Plugins built here on empty sections; the PostgreSQL and LDAP ones are built by their own suites."""

INSTALLED = {
    "identity": {"static", "ldap", "postgres"},
    "store": {"sqlite", "postgres"},
    "keystore": {"jwk-file", "pem", "postgres"},
}


def test_service_maker_is_found():
    makers = {m.tapname: m for m in getPlugins(IServiceMaker)}
    assert makers["authsrv"].module == "authsrv.tap"


@pytest.mark.parametrize("role", sorted(SHIPPED))
def test_factories_are_found_and_provide_their_interface(role):
    _, interface, _ = SHIPPED[role]
    found = factories(role)
    assert set(found) == INSTALLED[role]
    for factory in found.values():
        assert verifyObject(interface, factory)


@pytest.mark.parametrize(
    "role, name", [(role, name) for role, (names, _, _) in sorted(SHIPPED.items()) for name in sorted(names)]
)
@pytest_twisted.ensureDeferred
async def test_what_each_factory_builds_provides_its_interface(role, name, tmp_path):
    from twisted.internet import reactor

    create_users_file(tmp_path / "users.toml")
    context = PluginContext(reactor, tmp_path)
    built = factories(role)[name].from_config(Section({}, role, tmp_path), context)
    try:
        assert verifyObject(SHIPPED[role][2], built)
    finally:
        if role != "keystore":
            await built.close()
        context.stop()


def test_the_context_provides_its_interface(tmp_path):
    from twisted.internet import reactor

    context = PluginContext(reactor, tmp_path, check_only=True)
    assert verifyObject(IPluginContext, context)
    context.stop()


def test_unknown_plugin_lists_what_is_installed():
    config = parse_config({"store": {"plugin": "redis"}}, None)
    with pytest.raises(StartupError) as caught:
        build_plugin("store", config.store, None)
    assert str(caught.value) == "store.plugin: no store plugin named 'redis'; available: postgres, sqlite"


HEAVY = ("authsrv.tap", "authsrv.service", "authsrv.store", "authsrv.keys", "authsrv.identity",
         "authsrv.web", "klein", "treq", "jwcrypto", "cryptography", "argon2", "sqlite3",
         "ldap3", "psycopg2", "txpostgres")


def test_scanning_for_plugins_imports_nothing_heavy():
    """
    Our dropin adds no heavy module to a scan (Twisted's own dropins may), and
    no plugin module is imported before the config selects it.
    """
    script = (
        "import json, sys\n"
        "from twisted.plugin import getPlugins\n"
        "from twisted.application.service import ServiceMaker\n"
        "before = set(sys.modules)\n"
        "import twisted.plugins.authsrv_plugins\n"
        "added = set(sys.modules) - before\n"
        "from authsrv.interfaces import IStoreFactory, IKeystoreFactory, IIdentityBackendFactory\n"
        "for role in (IStoreFactory, IKeystoreFactory, IIdentityBackendFactory):\n"
        "    list(getPlugins(role))\n"
        "print(json.dumps([sorted(added), sorted(sys.modules)]))\n"
    )
    added, loaded = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert [m for m in added if m.startswith(HEAVY)] == []
    assert "authsrv.plugins" in added
    assert [m for m in loaded if m.startswith(("authsrv.store", "authsrv.keys", "authsrv.identity"))] == []
