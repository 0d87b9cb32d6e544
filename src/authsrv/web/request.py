"""
The site's request class: bounded bodies.

Twisted reads a whole body before rendering; this request counts what
arrives and keeps none past the limit, so that an oversized body costs no
memory and is answered 413 (DESIGN.md, Limits).
"""

from __future__ import annotations

from twisted.web.server import Request


class BoundedRequest(Request):
    """A L{Request} that stops storing its body after C{max_body} bytes."""

    max_body = 64 * 1024

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.body_too_large = False
        self._received = 0

    def gotLength(self, length):
        if length is not None and length > self.max_body:
            self.body_too_large = True
        super().gotLength(length)

    def handleContentChunk(self, data):
        self._received += len(data)
        if self._received > self.max_body:
            self.body_too_large = True
        if not self.body_too_large:
            super().handleContentChunk(data)


def bounded_request_factory(max_body: int) -> type[BoundedRequest]:
    return type("BoundedRequest", (BoundedRequest,), {"max_body": max_body})
