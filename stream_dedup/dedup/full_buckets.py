"""Sampled values whose bucket is known full: not read again while that stays true.

A sampled bucket (:mod:`stream_dedup.core.containment`) stops growing at its cap and then
neither votes nor takes members, so reading it tells a batch nothing it did not know. On
a stream of common phrases most sampled values land in such buckets, and reading them
cost ~15 µs per document, a quarter of containment's cost. The deduplicator remembers the
values it read full and leaves them out of the next batches' reads, votes and writes.

Leaving them out decides exactly as reading them would, as long as what made them full
still holds, which the cache checks before each use:

- a value is remembered when the bucket of the epoch the batch writes to held at least
  the cap of members *as committed* (what a batch stages but has not committed is never
  learnt, so a batch decided again after a failed commit decides the same);
- an epoch's bucket only grows until it is dropped whole, so the cache is emptied when the
  batch epoch changes;
- a full bucket does not vote because its *live* members reach the cap: retention's
  cutoff can move into the current epoch (a jump of the stream's clock), so the cache is
  emptied as soon as the cutoff passes the oldest member of a remembered bucket.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stream_dedup.core.containment import spans
from stream_dedup.core.hashing import U64
from stream_dedup.index.bucket_records import Members

#: Values remembered at most (8 bytes each): past it, newly full buckets are read as
#: before. A stream fills about one bucket per 64 sampled occurrences of common values.
MAX_VALUES = 1 << 22


class FullBuckets:
    """The sampled values whose bucket in one epoch is full, as a sorted array."""

    def __init__(self, cap: int, max_values: int = MAX_VALUES) -> None:
        self.cap = cap
        self.max_values = max_values
        self._epoch = -1
        #: The oldest member of any remembered bucket: the cache holds while the cutoff
        #: has not passed it.
        self._floor = np.iinfo(np.int64).max
        self._values: U64 = np.empty(0, dtype=np.uint64)
        #: Sampled occurrences left unread (a value once per document), since the start.
        self.left_unread = 0

    def __len__(self) -> int:
        return int(self._values.size)

    def known(self, values: U64, epoch: int, cutoff: int) -> npt.NDArray[np.bool_]:
        """Which of ``values`` (in any order, repeats allowed) are known full for a batch
        writing to ``epoch`` with retention's ``cutoff``; forgets everything that may no
        longer hold."""
        self.current(epoch, cutoff)
        if not self._values.size or not values.size:
            return np.zeros(values.size, dtype=bool)
        at = np.minimum(np.searchsorted(self._values, values), self._values.size - 1)
        hit: npt.NDArray[np.bool_] = self._values[at] == values
        self.left_unread += int(hit.sum())
        return hit

    def current(self, epoch: int, cutoff: int) -> U64:
        """The values known full for a batch writing to ``epoch`` with retention's
        ``cutoff`` (sorted), after forgetting everything that may no longer hold."""
        if epoch != self._epoch or cutoff > self._floor:
            self._epoch, self._floor = epoch, np.iinfo(np.int64).max
            self._values = np.empty(0, dtype=np.uint64)
        return self._values

    def learn(self, values: U64, mine: Members) -> None:
        """Remember the ``values`` (sorted, one per key read) whose committed bucket in
        the batch's epoch (``mine``, as read) holds the cap; call after :meth:`known`."""
        m_at, m_len, m_members = mine
        full = np.flatnonzero(m_len >= self.cap)
        if not full.size or self._values.size + full.size > self.max_values:
            return
        oldest = int(m_members[spans(m_at[full], m_len[full])].min())
        self._floor = min(self._floor, oldest)
        self._values = np.union1d(self._values, values[full])
