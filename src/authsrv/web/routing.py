"""
The one Klein application. Route modules (C{authsrv.web.routes_*}) register
their routes on it; handlers receive the L{authsrv.web.app.AuthServer}
instance as C{self} and hold no state of their own.
"""

from klein import Klein

app = Klein()
