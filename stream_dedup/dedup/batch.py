"""What deciding a batch gives: its verdicts, its work done, and the write its commit makes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stream_dedup.core.hashing import U64
from stream_dedup.core.match import I64, Matches
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.batch_records import BatchRecords
from stream_dedup.models import Verdict


@dataclass(slots=True)
class BatchStats:
    """Work done for one batch, for metrics and the offline summary."""

    candidates: list[int] = field(default_factory=list)
    verifications: list[int] = field(default_factory=list)
    truncated_lookups: int = 0
    bucket_evictions: int = 0
    exact_hits: int = 0
    replayed: int = 0
    #: Replayed ids whose normalised text no revision of the id had (only under
    #: ``revisions = "replay"``: they get the id's latest verdict all the same).
    mismatched_repeats: int = 0
    #: Documents decided as a new revision of an id decided before on another text.
    revisions: int = 0
    #: Documents without a time (:attr:`~stream_dedup.models.Document.time` ``None``):
    #: each is decided at the stream's clock as it stands.
    untimed: int = 0
    #: A retention window is in force and no document of the batch had a time: the
    #: window had nothing to measure the batch on (its clock did not move).
    window_without_time: bool = False
    #: Documents found to be excerpts of an earlier one (containment on).
    excerpts: int = 0

    @classmethod
    def of(cls, found: Matches, live: list[int], n_docs: int) -> BatchStats:
        """The matching pass's counts (``found``), per document of the batch (``live``:
        the positions of the documents it matched; the others did no work)."""
        stats = cls(
            exact_hits=found.exact_hits,
            truncated_lookups=found.truncated,
            bucket_evictions=found.evictions,
        )
        per_doc = np.zeros((2, n_docs), dtype=np.int64)
        per_doc[0, live] = found.candidates
        per_doc[1, live] = found.verifications
        stats.candidates, stats.verifications = per_doc.tolist()
        return stats


@dataclass(slots=True)
class BatchResult:
    """Verdicts of a batch plus everything its commit will write.

    ``puts`` and ``counter_deltas`` are the batch's records and counter changes, staged in
    the index's encodings (:class:`~stream_dedup.index.staged.StagedWrite`): the
    deduplicator hands them to the index and reads none of them. ``bucket_puts`` are the
    band buckets' new contents, in ascending key order (RocksDB inserts a run of ascending
    keys several times faster), and ``bucket_fingerprints`` their keys' fingerprints for
    the index's key filter.
    """

    verdicts: list[Verdict]
    puts: dict[bytes, bytes]
    bucket_puts: OrderedPuts
    counter_deltas: dict[str, int]
    stats: BatchStats
    bucket_fingerprints: U64 = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    #: The epoch the batch writes to, its clock change points (docnums, clocks) and the
    #: stream's clock after it (see :mod:`stream_dedup.index.retention`); ``None``: as
    #: the index is (an empty batch).
    epoch: int | None = None
    points: tuple[I64, I64] | None = None
    clock: int | None = None
    #: Records kept kind by kind, written before ``puts`` (a batch settled in a shared
    #: index's lease, :mod:`.settled`); ``None``: all of them are in ``puts``.
    records: BatchRecords | None = None

    @classmethod
    def empty(cls) -> BatchResult:
        """A batch with nothing to decide (every message was dead-lettered): its commit
        writes only what the caller adds (offsets)."""
        return cls([], {}, NO_ORDERED_PUTS, {}, BatchStats())
