"""
A chunked request body (RFC 9112 section 7.1) held to the body limit by
the sizes its chunks announce, not by the bytes that follow them.

twisted.web's decoder took any chunk size, so a client announcing
C{ffffffff} and sending nothing more held its connection until the body
timeout, and was answered 408 rather than 413; a size of a thousand hex
digits was read as a number too.
"""

from __future__ import annotations

from typing import Callable, NoReturn

from twisted.web.http import _ChunkedTransferDecoder, _MalformedChunkedDataError

MAX_SIZE_DIGITS = 16
"""Hex digits a chunk size may have: any size over them is over every body limit, and costs a big number to read."""


def body_too_large(max_body: int) -> str:
    """What a 413 for a body over C{max_body} bytes says, announced by its Content-Length or its chunks."""
    return f"the request body is too large (at most {max_body} bytes)"


class CappedChunkedDecoder(_ChunkedTransferDecoder):
    """
    twisted.web's chunked decoder that calls C{refuse(status, description)}
    for a chunk size of more than L{MAX_SIZE_DIGITS} digits (400), and for
    one that takes the body's announced size past C{max_body} bytes (413),
    as soon as the size line is read; it then reads no further.
    """

    def __init__(self, data: Callable[[bytes], None], finish: Callable[[bytes], None], max_body: int,
                 refuse: Callable[[int, str], None]):
        super().__init__(data, finish)
        self._room = max_body
        self._max_body = max_body
        self._refuse = refuse

    def _dataReceived_CHUNK_LENGTH(self) -> bool:
        end = self._buffer.find(b"\r\n", self._start)
        if end != -1:
            extension = self._buffer.find(b";", 0, end)
            if (end if extension == -1 else extension) > MAX_SIZE_DIGITS:
                self._stop(400, f"a chunk size has more than {MAX_SIZE_DIGITS} hex digits")
        if not super()._dataReceived_CHUNK_LENGTH():
            return False
        self._room -= self.length
        if self._room < 0:
            self._stop(413, body_too_large(self._max_body))
        return True

    def _stop(self, status: int, description: str) -> NoReturn:
        """Refuse the request, and raise what makes twisted.web stop reading (its own refusal then comes too late)."""
        self._refuse(status, description)
        raise _MalformedChunkedDataError(description)
