"""Verification sets and exact Jaccard: what a duplicate verdict rests on.

The matching pass that verifies candidates and picks the match is compiled, in
:mod:`stream_dedup.core.match`. Exact verification compares *verification sets*: each
document's distinct shingle hashes cut to their high 32 bits (:func:`verification_sets`).
Half the bytes of the 64-bit hashes is half of what every indexed document writes to
RocksDB, which is most of the index's write cost. The price is hash collisions: two
distinct shingles of a pair of documents with n and m shingles share a 32-bit value with
probability about n * m / 2**32 (2e-4 for two 1,000-shingle articles), and each such
collision moves their Jaccard by about 1 / |union|, so a verdict can only change for a pair
within that distance of the threshold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U32
from stream_dedup.core.shingles import ShingleSets

#: Sorted distinct hashes of any unsigned width.
HashSet = npt.NDArray[np.unsignedinteger[Any]]


def verification_sets(sets: ShingleSets) -> list[U32]:
    """Every set's verification form: the distinct high 32 bits of its hashes, sorted.

    A document's 64-bit hashes are sorted, so their high halves are already in order and
    equal ones are neighbours: one vectorised pass over the batch drops the repeats.
    """
    high = (sets.flat >> np.uint64(32)).astype("<u4")  # persisted: little-endian
    n = high.size
    if n == 0:
        return [high[0:0] for _ in range(len(sets))]
    keep = np.empty(n, dtype=bool)
    keep[0] = True
    np.not_equal(high[1:], high[:-1], out=keep[1:])
    live = sets.sizes > 0
    keep[sets.starts[live]] = True
    sizes = np.zeros(len(sets), dtype=np.int64)
    sizes[live] = np.add.reduceat(keep, sets.starts[live], dtype=np.int64)
    flat = high[keep]
    starts = np.cumsum(sizes) - sizes
    return [flat[s : s + c] for s, c in zip(starts.tolist(), sizes.tolist(), strict=True)]


def exact_jaccard(a: HashSet, b: HashSet) -> float:
    """Jaccard similarity of two sorted arrays of distinct hashes (of the same width)."""
    if a.size == 0 or b.size == 0:
        return 0.0
    inter = int(np.intersect1d(a, b, assume_unique=True).size)
    return inter / (a.size + b.size - inter)


def overlap(query: HashSet, other: HashSet) -> tuple[float, float, float]:
    """Exact Jaccard similarity of two verification sets, and each one's containment in
    the other: ``(|Q & D| / |Q | D|, |Q & D| / |Q|, |Q & D| / |D|)``, 0.0 for an empty set.

    The similarity is the same float :func:`exact_jaccard` (and the matching pass) gives.
    Containment tells the copies Jaccard cannot: an excerpt of a longer document holds few
    of its shingles (a low similarity) while nearly all of its own are in it.
    """
    if query.size == 0 or other.size == 0:
        return 0.0, 0.0, 0.0
    inter = int(np.intersect1d(query, other, assume_unique=True).size)
    return inter / (query.size + other.size - inter), inter / query.size, inter / other.size
