"""The sections of a shared index: the lease, and the index read as of a version before it.

A shared index (Redis) is written by other instances too. A batch is decided and stored
inside :meth:`SharedSections.exclusive` (the lease), which re-reads the counters and
epochs at its start and brings the key filters up to date from the backend's change log
(:mod:`.followed`). A batch may also be decided before the lease, against the index as
of one version (:meth:`SharedSections.as_of`); inside the lease
:meth:`SharedSections.written_since` then tells which look-up keys the other instances
wrote past it (``docs/shared-index.md``, Sizing). For an index one instance owns these
only mark the section.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stream_dedup.core.hashing import U64
from stream_dedup.index.backend import Backend
from stream_dedup.index.followed import FollowedFilters
from stream_dedup.index.retention import Timeline
from stream_dedup.index.state_lock import StateLock

if TYPE_CHECKING:  # the Redis client is imported only where an index on it is opened
    from stream_dedup.index.redis_heads import GroupHeads

__all__ = ["SharedSections"]


class SharedSections:
    """The lease and the versioned reads of :class:`~.store.DedupIndex` on a shared
    backend (a mixin over its state)."""

    _backend: Backend
    _shared: bool
    _timeline: Timeline
    _counters: dict[str, int]
    _followed: FollowedFilters
    _state_lock: StateLock
    _writes: int
    #: ``_writes`` when :meth:`as_of` last ended.
    _as_of_writes: int = -2
    #: Whether the last lease found other instances' writes since the lease before it
    #: (or could not tell): deciding before the lease pays only then (see
    #: :attr:`others_writing`).
    _others_wrote: bool = True
    #: Whether a read as of a version since the last lease found such writes: it takes
    #: them off the log, so the next lease alone would not see them.
    _others_seen_as_of: bool = False

    def _load_state(self, since: int | None = None) -> None:
        raise NotImplementedError  # DedupIndex's

    def _capacities(self) -> dict[int, int]:
        raise NotImplementedError  # IndexReads'

    def _new_filter_size(self) -> int:
        raise NotImplementedError  # DedupIndex's

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Decide and store a batch of a shared index in here: the other instances wait,
        and the counters and epochs are re-read first (another instance may have
        committed since) and the key filters brought up to date (built first, outside
        the lease, when they are not kept yet). For a single-writer index it only marks
        the section."""
        if self._shared:
            self._followed.before_lease(self._capacities)
        with self._backend.exclusive():
            if self._shared:
                with self._state_lock.writing():
                    self._load_state(since=self._counters["indexed"])
                    self._followed.in_lease(self._timeline.numbers(), self._new_filter_size())
                self._others_wrote = self._others_seen_as_of or self._followed.added != []
                self._others_seen_as_of = False
                self._writes += 1  # a commit prepared before this section is stale
            try:
                yield
            finally:
                self._followed.after_lease()

    @contextlib.contextmanager
    def as_of(self) -> Iterator[int | None]:
        """Read a shared index as of its latest version, outside the lease: the change
        log's version, with the counters, epochs and key filters brought to it and the
        writes waiting at it read through (``None``: this index cannot, or the log could
        not tell; decide inside the lease). Inside the next :meth:`exclusive`,
        :meth:`written_since` tells what was written past it."""
        as_of = getattr(self._backend, "as_of", None)
        if not self._shared or as_of is None:
            yield None
            return
        self._followed.before_lease(self._capacities)
        with as_of() as version:
            with self._state_lock.writing():
                self._load_state(since=self._counters["indexed"])
                self._followed.in_lease(self._timeline.numbers(), self._new_filter_size())
            if self._followed.added != []:
                self._others_seen_as_of = True
            try:
                yield version if self._followed.current else None
            finally:
                self._followed.after_lease()
                self._as_of_writes = self._writes

    @property
    def others_writing(self) -> bool:
        """Whether other instances wrote to this shared index between this instance's
        last two leases (true until a lease tells, and where the log cannot), as its
        leases or its reads as of a version in between found in the log.

        Deciding a batch before the lease shortens the lease only for the instances
        waiting for it; alone, an instance would pay for reading the index as of a version
        and settling the batch and gain nothing, so it decides inside the lease while no
        other instance writes, and before it again once one does."""
        return self._others_wrote

    def written_since(self) -> list[tuple[int, U64]] | None:
        """Inside :meth:`exclusive`: the other instances' writes since the last
        :meth:`as_of` or lease, as (epoch, fingerprints of their look-up keys); ``None``
        when the log could not tell them all, or this instance wrote since (its own
        write's keys are not in the log it reads)."""
        if self._writes != self._as_of_writes + 1:  # + 1: this lease
            return None
        return self._followed.added

    def lease_end(self) -> float:
        """When the last :meth:`exclusive` section let the lease go (``perf_counter``): a
        shared index's write lets it go at its commit point, before it is applied."""
        released = getattr(self._backend, "released_at", None)
        return time.perf_counter() if released is None else float(released)

    def group_heads(self, scope: str) -> GroupHeads | None:
        """A shared index's exchange of partition heads for consumer group ``scope``
        (:class:`~stream_dedup.index.redis_heads.GroupHeads`), or None: an index one
        instance owns needs none."""
        make = getattr(self._backend, "group_heads", None)
        return None if make is None else make(scope)
