"""Verification and the decision rule: from verified candidates to a verdict."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_dedup.hashing import U64


def exact_jaccard(a: U64, b: U64) -> float:
    """Jaccard similarity of two sorted arrays of distinct uint64 shingle hashes.

    A shared hash appears twice in the merged arrays, so the intersection is the number of
    equal neighbours after a stable sort, which for two sorted runs is a single linear merge
    (several times faster than a binary search per element).
    """
    if a.size == 0 or b.size == 0:
        return 0.0
    merged = np.concatenate((a, b))
    merged.sort(kind="stable")
    inter = int(np.count_nonzero(merged[1:] == merged[:-1]))
    return inter / (a.size + b.size - inter)


@dataclass(frozen=True, slots=True)
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
