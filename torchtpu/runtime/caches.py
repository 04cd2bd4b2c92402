"""Bounded program caches.

Every cache of compiled programs keyed by what a program depends on (shapes,
dtypes, settings) is one of these, so a program whose shapes never repeat
cannot grow memory without bound.  Eviction is oldest-first (insertion
order): a hit is one dict lookup, which matters on the per-op path, and a
program evicted while still in use is simply compiled again.  Each eviction
is counted in ``metrics.cache_evictions`` under the cache's name.
"""

from __future__ import annotations

from .. import config
from . import metrics


class BoundedCache(dict):
    """A dict that evicts its oldest entry past ``maxsize`` (``config.program_cache_size`` by default)."""

    def __init__(self, name: str, maxsize: int | None = None):
        super().__init__()
        self.name = name
        self._maxsize = maxsize

    @property
    def maxsize(self) -> int:
        return self._maxsize or config.current.program_cache_size

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        while len(self) > self.maxsize:
            del self[next(iter(self))]
            metrics.count(metrics.cache_evictions, self.name)
