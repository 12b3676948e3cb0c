"""The reference shingle sets, independent of the package's hashing.

Ground truth for the quality and excerpt tests is computed from character k-grams as
Python strings and one sparse product of the document-by-shingle matrix with itself: no
hash, no sketch, nothing the package computes except `normalize`. Both truths share this
module so that they cannot drift apart in what a shingle is.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

SHINGLE_K = 5


def string_shingles(text: str) -> frozenset[str]:
    """Character k-grams of normalised text as strings (the reference definition)."""
    if not text:
        return frozenset()
    if len(text) < SHINGLE_K:
        return frozenset((text,))
    return frozenset(text[i : i + SHINGLE_K] for i in range(len(text) - SHINGLE_K + 1))


def shingle_matrix(
    shingles: list[frozenset[str]],
) -> tuple[npt.NDArray[np.int64], sp.csr_matrix]:
    """Set sizes and the 0/1 document-by-shingle matrix: ``x @ x.T`` holds every intersection."""
    columns: dict[str, int] = {}
    indices = [columns.setdefault(g, len(columns)) for s in shingles for g in s]
    sizes = np.fromiter((len(s) for s in shingles), dtype=np.int64, count=len(shingles))
    indptr = np.concatenate(([0], np.cumsum(sizes)))
    x = sp.csr_matrix(
        (np.ones(len(indices), dtype=np.int32), np.asarray(indices, dtype=np.int64), indptr),
        shape=(len(shingles), max(len(columns), 1)),
    )
    return sizes, x
