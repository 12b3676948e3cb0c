"""Seeded 64-bit hashing primitives on numpy arrays.

Everything here is defined modulo 2**64 on ``uint64`` arrays: wrapping is the intended
arithmetic, not an accident (unlike datasketch's ``(a*x + b) % (2**61 - 1)`` evaluated in
uint64, which silently overflows before the modulus). Operations are done in place on
arrays, never on numpy scalars, so numpy never warns about the wrap.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]

_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
#: Odd multiplier of the polynomial rolling hash over shingle units (golden-ratio constant).
POLY = np.uint64(0x9E3779B97F4A7C15)
MASK32 = np.uint64(0xFFFFFFFF)


def fmix64(h: U64, scratch: U64 | None = None) -> U64:
    """MurmurHash3's 64-bit finaliser, in place: a bijection that spreads every input bit.

    Returns the same array for chaining. ``scratch``, an array of ``h``'s shape, holds the
    shifted values, so a caller hashing many blocks allocates no temporaries.
    """
    t = np.empty_like(h) if scratch is None else scratch
    h ^= np.right_shift(h, _S33, out=t)
    h *= _C1
    h ^= np.right_shift(h, _S33, out=t)
    h *= _C2
    h ^= np.right_shift(h, _S33, out=t)
    return h


@functools.cache
def mix_seed(seed: int, salt: int) -> np.uint64:
    """A well-spread 64-bit constant derived from ``seed`` and a per-use ``salt``.

    Cached: two ``fmix64`` calls on a one-value array cost ~20 us, paid by every sketch of
    a check (one document) otherwise; the seeds and salts in use are a handful."""
    arr = np.array([(seed * 0x100000001B3 + salt) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    return np.uint64(fmix64(fmix64(arr))[0])
