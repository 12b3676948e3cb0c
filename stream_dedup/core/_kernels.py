"""Inner loops of the sketch path, compiled by numba, one pass per document over its units.

Why compiled: the numpy formulation of normalise -> shingle -> sign makes some twenty passes
over a batch's million grams (polynomial, finaliser, sort, compaction, bin minima), and the
whitespace collapse of ``normalize`` builds a Python object per word. Here each document's
code points are read once: whitespace is collapsed while they are copied, and each gram is
hashed, dropped into its one-permutation bin and cut to its verification half in the same
loop. The results are bit-for-bit those of the reference functions
(:func:`stream_dedup.core.normalize.normalize`, :func:`stream_dedup.core.shingles.shingle_sets`,
:func:`stream_dedup.core.signature.signatures`, :func:`stream_dedup.core.verify.verification_sets`),
which the tests check. Sorting stays with numpy, whose SIMD sort is several times faster
than numba's.

Kernels are compiled on first use (:func:`stream_dedup.core.jit.compiled`) and cached on disk
next to this module, so only the first process after an install pays the compilation (a
few seconds). A small batch sketches with the reference functions instead and never loads
numba (:mod:`stream_dedup.core.jit`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from stream_dedup.core.jit import kernel

#: ``WHITESPACE[c]`` for every code point up to the last one ``str.isspace`` accepts
#: (U+3000); everything above is not whitespace. The same set ``str.split()`` splits on.
WHITESPACE: npt.NDArray[np.bool_] = np.array([chr(c).isspace() for c in range(0x3001)])


@kernel
def collapse_whitespace(
    units: Any, starts: Any, lengths: Any, table: Any, pad: int
) -> tuple[Any, Any, Any, Any]:
    """Each document's code points with whitespace runs made one space, and stripped.

    ``units[starts[d] : starts[d] + lengths[d]]`` is document ``d``. Returns the packed
    code points followed by ``pad`` zeros, each document's new length, the same text as
    UTF-8 (lone surrogates as three bytes, like Python's ``surrogatepass``) and each
    document's UTF-8 length: the bytes the exact-duplicate digest is taken over.
    """
    out = np.zeros(units.size + pad, dtype=np.uint32)
    new_lengths = np.zeros(lengths.size, dtype=np.int64)
    utf8 = np.empty(4 * units.size, dtype=np.uint8)
    utf8_lengths = np.zeros(lengths.size, dtype=np.int64)
    limit = table.size
    pos = 0
    at = 0
    for d in range(starts.size):
        begin = pos
        begin8 = at
        pending = False  # a whitespace run seen since the last kept character
        for i in range(starts[d], starts[d] + lengths[d]):
            u = units[i]
            if u < limit and table[u]:
                pending = True
                continue
            if pending and pos > begin:
                out[pos] = 32
                pos += 1
                utf8[at] = 32
                at += 1
            pending = False
            out[pos] = u
            pos += 1
            if u < 0x80:
                utf8[at] = u
                at += 1
            elif u < 0x800:
                utf8[at] = 0xC0 | (u >> 6)
                utf8[at + 1] = 0x80 | (u & 0x3F)
                at += 2
            elif u < 0x10000:
                utf8[at] = 0xE0 | (u >> 12)
                utf8[at + 1] = 0x80 | ((u >> 6) & 0x3F)
                utf8[at + 2] = 0x80 | (u & 0x3F)
                at += 3
            else:
                utf8[at] = 0xF0 | (u >> 18)
                utf8[at + 1] = 0x80 | ((u >> 12) & 0x3F)
                utf8[at + 2] = 0x80 | ((u >> 6) & 0x3F)
                utf8[at + 3] = 0x80 | (u & 0x3F)
                at += 4
        new_lengths[d] = pos - begin
        utf8_lengths[d] = at - begin8
    out[pos:] = 0
    return out[: pos + pad], new_lengths, utf8[:at], utf8_lengths


@kernel
def sketch_grams(
    units: Any,
    starts: Any,
    lengths: Any,
    k: int,
    poly: np.uint64,
    bias: np.uint64,
    seed_mix: np.uint64,
    sig: Any,
    filled: Any,
    high: Any,
) -> Any:
    """Hash every char k-gram; fill one-permutation bins; keep each gram's high half.

    A document of ``n >= k`` units has ``n - k + 1`` grams hashing to
    ``fmix64(poly(u_i .. u_{i+k-1}) + bias)``; a shorter non-empty one is the single gram
    ``fmix64(poly(u + 1 ...) + seed_mix)`` (see :mod:`stream_dedup.core.shingles`). Gram ``h``
    falls in bin ``((h >> 32) * K) >> 32``; a bin keeps the low half of its smallest ``h``
    (``filled`` marks bins that got one). ``high`` receives ``h >> 32`` of each gram, document
    after document; the start of each document's run is returned.
    """
    num_perm = sig.shape[1]
    kk = np.uint64(num_perm)
    s32 = np.uint64(32)
    s33 = np.uint64(33)
    c1 = np.uint64(0xFF51AFD7ED558CCD)
    c2 = np.uint64(0xC4CEB9FE1A85EC53)
    none = np.uint64(0xFFFFFFFFFFFFFFFF)
    low = np.uint64(0xFFFFFFFF)
    # The polynomial rolls along a document (mod 2**64): the k - 1 units after u_i are
    # poly(window i) - u_i * P**(k-1), and the next window is that * P + u_{i+k}.
    lead = np.uint64(1)
    for _ in range(k - 1):
        lead *= poly
    mins = np.empty(num_perm, dtype=np.uint64)
    runs = np.zeros(starts.size + 1, dtype=np.int64)
    out = 0
    for d in range(starts.size):
        s = starts[d]
        n = lengths[d]
        mins[:] = none
        count = n - k + 1 if n >= k else 1
        p = np.uint64(0)
        if n >= k:
            for j in range(k - 1):
                p = p * poly + np.uint64(units[s + j])
        for i in range(count):
            if n >= k:
                p = p * poly + np.uint64(units[s + i + k - 1])
                h = p + bias
                p -= np.uint64(units[s + i]) * lead
            else:
                h = np.uint64(0)
                for j in range(n):
                    h = h * poly + np.uint64(units[s + j] + 1)
                h += seed_mix
            h ^= h >> s33
            h *= c1
            h ^= h >> s33
            h *= c2
            h ^= h >> s33
            at = ((h >> s32) * kk) >> s32
            mins[at] = min(mins[at], h)
            high[out + i] = np.uint32(h >> s32)
        for b in range(num_perm):
            if mins[b] != none:
                sig[d, b] = np.uint32(mins[b] & low)
                filled[d, b] = True
        out += count
        runs[d + 1] = out
    return runs


@kernel
def drop_repeats(values: Any, runs: Any) -> tuple[Any, Any]:
    """Within each sorted run ``values[runs[d] : runs[d + 1]]``, keep each value once.

    Every value is written and the write position advances only past a new one: no branch
    on the data, which the processor cannot predict in a run of random hashes, so a loop
    that branched on it would pay a misprediction on a large share of the values.
    """
    out = np.empty(values.size, dtype=values.dtype)
    sizes = np.zeros(runs.size - 1, dtype=np.int64)
    pos = 0
    for d in range(runs.size - 1):
        lo = runs[d]
        hi = runs[d + 1]
        begin = pos
        if hi > lo:
            prev = values[lo]
            out[pos] = prev
            pos += 1
            for i in range(lo + 1, hi):
                v = values[i]
                out[pos] = v
                pos += v != prev
                prev = v
        sizes[d] = pos - begin
    return out[:pos], sizes


@kernel
def intersection_at_least(a: Any, b: Any, need: int) -> int:
    """How many values two sorted arrays of distinct values share (one merge pass), or -1
    as soon as the count can no longer reach ``need``.

    After each step the values not yet passed can add at most the smaller of the two
    remainders; a candidate far below the threshold is given up after a few hundred steps
    instead of the whole merge.
    """
    i = 0
    j = 0
    shared = 0
    na = a.size
    nb = b.size
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        shared += x == y
        i += x <= y
        j += y <= x
        if shared + min(na - i, nb - j) < need:
            return -1
    return shared


@kernel
def band_hash_rows(sigs: Any, rows: int, start: np.uint64, poly: np.uint64, out: Any) -> None:
    """``out[d, b]``: band ``b``'s hash of document ``d``'s signature, as
    :func:`stream_dedup.core.bands.band_hashes` computes it with numpy (``start + b``,
    then per row ``h = fmix64(h * poly + value)``).

    Why a kernel: for the few documents of a check the numpy form is ~30 calls on arrays of
    a handful of values (0.2-0.3 ms of interpreter per document); here one loop.
    """
    s33 = np.uint64(33)
    c1 = np.uint64(0xFF51AFD7ED558CCD)
    c2 = np.uint64(0xC4CEB9FE1A85EC53)
    for d in range(out.shape[0]):
        for b in range(out.shape[1]):
            h = start + np.uint64(b)
            for j in range(rows):
                h = h * poly + np.uint64(sigs[d, b * rows + j])
                h ^= h >> s33
                h *= c1
                h ^= h >> s33
                h *= c2
                h ^= h >> s33
            out[d, b] = h
