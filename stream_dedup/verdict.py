"""Verification and the decision rule: from verified candidates to a verdict.

Exact verification compares *verification sets*: each document's distinct shingle hashes
cut to their high 32 bits (:func:`verification_sets`). Half the bytes of the 64-bit hashes
is half of what every indexed document writes to RocksDB, which is most of the index's
write cost. The price is hash collisions: two distinct shingles of a pair of documents
with n and m shingles share a 32-bit value with probability about n * m / 2**32 (2e-4 for
two 1,000-shingle articles), and each such collision moves their Jaccard by about
1 / |union|, so a verdict can only change for a pair within that distance of the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_dedup.hashing import U32
from stream_dedup.kernels import intersection_at_least, intersection_size
from stream_dedup.shingles import ShingleSets

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
    inter = int(intersection_size(a, b))
    return inter / (a.size + b.size - inter)


def jaccard_at_least(a: HashSet, b: HashSet, threshold: float) -> float | None:
    """:func:`exact_jaccard` of ``a`` and ``b`` if it is at least ``threshold``, else None.

    Verification only needs the similarity of a match: a candidate below the threshold is
    dropped whatever its value. Most candidates of a large index are such strangers (an
    unrelated article sharing a band), so the merge stops once the shared count can no
    longer reach the threshold. A similarity returned is computed exactly as
    :func:`exact_jaccard` computes it, so verdicts do not change.
    """
    total = a.size + b.size
    if a.size == 0 or b.size == 0:
        return 0.0 if threshold <= 0.0 else None
    need = _least_shared(total, threshold)
    if need > min(a.size, b.size):
        return None  # the sizes alone rule it out
    inter = int(intersection_at_least(a, b, need))
    if inter < 0:
        return None
    sim = inter / (total - inter)
    return sim if sim >= threshold else None


@lru_cache(maxsize=16384)  # one entry per (set sizes' sum, threshold) met
def _least_shared(total: int, threshold: float) -> int:
    """The least shared count m with ``m / (total - m) >= threshold``, as floats compare.

    The estimate from the algebra is corrected by the comparison itself, so the bound never
    gives up on a pair that :func:`exact_jaccard` would put at the threshold.
    """
    m = max(0, math.ceil(threshold * total / (1 + threshold)) - 1)
    while m > 0 and (m - 1) / (total - m + 1) >= threshold:
        m -= 1
    while m < total and m / (total - m) < threshold:
        m += 1
    return m


@dataclass(slots=True)  # not frozen: built per candidate (see DocRecord)
class Match:
    """A verified earlier document: who, how similar, and its place in arrival order."""

    docnum: int
    doc_id: str
    cluster_id: str
    similarity: float


def best_match(matches: list[Match], threshold: float) -> Match | None:
    """The most similar match at or above ``threshold``; ties go to the earliest document."""
    best: Match | None = None
    for m in matches:
        if m.similarity < threshold:
            continue
        if (
            best is None
            or m.similarity > best.similarity
            or (m.similarity == best.similarity and m.docnum < best.docnum)
        ):
            best = m
    return best
