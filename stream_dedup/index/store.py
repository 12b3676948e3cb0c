"""The typed index over a backend: parameters, counters, offsets, atomic commits.

The deduplicator reads through :meth:`DedupIndex.read` and hands every change of a batch to
:meth:`DedupIndex.commit`, which writes index updates, counters and the processed input
offsets in one atomic backend write. That single write is what lets the service resume
exactly where it stopped.

Before a batch's events leave the process, the service records the batch's input ranges as
the *batch intent* (:meth:`DedupIndex.write_intent`); the commit that stores the batch
clears it in the same write. An intent found at start-up names exactly the batch whose
events may already be out, so the service can decide that same batch again. Ranges are
plain ``(topic, partition) -> (start, end)`` pairs: the index knows nothing of Kafka.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from stream_dedup.core.hashing import U64
from stream_dedup.errors import IndexMismatchError, IndexStoreError
from stream_dedup.index import keys
from stream_dedup.index.backend import NO_ORDERED_PUTS, Backend, OrderedPuts, PreparedWrite
from stream_dedup.index.filter import KeyFilter, bucket_fingerprints, key_fingerprints
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.rocks import RocksBackend

log = logging.getLogger("stream_dedup.index")

#: Keys fingerprinted at a time while the key filter is built.
_FILTER_CHUNK = 1 << 18
#: The key filter saved beside a RocksDB index when its writer closes it (see load_filter).
FILTER_FILE = "keyfilter.bin"
#: Keys read through the key filter besides the band buckets: verdicts and exact texts.
_LOOKUP_KINDS = frozenset({keys.VERDICT, keys.EXACT})

#: Counters kept in the index, updated in the same write as the records they count.
COUNTERS = ("documents", "indexed", "duplicates", "empty")

#: Input ranges of one batch: (topic, partition) -> (first offset, last offset + 1).
Ranges = Mapping[tuple[str, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class IndexStats:
    """What ``stream-dedup stats`` prints."""

    location: str
    params: IndexParams
    documents: int
    indexed: int
    duplicates: int
    empty: int
    size_bytes: int


@dataclass(slots=True)
class PendingCommit:
    """A commit built by :meth:`DedupIndex.prepare`, waiting for :meth:`DedupIndex.apply`."""

    write: PreparedWrite
    counters: dict[str, int]
    after_writes: int
    fingerprints: U64


class DedupIndex:
    """One open index. Not thread-safe; one process writes an index (RocksDB's lock)."""

    def __init__(self, backend: Backend, params: IndexParams | None) -> None:
        self._backend = backend
        stored_raw = backend.get_many([keys.META])[0]
        if stored_raw is None:
            if params is None:
                backend.close()
                raise IndexStoreError(
                    f"{backend.location} is not a stream-dedup index (no metadata); "
                    "create one with `stream-dedup dedup --index DIR`"
                )
            backend.write({keys.META: params.to_bytes()})
            self._params = params
        else:
            stored = IndexParams.from_bytes(stored_raw)
            if params is not None and stored != params:
                backend.close()
                raise IndexMismatchError(backend.location, stored.differences(params))
            self._params = stored
        raw = backend.get_many([keys.counter_key(c) for c in COUNTERS])
        self._counters = {
            name: int.from_bytes(v, "little") if v else 0
            for name, v in zip(COUNTERS, raw, strict=True)
        }
        self._intent_pending = self.intent() is not None
        self._writes = 0  # batch writes so far: a prepared commit is valid for one value
        self._filter: KeyFilter | None = None  # built on first use: see load_filter

    @property
    def params(self) -> IndexParams:
        return self._params

    @property
    def location(self) -> str:
        return self._backend.location

    def counter(self, name: str) -> int:
        """A committed counter (see :data:`COUNTERS`)."""
        return self._counters[name]

    def read(self, keys_: Sequence[bytes]) -> list[bytes | None]:
        """One batched read of committed values."""
        return self._backend.get_many(keys_)

    def read_lookups(self, lookup_keys: Sequence[bytes]) -> list[bytes | None]:
        """Committed values of verdict and exact-text keys (``None``: absent).

        Through the key filter, like :meth:`read_buckets`; the answer is what :meth:`read`
        would give.
        """
        if not {k[:1] for k in lookup_keys} <= _LOOKUP_KINDS:
            raise ValueError("read_lookups reads verdict and exact-text keys only")
        return self._read_filtered(lookup_keys, key_fingerprints(lookup_keys))

    def read_buckets(
        self, bucket_keys: Sequence[bytes], fingerprints: U64 | None = None
    ) -> list[bytes | None]:
        """Committed band buckets for ``bucket_keys`` (``None``: no such bucket).

        Only the keys the key filter cannot rule out are read (see
        :mod:`stream_dedup.index.filter`); the answer is what :meth:`read` would give.
        ``fingerprints`` are the keys' :func:`bucket_fingerprints` when the caller has them.
        """
        if fingerprints is None:
            fingerprints = bucket_fingerprints(bucket_keys)
        elif fingerprints.size != len(bucket_keys):
            raise ValueError("one fingerprint per bucket key is needed")
        return self._read_filtered(bucket_keys, fingerprints)

    def read_buckets_present(
        self, bucket_keys: Sequence[bytes], fingerprints: U64
    ) -> tuple[list[int], list[bytes]]:
        """:meth:`read_buckets` as the positions of the buckets the index holds and their
        contents: a batch's ~36,000 keys find a few hundred, and a list of every answer
        would be mostly ``None``s to walk past."""
        if fingerprints.size != len(bucket_keys):
            raise ValueError("one fingerprint per bucket key is needed")
        where = np.flatnonzero(self.load_filter().may_hold(fingerprints)).tolist()
        if not where:
            return [], []
        read = self._backend.get_many([bucket_keys[i] for i in where])
        found = [(i, v) for i, v in zip(where, read, strict=True) if v is not None]
        return [i for i, _ in found], [v for _, v in found]

    def _read_filtered(self, wanted: Sequence[bytes], fingerprints: U64) -> list[bytes | None]:
        maybe = np.flatnonzero(self.load_filter().may_hold(fingerprints))
        values: list[bytes | None] = [None] * len(wanted)
        if maybe.size:
            where = maybe.tolist()
            for i, value in zip(
                where, self._backend.get_many([wanted[i] for i in where]), strict=True
            ):
                values[i] = value
        return values

    def load_filter(self, progress: Callable[[int], None] | None = None) -> KeyFilter:
        """The key filter: the one saved when the index was last closed, if nothing was
        written since, else built from a scan of the index's lookup keys.

        A filter is saved by :meth:`close` (the file :data:`FILTER_FILE` beside the
        index), stamped with the index's write sequence number; it is loaded only at the
        same number, so any write since (a crash after more batches, another program)
        means a scan. The file is removed once read: from then on it would describe an
        index that has moved on, until the next close saves it again.

        A built filter is sized for twice the keys the index can hold now (``bands``
        buckets, a verdict and an exact-text key per indexed document, a verdict per
        other one). Every later write adds its lookup keys (:meth:`apply`), so the filter
        never misses a committed key. ``progress`` is called with the keys added so far
        after every chunk of the scan (a fraction of a second each), so a long build can
        be reported and kept alive.
        """
        if self._filter is not None:
            return self._filter
        started = time.perf_counter()
        saved = self._load_saved_filter()
        if saved is not None:
            self._filter = saved
            _log_filter("key filter loaded", saved, started)
            return saved
        c = self._counters
        filt = KeyFilter(2 * (c["indexed"] * (self._params.bands + 1) + c["documents"]))
        for kind in (keys.BUCKET, *sorted(_LOOKUP_KINDS)):
            fingerprint = bucket_fingerprints if kind == keys.BUCKET else key_fingerprints
            scan = self._backend.scan_keys(kind)
            while chunk := list(islice(scan, _FILTER_CHUNK)):
                filt.add(fingerprint(chunk))
                if progress is not None:
                    progress(filt.count)
        self._filter = filt
        if filt.count:
            _log_filter("key filter built from the index", filt, started)
        return filt

    def _load_saved_filter(self) -> KeyFilter | None:
        """The filter :meth:`close` saved, if it describes the index as it is; the file
        is removed either way."""
        path = self._backend.sidecar(FILTER_FILE)
        if path is None or not path.exists():
            return None
        try:
            return KeyFilter.load(path, self._backend.sequence())
        except (OSError, ValueError) as exc:
            log.info(
                "saved key filter not used; building it from the index",
                extra={"fields": {"file": str(path), "reason": str(exc)}},
            )
            return None
        finally:
            path.unlink(missing_ok=True)

    def _save_filter(self) -> None:
        """Save the key filter for the next opening (see :meth:`load_filter`)."""
        path = self._backend.sidecar(FILTER_FILE)
        if self._filter is None or path is None:
            return
        started = time.perf_counter()
        try:
            self._filter.save(path, self._backend.sequence())
        except OSError as exc:
            log.warning(
                "could not save the key filter; the next start builds it from the index",
                extra={"fields": {"file": str(path), "error": str(exc)}},
            )
            return
        log.info(
            "key filter saved",
            extra={
                "fields": {
                    "file": str(path),
                    "bytes": self._filter.nbytes,
                    "seconds": round(time.perf_counter() - started, 3),
                }
            },
        )

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
    ) -> PendingCommit:
        """The write :meth:`commit` would make, built but not applied (see :meth:`apply`).

        ``ordered`` are more puts in ascending key order (see
        :meth:`~stream_dedup.index.backend.Backend.prepare`), and ``ordered_fingerprints``
        their keys' :func:`bucket_fingerprints` when the caller has them. Nothing may be
        written to the index between ``prepare`` and ``apply``: the counters and the intent
        to clear are read now.
        """
        batch = dict(puts)
        new_counters = dict(self._counters)
        for name, delta in counter_deltas.items():
            new_counters[name] += delta
            batch[keys.counter_key(name)] = new_counters[name].to_bytes(8, "little")
        for (topic, partition), offset in (offsets or {}).items():
            batch[keys.offset_key(topic, partition)] = offset.to_bytes(8, "little")
        if self._intent_pending:
            batch[keys.INTENT] = b""  # the backend has no delete; empty means "none"
        # Every lookup key written reaches the filter, however it was handed in.
        buckets: list[bytes] = []
        lookups: list[bytes] = []
        for key in batch:
            kind = key[:1]
            if kind == keys.BUCKET:
                buckets.append(key)
            elif kind in _LOOKUP_KINDS:
                lookups.append(key)
        if ordered_fingerprints is None:
            ordered_fingerprints = bucket_fingerprints(ordered.keys)
        elif ordered_fingerprints.size != len(ordered.keys):
            raise ValueError("one fingerprint per ordered put is needed")
        fps = [bucket_fingerprints(buckets), key_fingerprints(lookups), ordered_fingerprints]
        return PendingCommit(
            self._backend.prepare(batch, ordered),
            new_counters,
            self._writes,
            np.concatenate(fps),
        )

    def apply(self, pending: PendingCommit) -> None:
        """Apply a prepared commit: the atomic write, and the new counters in memory."""
        if pending.after_writes != self._writes:
            raise RuntimeError("the index was written after this commit was prepared")
        self._backend.apply(pending.write)
        if self._filter is not None:  # not built yet: its scan will see these keys
            self._filter.add(pending.fingerprints)
        self._counters = pending.counters
        self._intent_pending = False
        self._writes += 1

    def write_intent(self, ranges: Ranges) -> None:
        """Record the input ranges of the batch about to be emitted (one small atomic put).

        Written before any of the batch's events are produced, so that after a crash the
        same batch (same ranges, hence the same documents) can be decided again and its
        replayed events equal the ones already emitted. Cleared by the next :meth:`commit`.
        """
        body = sorted([t, p, start, end] for (t, p), (start, end) in ranges.items())
        self._backend.write({keys.INTENT: json.dumps(body, separators=(",", ":")).encode()})
        self._intent_pending = True
        self._writes += 1

    def intent(self) -> dict[tuple[str, int], tuple[int, int]] | None:
        """The ranges of a batch announced but never committed, or ``None``."""
        raw = self._backend.get_many([keys.INTENT])[0]
        if not raw:
            return None
        return {(str(t), int(p)): (int(a), int(b)) for t, p, a, b in json.loads(raw)}

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to consume per (topic, partition), as last committed."""
        return {
            keys.parse_offset_key(k): int.from_bytes(v, "little")
            for k, v in self._backend.scan_prefix(keys.OFFSET)
        }

    def size_bytes(self) -> int:
        return self._backend.size_bytes()

    def filter_bytes(self) -> int:
        """Memory held by the key filter (0 until it is built)."""
        filt = self._filter
        return 0 if filt is None else filt.nbytes

    def stats(self) -> IndexStats:
        c = self._counters
        return IndexStats(
            location=self.location,
            params=self._params,
            documents=c["documents"],
            indexed=c["indexed"],
            duplicates=c["duplicates"],
            empty=c["empty"],
            size_bytes=self.size_bytes(),
        )

    def close(self) -> None:
        """Close the index; a writer saves its key filter first (see :meth:`load_filter`)."""
        self._save_filter()
        self._backend.close()


def _log_filter(message: str, filt: KeyFilter, started: float) -> None:
    """Log how large a key filter is and how long it took (since ``started``) to get."""
    fields = {
        "keys": filt.count,
        "bytes": filt.nbytes,
        "seconds": round(time.perf_counter() - started, 3),
    }
    log.info(message, extra={"fields": fields})


def open_index(
    path: str | Path | None, params: IndexParams | None, *, sync: bool = False
) -> DedupIndex:
    """Open (or create) the index at ``path``; ``None`` means a fresh in-memory index.

    With ``params=None`` an existing index is opened with whatever parameters it stores.
    """
    backend: Backend = MemoryBackend() if path is None else RocksBackend(path, sync=sync)
    return DedupIndex(backend, params)
