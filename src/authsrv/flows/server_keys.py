"""
The store's server keys as the flows use them: each read from the store on
first use and kept, since a server key never changes once made (the store
makes it once for every instance; docs/design.md).
"""

from __future__ import annotations


class ServerKeys:
    """C{store} answers C{server_key}."""

    def __init__(self, store) -> None:
        self._store = store
        self._keys: dict[str, bytes] = {}

    async def get(self, name: str) -> bytes:
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = await self._store.server_key(name)
        return key
