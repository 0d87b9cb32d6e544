"""
Conformance suites every implementation of a pluggable role must pass,
importable by third-party plugins as well as by our own tests:

  - L{authsrv.testing.store}: C{StoreConformance}, C{StoreConcurrencyConformance}
  - L{authsrv.testing.identity}: C{IdentityBackendConformance}, C{seed_users}
  - L{authsrv.testing.keystore}: C{KeystoreConformance}
  - L{authsrv.testing.chat}: C{ChatProviderConformance}, against L{authsrv.testing.fake_chat}

They need pytest and pytest-twisted (the C{test} extra).
"""
