"""Shingling: a batch of normalised texts -> each text's set of 64-bit shingle hashes.

Why batches: hashing shingles one Python object at a time is the bottleneck of every peer
(datasketch's update loop, the list of strings rensa needs). Here a whole batch is turned
into one array of units (Unicode code points, or word hashes), every k-gram of the batch
is hashed with a handful of vectorised operations (in blocks that stay in the CPU cache),
each document's grams are sorted in place, and one compaction keeps the distinct ones. Per
document Python does a slice and a sort call.

A unit sequence ``u_0 .. u_{k-1}`` hashes to ``fmix64(poly(u) + seed_mix)`` where ``poly`` is
the polynomial ``((u_0 * P + u_1) * P + ...)`` modulo 2**64 and units are never 0 (a code
point counts as itself + 1), so a short text's single shingle cannot alias a full k-gram
by leading zeros. A non-empty text shorter than k is one shingle: the whole text. (The +1
of a full gram is the constant ``P**(k-1) + ... + P + 1``, added once with ``seed_mix``.)

The output, one sorted array of distinct uint64 hashes per document, is both what
:mod:`stream_dedup.core.signature` sketches and what exact verification compares. It comes as
:class:`ShingleSets`, the whole batch in one flat array, or as a list of per-document
arrays (:func:`shingle_batch`, views into that flat array).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import mmh3
import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import POLY, U64, fmix64, mix_seed

SHINGLER_VERSION = 1
#: Salt of the shingle hash's seed constant (:func:`~stream_dedup.core.hashing.mix_seed`).
SHINGLE_SALT = 0x5348
#: Gram positions hashed per block: a block's uint64 arrays (256 KiB) stay in the L2 cache
#: through the ~20 passes of the polynomial and ``fmix64``.
_BLOCK = 1 << 15
_EMPTY = np.zeros(0, dtype=np.uint64)
_EMPTY.flags.writeable = False

I64 = npt.NDArray[np.int64]
Units = npt.NDArray[np.uint32] | U64


@dataclass(frozen=True, slots=True)
class ShingleSpec:
    """Which shingles: character k-grams (default k=5) or word n-grams."""

    kind: Literal["char", "word"] = "char"
    k: int = 5

    def __post_init__(self) -> None:
        if self.kind not in ("char", "word"):
            raise ValueError(f"shingle kind must be 'char' or 'word', not {self.kind!r}")
        if not 1 <= self.k <= 64:
            raise ValueError(f"shingle size k must be between 1 and 64, not {self.k}")


@dataclass(frozen=True, slots=True)
class ShingleSets:
    """A batch's shingle sets in one array: set i is ``flat[starts[i] : starts[i] + sizes[i]]``.

    Sets lie back to back in ``flat``. One array for the whole batch is what lets
    :func:`~stream_dedup.core.signature.signatures` sketch every set at once without copying.
    """

    flat: U64
    starts: I64
    sizes: I64

    def __len__(self) -> int:
        return int(self.sizes.size)

    def __getitem__(self, i: int) -> U64:
        """Set ``i`` (a view into ``flat``)."""
        start = int(self.starts[i])
        return self.flat[start : start + int(self.sizes[i])]

    def as_list(self) -> list[U64]:
        """Every set, in document order (views into ``flat``)."""
        flat = self.flat
        return [
            flat[s : s + n] for s, n in zip(self.starts.tolist(), self.sizes.tolist(), strict=True)
        ]

    @classmethod
    def from_list(cls, sets: Sequence[U64]) -> ShingleSets:
        """Sets given one array each, concatenated into one (a copy)."""
        sizes = np.fromiter((s.size for s in sets), dtype=np.int64, count=len(sets))
        starts = np.zeros(len(sets), dtype=np.int64)
        if len(sets) > 1:
            np.cumsum(sizes[:-1], out=starts[1:])
        flat = np.concatenate(sets) if len(sets) else _EMPTY
        return cls(flat, starts, sizes)


def _units_char(texts: Sequence[str], k: int) -> tuple[Units, I64]:
    """Code points of the batch, then ``k - 1`` zeros so every position has a full window."""
    # surrogatepass: JSON input may carry lone surrogates ("\ud800"); they are code points too.
    joined = "".join([*texts, "\0" * (k - 1)]).encode("utf-32-le", "surrogatepass")
    units = np.frombuffer(joined, dtype="<u4")
    return units, np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))


def _units_word(texts: Sequence[str], seed: int, k: int) -> tuple[Units, I64]:
    """Word hashes (never 0) of the batch, then ``k - 1`` zeros."""
    words = [t.split(" ") if t else [] for t in texts]
    flat = [w for ws in words for w in ws]
    hashed = np.zeros(len(flat) + k - 1, dtype=np.uint64)
    # Hash UTF-8 bytes (what mmh3 hashes for a str anyway): mmh3 crashes the interpreter on a
    # str holding a lone surrogate, which JSON input can carry.
    hashed[: len(flat)] = np.fromiter(
        (
            mmh3.hash64(w.encode("utf-8", "surrogatepass"), seed & 0xFFFFFFFF, signed=False)[0] | 1
            for w in flat
        ),
        dtype=np.uint64,
        count=len(flat),
    )
    return hashed, np.fromiter((len(ws) for ws in words), dtype=np.int64, count=len(texts))


def _horner(values: Sequence[int], start: U64) -> U64:
    """``start`` extended by ``values`` with the polynomial hash, in place (tiny inputs)."""
    for v in values:
        start *= POLY
        start += np.uint64(v)
    return start


def _gram_hashes(units: Units, n: int, k: int, bias: np.uint64) -> U64:
    """``fmix64(poly(u_i .. u_{i+k-1}) + bias)`` at each of the first ``n`` positions.

    Grams may run past a document (their hashes are never used); ``units`` holds ``k - 1``
    trailing zeros so that the last windows exist.
    """
    out = np.empty(n, dtype=np.uint64)
    scratch = np.empty(min(n, _BLOCK), dtype=np.uint64)
    for lo in range(0, n, _BLOCK):
        hi = min(lo + _BLOCK, n)
        acc = out[lo:hi]
        acc[:] = units[lo:hi]
        for j in range(1, k):
            acc *= POLY
            acc += units[lo + j : hi + j]
        acc += bias
        fmix64(acc, scratch[: hi - lo])
    return out


@functools.cache
def char_gram_constants(k: int, seed: int) -> tuple[np.uint64, np.uint64]:
    """The shingle seed's mix and a full char gram's bias (offset 1) for ``k`` and ``seed``,
    as the compiled sketch kernel takes them. Computed once: numpy scalar arithmetic under
    an error state costs ~0.4-0.7 ms a call, which every sketch and every rebuild of
    candidates' sets would otherwise pay again."""
    seed_mix = mix_seed(seed, SHINGLE_SALT)
    return seed_mix, full_gram_bias(k, 1, seed_mix)


def full_gram_bias(k: int, offset: int, seed_mix: np.uint64) -> np.uint64:
    """What a full gram's hash adds to the polynomial of its raw units before ``fmix64``.

    Every unit of a full gram carries ``+offset`` (code points count as themselves + 1), which
    adds ``sum(offset * P**j, j < k)``; the seed constant comes on top.
    """
    bias = _horner([offset] * k, np.zeros(1, dtype=np.uint64))
    bias += seed_mix
    return np.uint64(bias[0])


def _short_hash(units: Units, offset: int, seed_mix: np.uint64) -> np.uint64:
    """Hash of a whole sequence shorter than k (the same polynomial, fewer terms)."""
    acc = _horner([u + offset for u in units.tolist()], np.zeros(1, dtype=np.uint64))
    acc += seed_mix
    return np.uint64(fmix64(acc)[0])


def shingle_sets(texts: Sequence[str], spec: ShingleSpec, seed: int) -> ShingleSets:
    """The sorted distinct shingle hashes of every (already normalised) text in ``texts``.

    Each document's grams are sorted where they lie in the batch's gram array (one
    ``np.sort`` call per document, no padded copy); then one pass marks the grams to keep (a
    document's own grams, each once) and one compaction gathers them, in document order.
    """
    seed_mix = mix_seed(seed, SHINGLE_SALT)
    k = spec.k
    if spec.kind == "char":
        units, lengths = _units_char(texts, k)
        offset = 1
    else:
        units, lengths = _units_word(texts, seed, k)
        offset = 0
    n_docs = len(texts)
    starts = np.zeros(n_docs, dtype=np.int64)
    if n_docs > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    counts = np.where(lengths >= k, lengths - k + 1, np.minimum(lengths, 1))
    sizes = np.zeros(n_docs, dtype=np.int64)
    n = int(units.size) - (k - 1)
    if n == 0:
        return ShingleSets(_EMPTY, sizes.copy(), sizes)
    grams = _gram_hashes(units, n, k, full_gram_bias(k, offset, seed_mix))
    for d in np.flatnonzero((lengths > 0) & (lengths < k)).tolist():
        s = int(starts[d])
        grams[s] = _short_hash(units[s : s + int(lengths[d])], offset, seed_mix)
    for s, c in zip(starts.tolist(), counts.tolist(), strict=True):
        grams[s : s + c].sort()
    # Keep a gram unless it repeats its sorted predecessor within the document, or it is
    # one of the (lengths - counts) windows at a document's end that run into the next.
    keep = np.empty(n, dtype=bool)
    keep[0] = True
    np.not_equal(grams[1:], grams[:-1], out=keep[1:])
    live = counts > 0
    keep[starts[live]] = True
    tails = lengths - counts
    n_tail = int(tails.sum())
    if n_tail:
        first_tail = starts + counts - (np.cumsum(tails) - tails)
        keep[np.repeat(first_tail, tails) + np.arange(n_tail)] = False
    sizes[live] = np.add.reduceat(keep, starts[live], dtype=np.int64)
    return ShingleSets(grams[keep], np.cumsum(sizes) - sizes, sizes)


def shingle_batch(texts: Sequence[str], spec: ShingleSpec, seed: int) -> list[U64]:
    """The sorted distinct shingle hashes of every (already normalised) text in ``texts``.

    One array per text, views into :func:`shingle_sets`' flat array.
    """
    return shingle_sets(texts, spec, seed).as_list()


def shingle_set(text: str, spec: ShingleSpec, seed: int) -> U64:
    """The sorted distinct shingle hashes of one normalised text (convenience wrapper)."""
    return shingle_batch([text], spec, seed)[0]
