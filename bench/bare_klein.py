"""
The floor user-access is measured against: a Klein route on Twisted that
reads the same JSON body and answers the same JSON, with nothing else.

    python bench/bare_klein.py PORT
"""

import json
import sys

from klein import Klein
from twisted.internet import endpoints, reactor
from twisted.web.server import Site

app = Klein()


@app.route("/readyz")
def ready(request):
    return b"ok"


@app.route("/api/internal/user-access", methods=["POST"])
def user_access(request):
    body = json.loads(request.content.read())
    request.setHeader(b"content-type", b"application/json")
    return json.dumps({"userId": body["userId"], "allowed": True, "banned": False, "banReason": None}).encode()


site = Site(app.resource())
site.noisy = False
endpoints.serverFromString(reactor, f"tcp:{sys.argv[1]}:interface=127.0.0.1").listen(site)
reactor.run()
