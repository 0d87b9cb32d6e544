"""
The LDAP identity backend against the tests' own slapd (tests/slapd.py).
"""

from __future__ import annotations

import pytest

from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.identity import ldap
from authsrv.testing.identity import IdentityBackendConformance


@pytest.fixture
def reactor():
    from twisted.internet import reactor

    return reactor


@pytest.fixture
def context(reactor, tmp_path):
    context = PluginContext(reactor, tmp_path)
    yield context
    context.stop()


def backend(context, config: dict):
    return ldap.from_config(Section(config, "identity[0]", context.base_dir), context)


class TestLdapConformance(IdentityBackendConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, slapd, context):
        self.slapd = slapd
        self.context = context

    def make_backend(self, users):
        self.slapd.seed(users)
        return backend(self.context, self.slapd.backend_config())
