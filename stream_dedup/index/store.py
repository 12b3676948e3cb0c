"""The typed index over a backend: parameters, counters, offsets, atomic commits.

The deduplicator asks the index typed questions (:mod:`.reads`: the verdicts of ids, the
first documents with exact texts, bucket members, document records), stages a batch's
records in the index's own encodings (:mod:`.staged`) and hands every change of the batch
to :meth:`DedupIndex.commit` (or :meth:`~DedupIndex.prepare` then :meth:`~DedupIndex.apply`),
which writes index updates, counters and the processed input offsets in one atomic backend
write (:mod:`.pending` builds the index's own records in it and the filters' new keys). That
single write is what lets the service resume exactly where it stopped. An index is opened
through :func:`stream_dedup.index.opener.open_index`.

Before a batch's events leave the process, the service records the batch's input ranges as
the *batch intent* (:mod:`.progress`); the commit that stores the batch clears it.

Retention (:mod:`stream_dedup.index.retention`): the records of documents live in epochs;
reads go to every live epoch, a batch writes to one, and the commit that lets an epoch go
is the same atomic write as the batch's, after which the epoch is dropped whole. An epoch
left behind by a crash between the two, or created for a batch never committed, is
dropped by the next commit.

A shared backend (Redis) is written by other instances too: a batch is decided and
stored inside :meth:`DedupIndex.exclusive`, which re-reads the counters and epochs at
its start and brings the key filters up to date from the backend's change log
(:mod:`.followed`), so that inside it only the keys they cannot rule out are read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from stream_dedup.core import payload_dictionary
from stream_dedup.core.hashing import U64
from stream_dedup.errors import IndexMismatchError, IndexStoreError
from stream_dedup.index import keys
from stream_dedup.index.backend import NO_ORDERED_PUTS, Backend, OrderedPuts
from stream_dedup.index.batch_records import BatchRecords
from stream_dedup.index.bucket_records import Members
from stream_dedup.index.epoch_filters import FILTER_FILE, EpochFilters
from stream_dedup.index.followed import FollowedFilters
from stream_dedup.index.index_stats import IndexStats
from stream_dedup.index.lease import SharedSections
from stream_dedup.index.params import IndexParams
from stream_dedup.index.pending import (
    PendingCommit,
    counter_records,
    offset_records,
    written_fingerprints,
)
from stream_dedup.index.progress import IndexProgress
from stream_dedup.index.reads import IndexReads
from stream_dedup.index.retention import (
    I64,
    NO_CLOCK,
    NO_RETENTION,
    Retention,
    RetentionChange,
    Timeline,
    encode_points,
)
from stream_dedup.index.sampled_cache import SampledCache, sampled_elsewhere, sampled_puts
from stream_dedup.index.staged import COUNTERS, DocRecord, StoredVerdict
from stream_dedup.index.state_lock import StateLock
from stream_dedup.index.timeline_store import load_timeline, refresh_timeline, stored_epochs

__all__ = [
    "COUNTERS",
    "FILTER_FILE",
    "DedupIndex",
    "DocRecord",
    "IndexStats",
    "Members",
    "PendingCommit",
    "StoredVerdict",
]


class DedupIndex(IndexReads, IndexProgress, SharedSections):
    """One open index. One process writes an index (RocksDB's lock), from one thread;
    other threads may read it inside :meth:`~.reads.IndexReads.consistent`.

    Its typed reads are those of :class:`~stream_dedup.index.reads.IndexReads`; its writes
    are a batch's commit (:meth:`prepare`, :meth:`apply`), and the batch intent and offsets
    of :class:`~stream_dedup.index.progress.IndexProgress`.

    Open one with :func:`~stream_dedup.index.opener.open_index`, which picks the backend.
    ``retention`` says how much of the stream it holds (see
    :mod:`stream_dedup.index.retention`). The index stores the retention it was last
    committed under and uses it when ``retention`` is ``None``; a :class:`RetentionChange`
    is made over the stored one. Given only here, at opening: a retention other than the
    stored one applies from the next batch and is stored with it. It is not one of the
    parameters checked at opening: changing it needs no re-indexing.
    """

    def __init__(
        self,
        backend: Backend,
        params: IndexParams | None,
        retention: Retention | RetentionChange | None = None,
    ) -> None:
        self._backend = backend
        self._shared = backend.shared
        self._asked_retention = retention
        # Any reader of this index's payloads (a check, a follower in another process)
        # finds the dictionaries they name here, not only the process that trained one.
        payload_dictionary.add_source(self.dictionary_bytes)
        stored_raw = backend.get_many([keys.META])[0]
        self._upgrade = False  # the stored format is older: the next commit stores the new
        if stored_raw is None:
            if params is None:
                backend.close()
                raise IndexStoreError(
                    f"{backend.location} is not a stream-dedup index (no metadata): check "
                    "the location; `stream-dedup dedup --index DIR` creates one on disk, and "
                    "a service on Redis creates its own"
                )
            backend.write({keys.META: params.to_bytes()})
            self._params = params
            self._stored_format = params.format_version
        else:
            as_stored = IndexParams.from_bytes(stored_raw)
            stored, self._upgrade = as_stored.upgraded()
            self._stored_format = as_stored.format_version
            if params is not None and stored != params:
                backend.close()
                raise IndexMismatchError(backend.location, stored.differences(params))
            self._params = stored
        self._load_state()
        self._intent_pending = self.intent() is not None
        self._writes = 0  # batch writes so far: a prepared commit is valid for one value
        self._filters = EpochFilters(backend)  # loaded on first use: see load_filter
        self._followed = FollowedFilters(backend, self._filters)  # a shared index's
        self._tidied = False  # epochs the table does not list are dropped at the first commit
        self._state_lock = StateLock()  # see IndexReads.consistent
        #: Sampled buckets as this index last committed them (not on a shared index).
        self._sampled = SampledCache(not self._shared and not self._unfiltered)
        #: Called after each commit is applied (the service tells its check process); on a
        #: shared index possibly from its applier thread.
        self.on_commit: Callable[[], None] | None = None

    def _load_state(self, since: int | None = None) -> None:
        """Counters, epochs and retention as committed (by anyone, for a shared index).

        ``since``: the clock's change points held in memory are those of the documents
        before this docnum; only the points of later ones are read (see
        :func:`~stream_dedup.index.timeline_store.refresh_timeline`)."""
        wanted = [keys.counter_key(c) for c in COUNTERS] + [keys.RETENTION, keys.EPOCHS]
        *raw, raw_retention, raw_epochs = self._backend.get_many(wanted)  # one round trip
        self._counters = {
            name: int.from_bytes(v, "little") if v else 0
            for name, v in zip(COUNTERS, raw, strict=True)
        }
        self._stored_retention = (
            NO_RETENTION if raw_retention is None else Retention.from_bytes(raw_retention)
        )
        asked = self._asked_retention
        if isinstance(asked, RetentionChange):  # made once, over what was stored at opening
            asked = self._asked_retention = asked.applied_to(self._stored_retention)
        self._retention = self._stored_retention if asked is None else asked
        # The clock's change points only serve retention: without it a shared index, which
        # re-reads its state at every batch, reads none.
        points = not self._shared or self.retention != NO_RETENTION
        if raw_epochs is None:
            self._timeline = Timeline.fresh()
        elif not points:
            self._timeline = stored_epochs(raw_epochs)
        elif since is None:
            self._timeline = load_timeline(self._backend, raw_epochs)
        else:
            self._timeline = refresh_timeline(
                self._backend, raw_epochs, self._timeline, since, self._counters["indexed"]
            )

    @property
    def shared(self) -> bool:
        """Whether other instances write this index too (see :meth:`exclusive`)."""
        return self._shared

    @property
    def params(self) -> IndexParams:
        return self._params

    @property
    def retention(self) -> Retention:
        """The retention in force: the one given at opening, else the one stored."""
        return self._retention

    @property
    def location(self) -> str:
        return self._backend.location

    @property
    def timeline(self) -> Timeline:
        """The live epochs, the stream's clock and its change points, as committed."""
        return self._timeline

    def counter(self, name: str) -> int:
        """A committed counter (see :data:`COUNTERS`)."""
        return self._counters[name]

    def cutoff(self) -> int:
        """The first docnum the index holds now: every document before it has expired."""
        return self._timeline.cutoff(self.retention, self._counters["indexed"])

    def batch_epoch(self) -> int:
        """The epoch the next batch writes to (see :meth:`Timeline.batch_epoch`)."""
        return self._timeline.batch_epoch(self.retention, self._counters["indexed"])

    def commit(
        self,
        puts: Mapping[bytes, bytes],
        counter_deltas: Mapping[str, int],
        offsets: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Write a batch's records, counters and next input offsets atomically.

        A pending batch intent is cleared in the same write: the batch it announced is now
        stored, so there is nothing left to replay.
        """
        self.apply(self.prepare(puts, counter_deltas, offsets))

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        counter_deltas: Mapping[str, int],
        offsets: Mapping[tuple[str, int], int] | None = None,
        *,
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        ordered_fingerprints: U64 | None = None,
        epoch: int | None = None,
        points: tuple[I64, I64] | None = None,
        clock: int | None = None,
        records: BatchRecords | None = None,
    ) -> PendingCommit:
        """The write :meth:`commit` would make, built but not applied (see :meth:`apply`).

        ``ordered`` are more puts in ascending key order (see
        :meth:`~stream_dedup.index.backend.Backend.prepare`), and ``ordered_fingerprints``
        their keys' :func:`~.filter.bucket_fingerprints` when the caller has them. The batch's
        records go to ``epoch`` (by default :meth:`batch_epoch`), ``points`` are its clock
        change points (docnums, clocks) and ``clock`` the stream's clock after it. Nothing
        may be written to the index between ``prepare`` and ``apply``: the counters, the
        epochs and the intent to clear are read now. ``records``: more records before
        ``puts``, kept kind by kind (a backend that encodes them so takes them apart).
        """
        apart = records is not None and hasattr(self._backend, "prepare_records")
        batch = dict(puts) if records is None or apart else {**records.puts(), **puts}
        new_counters, counted = counter_records(self._counters, counter_deltas)
        batch.update(counted)
        batch.update(offset_records(offsets or {}))
        if self._intent_pending:
            batch[keys.INTENT] = b""  # the backend has no delete; empty means "none"
        epoch = self.batch_epoch() if epoch is None else epoch
        empty = np.empty(0, dtype=np.int64)
        new_doc, new_clock = points if points is not None else (empty, empty)
        if new_doc.size:
            batch[keys.points_key(int(new_doc[0]))] = encode_points(new_doc, new_clock)
        timeline, dead = self._timeline.after(
            epoch,
            self._counters["indexed"],
            new_doc,
            new_clock,
            self._timeline.clock if clock is None else clock,
            new_counters["indexed"],
            self.retention,
        )
        if timeline.to_bytes() != self._timeline.to_bytes():
            batch[keys.EPOCHS] = timeline.to_bytes()
        if self.retention != self._stored_retention:
            batch[keys.RETENTION] = self.retention.to_bytes()
        if self._upgrade:
            batch[keys.META] = self._params.to_bytes()
        # Every lookup key written reaches the filter, however it was handed in.
        fingerprints = written_fingerprints(batch, ordered, ordered_fingerprints)
        if apart:
            assert records is not None
            fingerprints = np.concatenate([records.fingerprints, fingerprints])
            write = self._backend.prepare_records(records, batch, ordered, epoch, fingerprints)  # type: ignore[attr-defined]
        else:
            write = self._backend.prepare(batch, ordered, epoch, changed=fingerprints)
        sampled: tuple[Sequence[bytes], Sequence[bytes]] | None = ((), ())
        if self._sampled.enabled:  # records kept apart are not looked in: emptied instead
            sampled = None if apart or sampled_elsewhere(batch) else sampled_puts(*ordered[:2])
        return PendingCommit(
            write,
            new_counters,
            self._writes,
            fingerprints,
            epoch,
            timeline,
            dead,
            self.retention,
            sampled,
        )

    def apply(self, pending: PendingCommit, committed: Callable[[], None] | None = None) -> None:
        """Apply a prepared commit: the atomic write, then, while readers in
        ``consistent()`` wait, the new counters and epochs in memory and the epochs it
        let go dropped (a reader meanwhile sees the write whole or not at all).
        ``committed`` is called at the write's commit point
        (:meth:`~stream_dedup.index.backend.Backend.apply`)."""
        if pending.after_writes != self._writes:
            raise RuntimeError("the index was written after this commit was prepared")
        try:
            self._backend.apply(pending.write, committed)
        except BaseException:
            self._sampled.clear()  # it may have landed or not: neither is known
            raise
        if pending.sampled is None:
            self._sampled.clear()
        else:
            self._sampled.committed(pending.epoch, *pending.sampled)
        with self._state_lock.writing():
            self._swap(pending)
        if self.on_commit is not None:
            # Another process reads what is applied: a shared backend tells once it is.
            after: Callable[[Callable[[], None]], None] | None
            after = getattr(self._backend, "after_applied", None)
            if after is not None:
                after(self.on_commit)
            else:
                self.on_commit()

    def _swap(self, pending: PendingCommit) -> None:
        if self._filters.loaded:  # not loaded yet: its scan will see these keys
            self._filters.add(pending.epoch, pending.fingerprints, self._new_filter_size())
        self._counters = pending.counters
        self._timeline = pending.timeline
        self._stored_retention = pending.retention
        self._intent_pending = self._upgrade = False
        self._stored_format = self._params.format_version
        self._writes += 1
        live = set(pending.timeline.numbers())
        gone = list(pending.dead)
        if not self._tidied:
            gone += [e for e in self._backend.epochs() if e not in live and e not in gone]
            self._tidied = True
        for epoch in gone:
            self._sampled.dropped(epoch)
            self._backend.drop_epoch(epoch)
            self._filters.drop(epoch)

    def _new_filter_size(self) -> int:
        """Keys a new epoch's filter is sized for: those of an epoch like the last one
        (a filter outgrowing its size stacks a larger one on top)."""
        epochs = self._timeline.epochs
        docs = epochs[-1].first - epochs[-2].first if len(epochs) > 1 else 0
        return 2 * (self._params.bands + 2) * max(1, docs)

    def size_bytes(self) -> int:
        return self._backend.size_bytes()

    def warm_up(self) -> None:
        """Load what the backend's writes run compiled, where it has any (a shared index's
        applier thread loads its packing loop, on that thread)."""
        warm: Callable[[], None] | None = getattr(self._backend, "warm_up", None)
        if warm is not None:
            warm()

    def apply_failures(self) -> int:
        """Writes whose apply after the commit point failed on the backend's own thread
        (a shared index; 0 for others): each left its redo record waiting."""
        return int(getattr(self._backend, "apply_failures", 0))

    def filter_bytes(self) -> int:
        """Memory held by the key filters (0 until they are loaded)."""
        return self._filters.nbytes

    def stats(self) -> IndexStats:
        c = self._counters
        timeline = self._timeline
        cutoff = self.cutoff()
        oldest = timeline.clock_at(cutoff) if cutoff < c["indexed"] else NO_CLOCK
        return IndexStats(
            location=self.location,
            # The format as stored: an older one is stored anew at the next commit.
            params=replace(self._params, format_version=self._stored_format),
            documents=c["documents"],
            indexed=c["indexed"],
            duplicates=c["duplicates"],
            empty=c["empty"],
            size_bytes=self.size_bytes(),
            held=c["indexed"] - cutoff,
            expired=cutoff,
            oldest_time=None if oldest == NO_CLOCK else oldest,
            clock=None if timeline.clock == NO_CLOCK else timeline.clock,
            epochs=len(timeline.epochs),
            retention=self.retention,
        )

    def close(self) -> None:
        """Close the index; a writer saves its key filters first (see :meth:`load_filter`)."""
        with self._state_lock.writing():
            if self._filters.loaded:
                self._filters.save()
            self._backend.close()
