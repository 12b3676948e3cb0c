"""A shared index's write, built for its commit point: what the lease has to wait for.

Everything built here is built while the index's lease is held (the write depends on
the batch's verdicts), so it is built in few array operations, not a Python step per
record: the band buckets (~30,000 of a 2,000-document batch, nine in ten of its
fields) go into the redo record as joined bytes straight from the matching pass's
arrays (:class:`~.redis_layout.PackedBuckets`), and are expanded into fields of the
record hashes only when the write is applied, after the lease (:mod:`.redis_redo`).
The document records go into the redo record too, as they are, so that the commit
point is one script and one round trip: nothing is written before it. A batch decided
before the lease hands its records in kind by kind, built there (:func:`prepare_records`):
the lease only joins them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from stream_dedup.core.hashing import U64
from stream_dedup.index.backend import OrderedPuts
from stream_dedup.index.batch_records import BatchRecords, doc_keys
from stream_dedup.index.redis_layout import (
    PackedBuckets,
    decode_redo,
    encode_redo,
)
from stream_dedup.index.redis_log import encode_entry
from stream_dedup.index.redis_members import compact_buckets, compact_members
from stream_dedup.index.redis_redo import Flat

__all__ = ["Write", "prepare_records", "prepare_write"]

_DOC = ord("d")
_LIMIT = 1 << 32


class Write(NamedTuple):
    """A prepared write: the write as its redo record holds it (``None``: only in the
    record's bytes, decoded when applied), the redo record, and its change log entry."""

    epoch: int
    rest: Flat | None
    redo: bytes
    entry: bytes

    def flat(self) -> Flat:
        """The rest of the write, decoded from its redo record when not kept."""
        return self.rest if self.rest is not None else Flat(*decode_redo(self.redo))


def prepare_write(
    puts: Mapping[bytes, bytes],
    ordered: OrderedPuts,
    epoch: int,
    changed: U64 | None,
    compacted: tuple[list[bytes], list[bytes]] | None = None,
) -> Write:
    """The write of ``puts`` and ``ordered`` (band buckets in key order) to ``epoch``;
    ``changed`` the fingerprints of its look-up keys, for the change log; ``compacted``:
    the records in place of ``puts``, document records first, already compacted."""
    if compacted is not None:
        mixed, mixed_values = compacted
    else:
        # The document records (most of the bytes) pass as they are; verdicts, texts and
        # any loose buckets are compacted.
        docs = [k for k in puts if k[0] == _DOC]
        others = [k for k in puts if k[0] != _DOC]
        mixed = docs + others
        mixed_values = [puts[k] for k in docs] + compact_buckets(others, [puts[k] for k in others])
    entry = encode_entry(epoch, changed)
    arrays = ordered.arrays
    packed = None if arrays is None else compact_members(arrays.counts, arrays.members)
    if arrays is not None and packed is not None:
        sizes, joined = packed
        buckets = PackedBuckets(len(ordered.keys), arrays.keys, sizes, joined)
        redo = encode_redo(epoch, mixed, mixed_values, len(mixed), buckets)
        return Write(epoch, None, redo, entry)
    keys = mixed + list(ordered.keys)
    values = mixed_values + compact_buckets(ordered.keys, ordered.values)
    rest = Flat(epoch, keys, values, len(mixed))
    redo = encode_redo(epoch, keys, values, len(mixed))
    return Write(epoch, rest, redo, entry)


def prepare_records(
    records: BatchRecords,
    puts: Mapping[bytes, bytes],
    ordered: OrderedPuts,
    epoch: int,
    changed: U64 | None,
) -> Write:
    """:func:`prepare_write` of ``records``' puts followed by ``puts`` (the index's own
    records), the same bytes, from the records' parts: no mapping of the batch's records
    is built, and the verdict and document records pass as they were built (before a
    shared index's lease, :mod:`stream_dedup.dedup.settled`)."""
    nums = records.exact_nums
    if not ordered.arrays or (nums.size and int(nums.max()) >= _LIMIT):
        return prepare_write({**records.puts(), **puts}, ordered, epoch, changed)
    tail = list(puts)
    mixed = [
        *doc_keys(records.doc_nums),
        *records.verdict_keys,
        *records.exact_keys,
        *records.empty_keys,
        *tail,
    ]
    values = [
        *records.doc_values,
        *records.verdict_values,
        *nums.astype("<u4").view("V4").tolist(),  # a text's docnum in 4 bytes, as compacted
        *records.empty_values,
        *compact_buckets(tail, [puts[k] for k in tail]),
    ]
    return prepare_write({}, ordered, epoch, changed, (mixed, values))
