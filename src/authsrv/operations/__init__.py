"""
What an operator does to clients, users, keys and bans, once, for both
front ends: the admin HTTP API (L{authsrv.web.admin}) and the operator
command (L{authsrv.admin}). Each operation checks its input (raising an
L{authsrv.operations.errors.OperationError} naming the field), makes the
change through the store, identity backend or keystore, and emits an audit
event naming the C{actor}; the front ends only parse and word.
"""

from __future__ import annotations

from attrs import frozen

from authsrv.operations.clients import ClientOperations
from authsrv.operations.keys import KeyOperations
from authsrv.operations.users import UserOperations


@frozen
class AdminOperations:
    """Every operation group, as the admin API is built with them."""

    clients: ClientOperations
    users: UserOperations
    keys: KeyOperations
