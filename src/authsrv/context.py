"""
The L{IPluginContext} the server hands to plugin factories.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from twisted.python.threadpool import ThreadPool
from zope.interface import implementer

from authsrv.identity.passwords import DEFAULT_HASHER, hasher_of
from authsrv.interfaces import IPluginContext


@implementer(IPluginContext)
class PluginContext:
    """
    Owns the thread pools plugins ask for: started at once (a plugin may need
    them while the server starts) and stopped by L{stop}. C{store_observer}
    is handed to the store (the server's metrics, when they are on).
    """

    def __init__(
        self, reactor, base_dir: Path, max_token_lifetime: int = 3600, *, session_lifetime: int = 14 * 86400,
        check_only: bool = False,
        store_observer: Callable[[str, float, bool], None] | None = None, password_hasher=DEFAULT_HASHER,
        link_provider: str | None = None,
    ):
        self.reactor = reactor
        self.base_dir = Path(base_dir)
        self.max_token_lifetime = max_token_lifetime
        self.session_lifetime = session_lifetime
        self.check_only = check_only
        self.store_observer = store_observer
        self.password_hasher = password_hasher
        self.link_provider = link_provider
        self._pools: dict[str, ThreadPool] = {}

    @classmethod
    def of(cls, reactor, config, **extra) -> "PluginContext":
        """
        The context C{config} gives plugins, alike in the server, its
        workers' parent and the operator's command; C{extra} is what only
        one of them sets (a store observer, C{check_only}).
        """
        return cls(reactor, config.base_dir, config.limits.max_token_lifetime,
                   session_lifetime=config.limits.session_ttl, password_hasher=hasher_of(config),
                   link_provider=config.link_provider, **extra)

    def threadpool(self, name: str, size: int) -> ThreadPool:
        if name not in self._pools:
            pool = ThreadPool(minthreads=0, maxthreads=size, name=f"authsrv-{name}")
            pool.start()
            self._pools[name] = pool
        return self._pools[name]

    def stop(self) -> None:
        """Stop every pool, waiting for work in progress."""
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.stop()
