"""
authsrv's dropin: the C{twist authsrv} and C{twist authsrv-fake-chat} service makers and the shipped identity
backend, store and keystore factories. Scanned whenever anything looks for
plugins, so it imports only L{authsrv.plugins} and names modules as strings.
"""

from twisted.application.service import ServiceMaker

from authsrv.plugins import IdentityBackendFactory, KeystoreFactory, StoreFactory

authsrv = ServiceMaker(
    "authsrv",
    "authsrv.tap",
    "An OAuth 2.1 / OpenID Connect authorization server and identity provider.",
    "authsrv",
)

authsrv_fake_chat = ServiceMaker(
    "authsrv-fake-chat",
    "authsrv.testing.fake_chat_tap",
    "A local stand-in for the chat platform (Discord's OAuth endpoints) for the demo and tests.",
    "authsrv-fake-chat",
)

static_identity = IdentityBackendFactory(
    "static", "authsrv.identity.static", "Users from a TOML file with argon2id password hashes."
)

postgres_identity = IdentityBackendFactory(
    "postgres", "authsrv.identity.postgres",
    "Users from PostgreSQL: the project's own table, or the operator's mapped by SQL queries.",
)

ldap_identity = IdentityBackendFactory(
    "ldap", "authsrv.identity.ldap.backend", "Users from an LDAP directory (OpenLDAP, Active Directory): search, then bind."
)

sqlite_store = StoreFactory(
    "sqlite", "authsrv.store.sqlite", "SQLite file: the embedded single-instance store."
)

postgres_store = StoreFactory("postgres", "authsrv.store.postgres", "PostgreSQL: the store several instances share.")

jwk_file_keystore = KeystoreFactory(
    "jwk-file", "authsrv.keys.jwkfile", "Signing keys in a JWK-set file generated on first start."
)

pem_keystore = KeystoreFactory(
    "pem", "authsrv.keys.pem", "Signing keys as PEM files in a folder, with a JSON index of their states."
)

postgres_keystore = KeystoreFactory(
    "postgres", "authsrv.keys.postgres", "Signing keys in PostgreSQL, shared and rotated once by all instances."
)
