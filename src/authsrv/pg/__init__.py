"""
What the PostgreSQL plugins (store, identity backend, keystore) share:
L{settings} (their connection keys and where a DSN points) and L{pool} (a
pool of asynchronous connections, its failures and query helpers). Their
schema steps go through L{authsrv.migrations}.
"""
