"""
Why an operation refused, with a stable code that both front ends use: the
admin API answers with it (and its HTTP status), the operator command
prints the message.
"""

from __future__ import annotations


class OperationError(Exception):
    """A refusal; C{field} names the input at fault, if one is."""

    code = "invalid_request"

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(OperationError):
    """The input is malformed or not allowed."""


class NotFound(OperationError):
    code = "not_found"


class Conflict(OperationError):
    """The change contradicts what is stored: an id taken, a config-declared client, no writable backend."""

    code = "conflict"


class PreconditionFailed(OperationError):
    """The client changed since the caller read it (its ETag no longer matches)."""

    code = "precondition_failed"
