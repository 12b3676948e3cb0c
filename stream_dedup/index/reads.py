"""The reads of an open index: typed questions about documents, ids, texts and buckets,
each answered from every live epoch in batched reads through the epochs' key filters.

Mixed into :class:`~stream_dedup.index.store.DedupIndex`, which owns the state they read
(the backend, the epochs, the counters, the filters); kept apart because they are half of
what an index does and change for other reasons than its commit protocol. The answers are
typed (:class:`~stream_dedup.index.staged.StoredVerdict`, docnums,
:class:`~stream_dedup.index.records.DocRecord`, bucket members as arrays): the key and
record encodings stay in this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U64
from stream_dedup.errors import IndexCorruptError
from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.bucket_records import Members, held_members, joined_members
from stream_dedup.index.dictionaries import PayloadDictionaries
from stream_dedup.index.epoch_filters import LOOKUP_KINDS, EpochFilters
from stream_dedup.index.filter import bucket_fingerprints, key_fingerprints
from stream_dedup.index.followed import FollowedFilters
from stream_dedup.index.params import IndexParams
from stream_dedup.index.records import decode_doc
from stream_dedup.index.retention import Timeline
from stream_dedup.index.sampled_cache import SampledCache
from stream_dedup.index.staged import DocRecord, StoredVerdict
from stream_dedup.index.state_lock import StateLock

__all__ = ["IndexReads"]


class IndexReads(PayloadDictionaries):
    """Typed reads over the state of an open index (see the module docstring), and its
    payload dictionaries (:mod:`.dictionaries`)."""

    _backend: Backend
    _shared: bool
    _params: IndexParams
    _timeline: Timeline
    _counters: dict[str, int]
    _filters: EpochFilters
    _followed: FollowedFilters
    _state_lock: StateLock
    _sampled: SampledCache
    #: Read every key, through no key filter: a follower of another process's writes
    #: (:mod:`.follower`) has no filter that knows them.
    _unfiltered: bool = False

    @contextlib.contextmanager
    def consistent(self) -> Iterator[None]:
        """Read from another thread than the writer's: the reads in here never see a
        commit half applied.

        A commit (:meth:`~stream_dedup.index.store.DedupIndex.apply`) writes the backend
        in one atomic write (a read sees all of it or none of it), then swaps the key
        filters, counters and epochs held in memory and drops the epochs retention let
        go. That second part waits while a reader is in here, and a reader waits for it:
        no read runs on a dropped epoch or on filters being changed. A reader may see a
        commit's write before its swap: the newest batch's buckets and records with the
        counters, cutoff and filters of the batch before (a view one batch older in
        part, never a wrong one). Readers share the lock (:class:`~.state_lock.StateLock`):
        checks on several threads read at once and wait only for a swap. The writer's own
        reads need no lock (it is the only one to change the state). Hold it for the reads
        only, not for work on what they return: the writer's swap waits.
        """
        with self._state_lock.reading():
            yield

    def read(self, keys_: Sequence[bytes]) -> list[bytes | None]:
        """One batched read of the index's own keys (and epoch 0's records)."""
        return self._backend.get_many(keys_)

    def read_documents(self, docnums: Sequence[int]) -> list[bytes | None]:
        """The document records of ``docnums`` (ascending), each from its epoch."""
        if len(self._timeline.epochs) == 1:
            only = self._timeline.current.number
            return self._backend.get_many([keys.doc_key(n) for n in docnums], only)
        epochs = self._timeline.epochs
        firsts = np.array([e.first for e in epochs], dtype=np.int64)
        where = np.searchsorted(firsts, np.asarray(docnums, dtype=np.int64), side="right") - 1
        if where.size and where[0] < 0:
            raise IndexCorruptError(f"document {docnums[0]} precedes every live epoch")
        out: list[bytes | None] = []
        bounds = np.searchsorted(where, np.arange(len(epochs) + 1))  # docnums are ascending
        for i, epoch in enumerate(epochs):
            nums = docnums[bounds[i] : bounds[i + 1]]
            if nums:
                out.extend(self._backend.get_many([keys.doc_key(n) for n in nums], epoch.number))
        return out

    def read_decided(
        self, doc_ids: Sequence[str], exact_keys: Sequence[bytes]
    ) -> tuple[list[StoredVerdict | None], list[int | None]]:
        """In one batched read: the verdict each of ``doc_ids`` was given (``None``: never
        decided), and the docnum of the first document with each exact text
        (``exact_keys``: :func:`~stream_dedup.core.lookup_keys.exact_key`; ``None``: no
        indexed document has it)."""
        n = len(doc_ids)
        read = self.read_lookups([keys.verdict_key(i) for i in doc_ids] + list(exact_keys))
        verdicts = [None if raw is None else StoredVerdict(raw) for raw in read[:n]]
        docnums = [None if raw is None else int.from_bytes(raw, "little") for raw in read[n:]]
        return verdicts, docnums

    def lookup_fingerprints(self, doc_ids: Sequence[str], exact_keys: Sequence[bytes]) -> U64:
        """The key filter's fingerprints of the verdict keys of ``doc_ids`` and of
        ``exact_keys``, as :meth:`read_decided` asks and a shared index's log lists them."""
        return key_fingerprints([keys.verdict_key(i) for i in doc_ids] + list(exact_keys))

    def has_decided(self, doc_ids: Sequence[str]) -> bool:
        """Whether any of ``doc_ids`` has a verdict in the index."""
        return any(self.read_lookups([keys.verdict_key(i) for i in doc_ids]))

    def read_records(self, docnums: Sequence[int]) -> dict[int, DocRecord]:
        """The records of the indexed documents ``docnums`` (ascending), in that order.

        Asked for documents a bucket or an exact text names: one without a record is a
        corrupt index (:class:`~stream_dedup.errors.IndexCorruptError`)."""
        out: dict[int, DocRecord] = {}
        for n, value in zip(docnums, self.read_documents(docnums), strict=True):
            if value is None:
                raise IndexCorruptError(f"bucket names document {n}, which has no record")
            out[n] = decode_doc(value)
        return out

    def read_bucket_members(
        self, bucket_keys: Sequence[bytes], fingerprints: U64, epoch: int
    ) -> tuple[Members, Members | None]:
        """The committed members of each bucket key (per position in ``bucket_keys``):
        those in ``epoch`` (the one the batch writes to), and those the other live epochs
        hold, joined oldest first (``None``: none do). ``fingerprints``: as for
        :meth:`read_buckets_present`."""
        present = self.read_buckets_present(bucket_keys, fingerprints)
        return self._members_by_epoch(len(bucket_keys), present, epoch)

    @staticmethod
    def _members_by_epoch(
        n_keys: int, present: list[tuple[int, list[int], list[bytes]]], epoch: int
    ) -> tuple[Members, Members | None]:
        """``epoch``'s members per key, and the other epochs' joined (oldest first)."""
        mine = [(at, held) for e, at, held in present if e == epoch]
        older = [(at, held) for e, at, held in present if e != epoch]
        at, held = mine[0] if mine else ([], [])
        return held_members(n_keys, at, held), joined_members(n_keys, older) if older else None

    def read_sampled_members(
        self, bucket_keys: Sequence[bytes], fingerprints: U64, epoch: int
    ) -> tuple[Members, Members | None]:
        """:meth:`read_bucket_members` for containment's sampled buckets, by the writer:
        the buckets of ``epoch`` that this index last committed or read are answered from
        memory (:mod:`.sampled_cache`), the others read, and what is read there learnt."""
        cache = self._sampled
        if not cache.answers(epoch):
            present = self._read_epochs(bucket_keys, fingerprints)
        else:
            hit_at, hit_values = cache.get(bucket_keys)
            skip = np.zeros(len(bucket_keys), dtype=bool)
            skip[hit_at] = True
            present = self._read_epochs(bucket_keys, fingerprints, (epoch, skip))
            read = [(at, held) for e, at, held in present if e == epoch]
            if read:
                at, held = read[0]
                cache.read(epoch, [bucket_keys[i] for i in at], held)
                hit_at, hit_values = hit_at + at, hit_values + held
            present = [p for p in present if p[0] != epoch] + [(epoch, hit_at, hit_values)]
        return self._members_by_epoch(len(bucket_keys), present, epoch)

    def read_lookups(self, lookup_keys: Sequence[bytes]) -> list[bytes | None]:
        """Committed values of verdict and exact-text keys (``None``: absent), from the
        newest live epoch that holds each.

        Through the key filters, like :meth:`read_buckets`.
        """
        if not {k[:1] for k in lookup_keys} <= LOOKUP_KINDS:
            raise ValueError("read_lookups reads verdict and exact-text keys only")
        values: list[bytes | None] = [None] * len(lookup_keys)
        fps = key_fingerprints(lookup_keys)
        for _, where, found in self._read_epochs(lookup_keys, fps):
            for i, value in zip(where, found, strict=True):
                values[i] = value
        return values

    def read_buckets(
        self, bucket_keys: Sequence[bytes], fingerprints: U64 | None = None
    ) -> list[bytes | None]:
        """Committed band buckets for ``bucket_keys``, every live epoch's members joined
        oldest first (``None``: no such bucket).

        Only the keys the key filters cannot rule out are read (see
        :mod:`stream_dedup.index.filter`). ``fingerprints`` are the keys'
        :func:`bucket_fingerprints` when the caller has them.
        """
        if fingerprints is None:
            fingerprints = bucket_fingerprints(bucket_keys)
        values: list[bytes | None] = [None] * len(bucket_keys)
        for _, where, found in self.read_buckets_present(bucket_keys, fingerprints):
            for i, value in zip(where, found, strict=True):
                old = values[i]
                values[i] = value if old is None else old + value
        return values

    def read_buckets_present(
        self, bucket_keys: Sequence[bytes], fingerprints: U64
    ) -> list[tuple[int, list[int], list[bytes]]]:
        """Per live epoch, oldest first: the epoch, the positions of the buckets it holds
        and their contents. A batch's ~36,000 keys find a few hundred, and a list of every
        answer would be mostly ``None``s to walk past."""
        if fingerprints.size != len(bucket_keys):
            raise ValueError("one fingerprint per bucket key is needed")
        return self._read_epochs(bucket_keys, fingerprints)

    def _read_epochs(
        self,
        wanted: Sequence[bytes],
        fingerprints: U64,
        known: tuple[int, npt.NDArray[np.bool_]] | None = None,
    ) -> list[tuple[int, list[int], list[bytes]]]:
        """Per live epoch that holds any of ``wanted``: the positions found and their
        values. ``known``: an epoch and the keys not to read there (answered elsewhere)."""
        out: list[tuple[int, list[int], list[bytes]]] = []
        everything = list(range(len(wanted)))
        for epoch in self._timeline.numbers():
            if known is not None and known[0] == epoch:
                may = ~known[1]
                if not self._unfiltered:  # the cache is never on where reads are unfiltered
                    may &= self.load_filter().may_hold(epoch, fingerprints)
                where = np.flatnonzero(may).tolist()
            elif self._unfiltered or (self._shared and not self._followed.current):
                where = everything
            else:
                where = np.flatnonzero(self.load_filter().may_hold(epoch, fingerprints)).tolist()
            if not where:
                continue
            read = self._backend.get_many([wanted[i] for i in where], epoch)
            found = [(i, v) for i, v in zip(where, read, strict=True) if v is not None]
            if found:
                out.append((epoch, [i for i, _ in found], [v for _, v in found]))
        return out

    def load_filter(self, progress: Callable[[int], None] | None = None) -> EpochFilters:
        """The key filters of the live epochs: those saved when the index was last
        closed, if nothing was written since, else built from a scan of each epoch's
        lookup keys (see :mod:`stream_dedup.index.epoch_filters`).

        A built filter is sized for twice the keys its epoch can hold now (``bands``
        buckets, a verdict and an exact-text key per indexed document, a verdict per
        other one). Every later write adds its lookup keys (:meth:`apply`), so a filter
        never misses a committed key. ``progress`` is called with the keys added so far
        after every chunk of a scan (a fraction of a second each), so a long build can
        be reported and kept alive. A shared index's filters are built and kept in step
        by :meth:`~stream_dedup.index.store.DedupIndex.exclusive` instead (nothing is
        loaded here).
        """
        if not self._filters.loaded and not self._shared:
            self._filters.load(self._capacities(), progress)
        return self._filters

    def _capacities(self) -> dict[int, int]:
        """Epoch -> the keys a filter built for it is sized for."""
        c, per_doc = self._counters, self._params.bands + 1
        epochs = self._timeline.epochs
        out: dict[int, int] = {}
        for i, epoch in enumerate(epochs):
            end = epochs[i + 1].first if i + 1 < len(epochs) else c["indexed"]
            out[epoch.number] = 2 * ((end - epoch.first) * per_doc + c["documents"] // len(epochs))
        return out
