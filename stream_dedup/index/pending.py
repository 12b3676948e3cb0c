"""A batch's commit, built: the index's own records it writes and the keys it adds to the filters.

:meth:`~stream_dedup.index.store.DedupIndex.prepare` turns a batch's changes into one
backend write. Besides the batch's records that write holds the index's own: the new
counters and the next input offsets (so the counters, the offsets and the records they
count are stored together or not at all). Every look-up key the write holds reaches the
epoch's key filter when it is applied, however the caller handed it in: the filter has no
false negatives because of it (:mod:`stream_dedup.index.filter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stream_dedup.core.hashing import U64
from stream_dedup.index import keys
from stream_dedup.index.backend import OrderedPuts, PreparedWrite
from stream_dedup.index.epoch_filters import LOOKUP_KINDS
from stream_dedup.index.filter import bucket_fingerprints, key_fingerprints
from stream_dedup.index.retention import Retention, Timeline

__all__ = ["PendingCommit", "counter_records", "offset_records", "written_fingerprints"]


@dataclass(slots=True)
class PendingCommit:
    """A commit built by :meth:`DedupIndex.prepare`, waiting for :meth:`DedupIndex.apply`."""

    write: PreparedWrite
    counters: dict[str, int]
    after_writes: int
    fingerprints: U64
    epoch: int
    timeline: Timeline
    #: Epochs the commit lets go: dropped once it is applied.
    dead: list[int]
    #: The retention the commit stores.
    retention: Retention
    #: The sampled buckets it writes (keys ascending, values), learnt by the index's
    #: :class:`~.sampled_cache.SampledCache` once applied; ``None``: it writes a sampled
    #: bucket otherwise than as an ordered put, and the cache is emptied instead.
    sampled: tuple[Sequence[bytes], Sequence[bytes]] | None = ((), ())


def counter_records(
    counters: Mapping[str, int], deltas: Mapping[str, int]
) -> tuple[dict[str, int], dict[bytes, bytes]]:
    """The counters after ``deltas``, and the records of those that changed."""
    after = dict(counters)
    records: dict[bytes, bytes] = {}
    for name, delta in deltas.items():
        after[name] += delta
        records[keys.counter_key(name)] = after[name].to_bytes(8, "little")
    return after, records


def offset_records(offsets: Mapping[tuple[str, int], int]) -> dict[bytes, bytes]:
    """The records of the next input offset of each (topic, partition)."""
    return {keys.offset_key(t, p): o.to_bytes(8, "little") for (t, p), o in offsets.items()}


def written_fingerprints(
    records: Mapping[bytes, bytes], ordered: OrderedPuts, ordered_fingerprints: U64 | None
) -> U64:
    """The fingerprints of the look-up keys among ``records`` and ``ordered``'s keys.

    ``ordered_fingerprints`` are those of ``ordered``'s keys (bucket keys) when the caller
    has them: one per key, else a :class:`ValueError`.
    """
    buckets: list[bytes] = []
    lookups: list[bytes] = []
    for key in records:
        kind = key[:1]
        if kind == keys.BUCKET:
            buckets.append(key)
        elif kind in LOOKUP_KINDS:
            lookups.append(key)
    if ordered_fingerprints is None:
        ordered_fingerprints = bucket_fingerprints(ordered.keys)
    elif ordered_fingerprints.size != len(ordered.keys):
        raise ValueError("one fingerprint per ordered put is needed")
    fps = [bucket_fingerprints(buckets), key_fingerprints(lookups), ordered_fingerprints]
    return np.concatenate(fps)
