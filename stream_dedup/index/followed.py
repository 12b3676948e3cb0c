"""Key filters for a shared index, kept in step with the other instances' writes.

A single-writer index knows every key it holds because it wrote them all: its key filters
(:mod:`.epoch_filters`) are complete from the moment they are built. A shared index is
written by other instances too; its backend's change log (:class:`.backend.ChangeFeed`,
:mod:`.redis_log` on Redis) tells which keys they added. The filters are built before a
lease (never inside one: a scan of a large index takes seconds), and inside each lease,
once the other instances' entries since the last one are added, they are *current*: a
look-up may then skip every key they rule out. Outside a lease, or when the log could not
tell everything (an instance far behind), they are not, and every key is read, which is
what the shared index did before it kept filters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from stream_dedup.core.hashing import U64
from stream_dedup.index.backend import Backend, ChangeFeed
from stream_dedup.index.epoch_filters import EpochFilters

__all__ = ["FollowedFilters"]


class FollowedFilters:
    """The key filters of one instance of a shared index and whether they are current."""

    def __init__(self, backend: Backend, filters: EpochFilters) -> None:
        self._backend = backend
        self._feed = backend if isinstance(backend, ChangeFeed) else None
        self._filters = filters
        #: True inside a lease once the filters hold every committed key.
        self.current = False
        #: The filters were built whole and have been kept in step since: false until a
        #: build finishes (one cut short by an outage is started again).
        self._ready = False
        #: The other instances' entries the last :meth:`in_lease` added (``None``: the log
        #: could not tell, or it is not followed): what changed since the version the
        #: filters stood at before, for a batch decided there (``DedupIndex.as_of``).
        self.added: list[tuple[int, U64]] | None = None

    def before_lease(self, capacities: Callable[[], dict[int, int]]) -> None:
        """Build the filters (from a scan, outside the lease) when they are not being
        kept in step: the first time, or after the log could not tell everything."""
        if self._feed is None or (self._ready and self._feed.following):
            return
        self._ready = False
        self._filters.clear()
        self._feed.follow_changes()
        # Every epoch stored by now, not only those this instance last saw: the log tells
        # only of writes after this point.
        sizes = capacities()
        largest = max(sizes.values(), default=0)
        for epoch in self._backend.epochs():
            sizes.setdefault(epoch, largest)
        self._filters.load(sizes)
        self._ready = True

    def in_lease(self, live: Iterable[int], capacity: int) -> None:
        """Add the other instances' keys committed since the last lease; drop the filters
        of epochs they let go. ``capacity``: the size of a filter made for a new epoch."""
        self.current, self.added = False, None
        if self._feed is None or not (self._ready and self._feed.following):
            return
        changes = self.added = self._feed.changes()
        if changes is None:
            self._ready = False  # built again before the next lease; all keys read in this
            return
        for epoch, fingerprints in changes:
            self._filters.add(epoch, fingerprints, capacity)
        kept = set(live)
        for epoch in self._filters.numbers():
            if epoch not in kept:
                self._filters.drop(epoch)
        self.current = True

    def after_lease(self) -> None:
        self.current = False
