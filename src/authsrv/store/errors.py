"""Errors a store raises."""


class AlreadyExists(Exception):
    """A record with that key exists already."""


class StoreUnavailable(Exception):
    """The store cannot be reached or answered with an error."""
