"""Containment's sampled buckets as this index last committed them, answered from memory.

Containment reads the sampled bucket of each value a batch samples and does not know full
(:mod:`stream_dedup.core.containment`): ~1.9 keys per news document, nearly every one
found, ~6-7 µs per document on RocksDB, its largest step. Most of those buckets were
written by this process's own earlier batches (a batch grows the buckets it read), so on
an index one process alone writes their values are known without reading them: the
value the last commit wrote under the key, or the value a read found since.

What keeps every answer equal to the backend's:

- only on an index this process alone writes (not a shared index, not a follower of
  another process's writes): another writer's commit would change a bucket unseen;
- learnt from committed state only: the values a commit wrote, once the backend's atomic
  write has returned (:meth:`SampledCache.committed`), and the values the writer's reads
  of the backend found (:meth:`SampledCache.read`). A write that raises empties the cache,
  as does one that writes a sampled key otherwise than as an ordered put: either may
  have changed a bucket the cache holds;
- one epoch, the one batches write to: an epoch's buckets change only by commits to it,
  and a commit to another epoch empties the cache. The older live epochs (retention) are
  still read for every key: they are never written, but the cache holds none of them;
- bounded: two generations of entries, the newer first; once the newer holds half of
  :data:`MAX_BYTES` it becomes the older and the older is dropped. A bucket dropped so is
  read from the backend again (and learnt again): a miss, never a stale answer, because
  every commit writes its values into the newer generation, which is asked first.

The bytes counted are those learnt, a bucket counted again each time a commit rewrites it,
so the memory held is below the bound: on news 10,000 documents leave ~6,800 buckets of
~16 members (~0.9 MB of values) and count ~5.6 MB, so the newer generation turns over
about every 55,000 documents, and a bucket still asked for is learnt again within one.
"""

from __future__ import annotations

import itertools
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence

from stream_dedup.core.containment import SAMPLE_BAND
from stream_dedup.core.lookup_keys import BUCKET

__all__ = ["MAX_BYTES", "SAMPLED_PREFIX", "SampledCache", "sampled_elsewhere", "sampled_puts"]

#: Bytes of bucket values (and their keys, by an estimate of the objects' overhead) held
#: at most: two generations of half this each.
MAX_BYTES = 64 << 20
#: What a sampled bucket's key starts with: the bucket kind, then the reserved band.
SAMPLED_PREFIX = BUCKET + SAMPLE_BAND.to_bytes(2, "big")
_NONES = itertools.repeat(None)
_SAMPLED_LAST = SAMPLED_PREFIX + b"\xff" * 8
#: Bytes counted per entry besides its value: the key object and the dictionary's slot.
_ENTRY_BYTES = 120


class SampledCache:
    """The committed values of sampled buckets in one epoch (see the module docstring)."""

    def __init__(self, enabled: bool, max_bytes: int = MAX_BYTES) -> None:
        self.enabled = enabled and max_bytes > 0
        self.max_bytes = max_bytes
        self._epoch = -1
        self._new: dict[bytes, bytes] = {}
        self._old: dict[bytes, bytes] = {}
        self._new_bytes = 0
        #: Keys asked for and keys answered, since the start.
        self.asked = 0
        self.answered = 0

    def __len__(self) -> int:
        return len(self._new) + sum(k not in self._new for k in self._old)

    def answers(self, epoch: int) -> bool:
        """Whether :meth:`get` may answer for a read of ``epoch``."""
        return self.enabled and epoch == self._epoch

    def get(self, keys: Sequence[bytes]) -> tuple[list[int], list[bytes]]:
        """The positions in ``keys`` of the buckets held, and their values."""
        got = list(map(self._new.get, keys))
        if self._old:
            older = self._old.get
            got = [older(k) if v is None else v for k, v in zip(keys, got, strict=True)]
        at = list(itertools.compress(range(len(got)), map(operator.is_not, got, _NONES)))
        self.asked += len(keys)
        self.answered += len(at)
        return at, list(filter(None, got))

    def read(self, epoch: int, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Learn the values the writer's read of ``epoch`` found under ``keys``."""
        if self.enabled and epoch == self._epoch:
            self._learn(keys, values)

    def committed(self, epoch: int, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Learn the sampled buckets a commit to ``epoch`` wrote, after its write returned."""
        if not self.enabled:
            return
        if epoch != self._epoch:
            self.clear()
            self._epoch = epoch
        self._learn(keys, values)

    def dropped(self, epoch: int) -> None:
        """Forget ``epoch``'s buckets: it was dropped."""
        if epoch == self._epoch:
            self.clear()

    def clear(self) -> None:
        """Forget everything (a failed write, a bucket written some other way)."""
        self._new, self._old, self._new_bytes = {}, {}, 0
        self._epoch = -1

    def _learn(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        if not keys:
            return
        self._new.update(zip(keys, values, strict=True))
        self._new_bytes += sum(map(len, values)) + _ENTRY_BYTES * len(keys)
        if self._new_bytes > self.max_bytes // 2:
            self._old, self._new, self._new_bytes = self._new, {}, 0


def sampled_puts(
    keys: Sequence[bytes], values: Sequence[bytes]
) -> tuple[Sequence[bytes], Sequence[bytes]]:
    """The sampled buckets among ordered puts (``keys`` ascending: they are found by two
    binary searches, not a look at every key)."""
    start = bisect_left(keys, SAMPLED_PREFIX)
    end = bisect_right(keys, _SAMPLED_LAST, lo=start)
    return keys[start:end], values[start:end]


def sampled_elsewhere(puts: Mapping[bytes, bytes]) -> bool:
    """Whether unordered puts hold a sampled bucket (no batch writes one so; a copy of an
    index might)."""
    return any(k.startswith(SAMPLED_PREFIX) for k in puts)
