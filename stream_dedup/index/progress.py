"""Where the input stands in an index: the batch intent and the next input offsets.

Mixed into :class:`~stream_dedup.index.store.DedupIndex`, which owns the backend and the
write count; kept apart because these small writes are the service's resume protocol, not
a batch's commit.

Before a batch's events leave the process, the service records the batch's input ranges as
the *batch intent* (:meth:`IndexProgress.write_intent`); the commit that stores the batch
clears it in the same write. An intent found at start-up names exactly the batch whose
events may already be out, so the service can decide that same batch again. Ranges are
plain ``(topic, partition) -> (start, end)`` pairs: the index knows nothing of Kafka.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.pending import offset_records

__all__ = ["IndexProgress", "Ranges"]

#: Input ranges of one batch: (topic, partition) -> (first offset, last offset + 1).
Ranges = Mapping[tuple[str, int], tuple[int, int]]


class IndexProgress:
    """The batch intent and the processed offsets of an open index (see the module
    docstring)."""

    _backend: Backend
    #: Batch writes so far: a prepared commit is valid for one value.
    _writes: int
    #: An intent is stored: the next commit clears it.
    _intent_pending: bool

    def write_intent(self, ranges: Ranges) -> None:
        """Record the input ranges of the batch about to be emitted (one small atomic put).

        Written before any of the batch's events are produced, so that after a crash the
        same batch (same ranges, hence the same documents) can be decided again and its
        replayed events equal the ones already emitted. Cleared by the next commit.
        """
        body = sorted([t, p, start, end] for (t, p), (start, end) in ranges.items())
        self._backend.write({keys.INTENT: json.dumps(body, separators=(",", ":")).encode()})
        self._intent_pending = True
        self._writes += 1

    def write_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Store the next input offsets alone (one small atomic write): how a shared
        index records progress once a batch's events are confirmed.

        Not counted among the index's writes (``_writes``): offsets are no part of what
        a batch is decided against, so they neither make a prepared commit stale nor a
        batch decided before the lease (``written_since``), which is read as of a
        version while the last batch's offsets may still be on their way."""
        if offsets:
            self._backend.write(offset_records(offsets))

    def intent(self) -> dict[tuple[str, int], tuple[int, int]] | None:
        """The ranges of a batch announced but never committed, or ``None``."""
        raw = self._backend.get_many([keys.INTENT])[0]
        if not raw:
            return None
        return {(str(t), int(p)): (int(a), int(b)) for t, p, a, b in json.loads(raw)}

    def stored_documents(self) -> int:
        """How many documents the index holds, read from the backend now.

        :meth:`~stream_dedup.index.store.DedupIndex.counter` is this process's view: as
        of its last commit, or for a shared index its last lease (at first, its opening).
        Other instances store documents meanwhile, so whether a shared index is empty,
        asked when partitions are assigned, is read here (an instance that opened the
        index empty and joined the group only after another one committed batches would
        otherwise call it lost)."""
        raw = self._backend.get_many([keys.counter_key("documents")])[0]
        return int.from_bytes(raw, "little") if raw else 0

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to consume per (topic, partition), as last committed."""
        return {
            keys.parse_offset_key(k): int.from_bytes(v, "little")
            for k, v in self._backend.scan_prefix(keys.OFFSET)
        }
