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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stream_dedup.errors import IndexMismatchError, IndexStoreError
from stream_dedup.index import keys
from stream_dedup.index.backend import Backend, PreparedWrite
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.rocks import RocksBackend

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
        ordered: Sequence[tuple[bytes, bytes]] = (),
    ) -> PendingCommit:
        """The write :meth:`commit` would make, built but not applied (see :meth:`apply`).

        ``ordered`` are more puts in ascending key order (see
        :meth:`~stream_dedup.index.backend.Backend.prepare`). Nothing may be written to the
        index between ``prepare`` and ``apply``: the counters and the intent to clear are
        read now.
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
        return PendingCommit(self._backend.prepare(batch, ordered), new_counters, self._writes)

    def apply(self, pending: PendingCommit) -> None:
        """Apply a prepared commit: the atomic write, and the new counters in memory."""
        if pending.after_writes != self._writes:
            raise RuntimeError("the index was written after this commit was prepared")
        self._backend.apply(pending.write)
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
        self._backend.close()


def open_index(
    path: str | Path | None, params: IndexParams | None, *, sync: bool = False
) -> DedupIndex:
    """Open (or create) the index at ``path``; ``None`` means a fresh in-memory index.

    With ``params=None`` an existing index is opened with whatever parameters it stores.
    """
    backend: Backend = MemoryBackend() if path is None else RocksBackend(path, sync=sync)
    return DedupIndex(backend, params)
