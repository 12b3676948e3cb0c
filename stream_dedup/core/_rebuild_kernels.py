"""The inner loop of rebuilding verification sets from stored text, compiled by numba.

A candidate's set is rebuilt from its stored UTF-8 text (:mod:`stream_dedup.core.payload`)
when it is not in the set cache; on an index that keeps every document that happens
several times per document decided. The sketch's kernel
(:func:`~stream_dedup.core._kernels.sketch_grams`) gives the same grams but takes code
points (the text decoded to ``str``, then encoded to UTF-32) and fills the signature's
bins as it goes, which a rebuild throws away. This kernel reads the UTF-8 bytes and
hashes each gram only: the same ``h >> 32`` values, bit for bit (the tests compare them
with the sketch's sets), at about half the work. Sorting stays with numpy, whose SIMD
sort is several times faster than numba's (and than a radix sort written here: ~8 against
~5 µs for a news article's ~1,100 values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stream_dedup.core.jit import kernel


@kernel
def utf8_code_points(utf8: Any, lo: int, hi: int, out: Any) -> int:
    """Decode ``utf8[lo:hi]`` into ``out`` (code points); returns how many.

    The bytes are what the payload's writer encoded (``surrogatepass``: a lone surrogate
    is three bytes like any other code point below U+10000), so no validation is needed;
    a truncated last sequence reads no byte past ``hi``.
    """
    n = 0
    i = lo
    while i < hi:
        b = np.uint32(utf8[i])
        if b < 0x80:
            u = b
            i += 1
        elif b < 0xE0:
            u = (b & 0x1F) << 6
            if i + 1 < hi:
                u |= np.uint32(utf8[i + 1]) & 0x3F
            i += 2
        elif b < 0xF0:
            u = (b & 0x0F) << 12
            if i + 2 < hi:
                u |= ((np.uint32(utf8[i + 1]) & 0x3F) << 6) | (np.uint32(utf8[i + 2]) & 0x3F)
            i += 3
        else:
            u = (b & 0x07) << 18
            if i + 3 < hi:
                u |= (
                    ((np.uint32(utf8[i + 1]) & 0x3F) << 12)
                    | ((np.uint32(utf8[i + 2]) & 0x3F) << 6)
                    | (np.uint32(utf8[i + 3]) & 0x3F)
                )
            i += 4
        out[n] = u
        n += 1
    return n


@kernel
def text_gram_highs(
    utf8: Any, starts: Any, lengths: Any, k: int, poly: np.uint64, bias: np.uint64,
    seed_mix: np.uint64,
) -> tuple[Any, Any]:  # fmt: skip
    """The high halves of the char k-gram hashes of each UTF-8 text
    ``utf8[starts[d] : starts[d] + lengths[d]]``, text after text, and where each text's
    run starts (``runs[d]`` to ``runs[d + 1]``).

    The hash is :func:`~stream_dedup.core._kernels.sketch_grams`'s: a text of ``n >= k``
    code points has ``n - k + 1`` grams hashing to ``fmix64(poly(u_i .. u_{i+k-1}) +
    bias)``, a shorter non-empty one the single gram ``fmix64(poly(u + 1 ...) +
    seed_mix)``, an empty one the single gram of no units.
    """
    s33 = np.uint64(33)
    s32 = np.uint64(32)
    c1 = np.uint64(0xFF51AFD7ED558CCD)
    c2 = np.uint64(0xC4CEB9FE1A85EC53)
    lead = np.uint64(1)
    for _ in range(k - 1):
        lead *= poly
    # Code points never outnumber bytes: the bytes bound every text's units and grams.
    high = np.empty(lengths.sum() + lengths.size, dtype=np.uint32)
    units = np.empty(max(1, lengths.max()) if lengths.size else 1, dtype=np.uint32)
    runs = np.zeros(starts.size + 1, dtype=np.int64)
    out = 0
    for d in range(starts.size):
        n = utf8_code_points(utf8, starts[d], starts[d] + lengths[d], units)
        count = n - k + 1 if n >= k else 1
        p = np.uint64(0)
        if n >= k:
            for j in range(k - 1):
                p = p * poly + np.uint64(units[j])
        for i in range(count):
            if n >= k:
                p = p * poly + np.uint64(units[i + k - 1])
                h = p + bias
                p -= np.uint64(units[i]) * lead
            else:
                h = np.uint64(0)
                for j in range(n):
                    h = h * poly + np.uint64(units[j] + 1)
                h += seed_mix
            h ^= h >> s33
            h *= c1
            h ^= h >> s33
            h *= c2
            h ^= h >> s33
            high[out + i] = np.uint32(h >> s32)
        out += count
        runs[d + 1] = out
    return high[:out], runs
