"""
C{twist authsrv-fake-chat}: L{authsrv.testing.fake_chat} on a port of its
own, a local stand-in for the chat platform so that the demo's linking runs
without a Discord application (examples/demo.toml's C{[chat]} points at it).

Every authorization is approved at once as the one chat user given by
C{--user-id} and C{--username}; tokens live in the process's memory.
"""

from __future__ import annotations

from twisted.application import strports
from twisted.python import usage
from twisted.web.server import Site

from authsrv.testing.fake_chat import FakeChatProvider, FakeChatUser


class Options(usage.Options):
    optParameters = [
        ["port", "p", 9100, "TCP port to listen on", int],
        ["interface", "i", "127.0.0.1", "interface to listen on"],
        ["client-id", None, "fake-chat-client", "the OAuth client id authsrv must use"],
        ["client-secret", None, "fake-chat-secret", "the OAuth client secret authsrv must use"],
        ["user-id", None, "80351110224678913", "the chat user id every authorization approves"],
        ["username", None, "bob", "that chat user's name"],
    ]


def makeService(options: Options):
    from twisted.internet import reactor

    fake = FakeChatProvider(
        reactor, client_id=options["client-id"], client_secret=options["client-secret"],
        user=FakeChatUser(options["user-id"], options["username"]),
    )
    listen = f"tcp:{options['port']}:interface={options['interface']}"
    return strports.service(listen, Site(fake.resource()))
