"""Signatures: one-permutation MinHash with optimal densification (Shrivastava, ICML 2017).

Why this scheme: classic k-permutation MinHash applies K hash functions to every shingle
(K x n work); one-permutation hashing (OPH) hashes each shingle once, splits the hash
range into K bins and keeps the minimum per bin (n work), which is what makes a whole
batch cheap to sketch with numpy. For sets of a few hundred shingles and more (any news
article) its Jaccard estimate is at least as accurate as classic MinHash, because the K
bins sample without replacement. Bins left empty (short texts) are filled by *optimal
densification*: empty bin i probes bins ``probe(i, 1), probe(i, 2), ...`` drawn by a
seeded hash that depends only on (i, attempt) and copies the first non-empty bin's value.
Two sets that share a bin's contents therefore densify identically, which keeps
``P[sig_a[i] == sig_b[i]] = J(a, b)`` (Shrivastava 2017, Theorem 1). ``bench/bench_offline.py``
measures the speed against datasketch and rensa; ``tests/core/test_signature.py`` checks the
error.

Byte layout (persisted, pinned by a golden test): ``num_perm`` little-endian uint32.
Shingle hash ``h`` (uint64, from :mod:`stream_dedup.core.shingles`) falls in bin
``((h >> 32) * K) >> 32`` (monotone in h, so a document's sorted hashes visit bins in
order); the bin's value is the low 32 bits of its smallest h.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import MASK32, U32, U64, fmix64, mix_seed
from stream_dedup.core.shingles import ShingleSets

SIGNATURE_SCHEME = "oph-optimal-densification-v1"
SIG_DTYPE = np.dtype("<u4")
_SALT_PROBE = 0x4F5048
_PROBE_ROUNDS = 512


@lru_cache(maxsize=8)
def _probe_table(num_perm: int, seed: int) -> npt.NDArray[np.int64]:
    """``table[i, t]``: the bin that empty bin i copies from on attempt t (seeded, fixed)."""
    i = np.arange(num_perm, dtype=np.uint64)[:, None]
    t = np.arange(1, _PROBE_ROUNDS + 1, dtype=np.uint64)[None, :]
    h = (i << np.uint64(32)) | t
    h += mix_seed(seed, _SALT_PROBE)
    fmix64(h)
    return ((h >> np.uint64(32)) * np.uint64(num_perm) >> np.uint64(32)).astype(np.int64)


def signatures(sets: Sequence[U64] | ShingleSets, num_perm: int, seed: int) -> U32:
    """The ``(len(sets), num_perm)`` uint32 signatures of non-empty sorted hash sets.

    ``sets`` is one array per document, or a :class:`~stream_dedup.core.shingles.ShingleSets`
    batch, which is sketched in place (the list is first concatenated into one).
    """
    if not isinstance(sets, ShingleSets):
        sets = ShingleSets.from_list(sets)
    n_docs = len(sets)
    sig = np.zeros((n_docs, num_perm), dtype=SIG_DTYPE)
    if n_docs == 0:
        return sig
    if int(sets.sizes.min()) == 0:
        raise ValueError("cannot sketch an empty shingle set (empty documents have no signature)")
    flat = sets.flat
    bins = flat >> np.uint64(32)
    bins *= np.uint64(num_perm)
    bins >>= np.uint64(32)
    first = np.empty(flat.size, dtype=bool)
    first[0] = True
    np.not_equal(bins[1:], bins[:-1], out=first[1:])
    first[sets.starts] = True
    at = np.flatnonzero(first)
    # Sets lie back to back in ``flat``: a position belongs to the last set starting at or
    # before it.
    by_start = np.argsort(sets.starts)
    rows = by_start[np.searchsorted(sets.starts[by_start], at, side="right") - 1]
    cols = bins[at].astype(np.int64)
    sig[rows, cols] = (flat[at] & MASK32).astype(SIG_DTYPE)
    filled = np.zeros((n_docs, num_perm), dtype=bool)
    filled[rows, cols] = True
    if not filled.all():
        densify(sig, filled, num_perm, seed)
    return sig


def densify(sig: U32, filled: npt.NDArray[np.bool_], num_perm: int, seed: int) -> None:
    """Fill empty bins in place by optimal densification (see module docstring).

    Attempts run over all pending (doc, bin) pairs of the batch at once. If a bin finds
    nothing in ``_PROBE_ROUNDS`` attempts (a set of one or two shingles), it falls back to
    the next non-empty bin in circular order, which is equally deterministic.
    """
    table = _probe_table(num_perm, seed)
    pend_d, pend_i = np.nonzero(~filled)
    for t in range(_PROBE_ROUNDS):
        if pend_d.size == 0:
            return
        src = table[pend_i, t]
        hit = filled[pend_d, src]
        sig[pend_d[hit], pend_i[hit]] = sig[pend_d[hit], src[hit]]
        pend_d, pend_i = pend_d[~hit], pend_i[~hit]
    for d, i in zip(pend_d.tolist(), pend_i.tolist(), strict=True):
        j = next((i + s) % num_perm for s in range(1, num_perm) if filled[d, (i + s) % num_perm])
        sig[d, i] = sig[d, j]


def estimate_jaccard(a: U32, b: U32) -> float:
    """The signature estimate of Jaccard similarity: the fraction of equal positions."""
    return float(np.count_nonzero(a == b)) / a.size
