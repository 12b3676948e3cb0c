"""A batch's band buckets while it is decided: what the index holds, plus the batch's appends.

A batch of 2,000 documents looks up ~36,000 bucket keys. Most of them name a bucket that
no earlier document is in and that no other document of the batch shares; deciding needs
nothing from those, and writing them needs nothing but the new member. So only the
*touched* positions, a bucket the index already holds or a key that occurs more than once
in the batch (:func:`stream_dedup.index.keys.bucket_shared`), are looked at document by
document. Every other key of an indexed document is written after the loop, in one
vectorised pass, as a bucket of that one member.

A touched position reads and appends through its *slot*: the first position in the batch
with the same key. Documents that share a bucket therefore see each other's appends in
batch order, exactly as if each had been decided and committed on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts

#: ``(slot, contents)`` of the touched buckets of one document; ``None`` = empty so far.
Held = list[tuple[int, bytes | None]]


def in_order(items: list[bytes], order: npt.NDArray[np.intp]) -> Sequence[bytes]:
    """``items`` at the positions ``order`` lists (``operator.itemgetter``: no Python loop)."""
    if order.size < 2:
        return [items[j] for j in order.tolist()]
    picked: tuple[bytes, ...] = itemgetter(*order.tolist())(items)
    return picked


class BatchBuckets:
    """The buckets of one batch's keys, ``bands`` per live document, row-major.

    ``committed`` holds what the index read for every key (``None``: no such bucket) and
    ``shared`` the ``(position, first position)`` rows of the keys that repeat.
    """

    def __init__(
        self, committed: list[bytes | None], shared: npt.NDArray[np.intp], bands: int
    ) -> None:
        self._bands = bands
        self._size = len(committed)
        self._hits = list(compress(range(self._size), committed))
        self._hit_values: list[bytes] = list(filter(None, committed))
        slot = np.arange(self._size, dtype=np.intp)
        slot[shared[:, 0]] = shared[:, 1]
        self._slot = slot
        self._touched = np.union1d(np.asarray(self._hits, dtype=np.intp), shared[:, 0])
        slots = slot[self._touched].tolist()
        self._contents: dict[int, bytes | None] = {s: committed[s] for s in slots}
        self._by_doc: dict[int, list[int]] = {}
        if slots:
            docs = self._touched // bands
            cuts = np.flatnonzero(np.diff(docs)) + 1
            starts, ends = np.append(0, cuts).tolist(), np.append(cuts, docs.size).tolist()
            for a, b in zip(starts, ends, strict=True):
                self._by_doc[int(docs[a])] = slots[a:b]

    def committed_values(self) -> list[bytes]:
        """The contents of every bucket the index held (for prefetching their records)."""
        return self._hit_values

    def of(self, pos: int) -> Held:
        """The touched buckets of live document ``pos``, with their contents as of now."""
        slots = self._by_doc.get(pos)
        if slots is None:
            return []
        contents = self._contents
        return [(s, contents[s]) for s in slots]

    def append(self, held: Held, docnum: int, limit: int) -> int:
        """Add ``docnum`` to the buckets ``held`` (from :meth:`of`); returns evictions.

        A bucket keeps its newest ``limit`` bytes (``max_bucket_size`` members), so one
        piece of boilerplate cannot make every lookup of it unbounded.
        """
        member = docnum.to_bytes(8, "little")
        contents = self._contents
        evicted = 0
        for slot, old in held:
            if old:
                if len(old) >= limit:
                    old = old[len(old) - limit + 8 :]
                    evicted += 1
                contents[slot] = old + member
            else:
                contents[slot] = member
        return evicted

    def puts(
        self, keys: list[bytes], order: npt.NDArray[np.intp], docnum_at: list[int]
    ) -> tuple[OrderedPuts, npt.NDArray[np.intp]]:
        """The bucket writes of the indexed documents (``docnum_at`` >= 0), in key order,
        and the positions in ``keys`` of the keys written.

        ``keys`` are the batch's bucket keys and ``order`` their ascending order
        (:func:`stream_dedup.index.keys.bucket_order`). Each bucket is written once.
        """
        per_key = np.repeat(np.asarray(docnum_at, dtype=np.int64), self._bands)
        chosen = order[per_key[order] >= 0]
        if chosen.size == 0:
            return NO_ORDERED_PUTS, chosen
        # Equal keys sit side by side in key order: keep the first of each run.
        slots = self._slot[chosen]
        first = np.ones(chosen.size, dtype=bool)
        first[1:] = slots[1:] != slots[:-1]
        chosen, slots = chosen[first], slots[first]
        values: list[bytes] = per_key[chosen].astype("<u8").view("V8").tolist()
        at = np.full(self._size, -1, dtype=np.intp)
        at[chosen] = np.arange(chosen.size)
        where = at[self._touched]
        written = where >= 0
        contents = self._contents
        patched = where[written]
        for k, s in zip(patched.tolist(), slots[patched].tolist(), strict=True):
            values[k] = contents[s]  # type: ignore[assignment]  # appended: bytes
        return OrderedPuts(in_order(keys, chosen), values), chosen
