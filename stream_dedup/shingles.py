"""Shingling: a batch of normalised texts -> each text's set of 64-bit shingle hashes.

Why batches: hashing shingles one Python object at a time is the bottleneck of every peer
(datasketch's update loop, the list of strings rensa needs). Here a whole batch is turned
into one array of units (Unicode code points, or word hashes), every k-gram of the batch
is hashed with a handful of vectorised operations, and the grams of each document are
sorted in one 2-D ``np.sort``. Per document Python does a couple of slicing calls.

A unit sequence ``u_0 .. u_{k-1}`` hashes to ``fmix64(poly(u) + seed_mix)`` where ``poly`` is
the polynomial ``((u_0 * P + u_1) * P + ...)`` modulo 2**64 and units are never 0 (code
points are stored +1), so a short text's single shingle cannot alias a full k-gram by
leading zeros. A non-empty text shorter than k is one shingle: the whole text.

The output, one sorted array of distinct uint64 hashes per document, is both what
:mod:`stream_dedup.signature` sketches and what exact verification compares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import mmh3
import numpy as np
import numpy.typing as npt

from stream_dedup.hashing import POLY, U64, fmix64, mix_seed

SHINGLER_VERSION = 1
_PAD = np.uint64(0xFFFFFFFFFFFFFFFF)
_SALT_SHINGLE = 0x5348
_CHUNK = 256
_EMPTY = np.zeros(0, dtype=np.uint64)
_EMPTY.flags.writeable = False


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


def _units_char(texts: Sequence[str]) -> tuple[U64, npt.NDArray[np.int64]]:
    # surrogatepass: JSON input may carry lone surrogates ("\ud800"); they are code points too.
    joined = "".join(texts).encode("utf-32-le", "surrogatepass")
    units = np.frombuffer(joined, dtype="<u4").astype(np.uint64)
    units += np.uint64(1)
    return units, np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))


def _units_word(texts: Sequence[str], seed: int) -> tuple[U64, npt.NDArray[np.int64]]:
    words = [t.split(" ") if t else [] for t in texts]
    flat = [w for ws in words for w in ws]
    # Hash UTF-8 bytes (what mmh3 hashes for a str anyway): mmh3 crashes the interpreter on a
    # str holding a lone surrogate, which JSON input can carry.
    hashed = np.fromiter(
        (
            mmh3.hash64(w.encode("utf-8", "surrogatepass"), seed & 0xFFFFFFFF, signed=False)[0] | 1
            for w in flat
        ),
        dtype=np.uint64,
        count=len(flat),
    )
    return hashed, np.fromiter((len(ws) for ws in words), dtype=np.int64, count=len(texts))


def _gram_hashes(units: U64, k: int, seed_mix: np.uint64) -> U64:
    """Hash of the k-gram starting at every unit position (grams may run past a document)."""
    n = units.size
    padded = np.zeros(n + k - 1, dtype=np.uint64)
    padded[:n] = units
    acc = padded[0:n].copy()
    for j in range(1, k):
        acc *= POLY
        acc += padded[j : j + n]
    acc += seed_mix
    return fmix64(acc)


def _short_hash(units: U64, seed_mix: np.uint64) -> np.uint64:
    """Hash of a whole sequence shorter than k (the same polynomial, fewer terms)."""
    acc = units[0:1].copy()
    for j in range(1, units.size):
        acc *= POLY
        acc += units[j : j + 1]
    acc += seed_mix
    return np.uint64(fmix64(acc)[0])


def shingle_batch(texts: Sequence[str], spec: ShingleSpec, seed: int) -> list[U64]:
    """The sorted distinct shingle hashes of every (already normalised) text in ``texts``.

    Documents are sorted into chunks of similar length, so the 2-D sort wastes little on
    padding even when a 200-character brief shares a batch with a 20 KB feature.
    """
    seed_mix = mix_seed(seed, _SALT_SHINGLE)
    if spec.kind == "char":
        units, lengths = _units_char(texts)
    else:
        units, lengths = _units_word(texts, seed)
    k = spec.k
    n_docs = len(texts)
    starts = np.zeros(n_docs, dtype=np.int64)
    if n_docs > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    counts = np.where(lengths >= k, lengths - k + 1, np.minimum(lengths, 1))
    sets: list[U64] = [_EMPTY] * n_docs
    if n_docs == 0 or int(counts.max()) == 0:
        return sets
    grams = _gram_hashes(units, k, seed_mix)
    for d in np.flatnonzero((lengths > 0) & (lengths < k)):
        s = int(starts[d])
        grams[s] = _short_hash(units[s : s + int(lengths[d])], seed_mix)
    order = np.argsort(counts, kind="stable")
    last = units.size - 1
    for lo in range(0, n_docs, _CHUNK):
        chunk = order[lo : lo + _CHUNK]
        c_counts = counts[chunk]
        width = int(c_counts.max())
        if width == 0:
            continue
        cols = np.arange(width, dtype=np.int64)
        idx = starts[chunk][:, None] + cols[None, :]
        np.minimum(idx, last, out=idx)
        table = grams[idx]
        table[cols[None, :] >= c_counts[:, None]] = _PAD
        table.sort(axis=1)
        keep = np.ones(table.shape, dtype=bool)
        np.not_equal(table[:, 1:], table[:, :-1], out=keep[:, 1:])
        for row, d in enumerate(chunk.tolist()):
            c = int(c_counts[row])
            sets[d] = table[row, :c][keep[row, :c]]
    return sets


def shingle_set(text: str, spec: ShingleSpec, seed: int) -> U64:
    """The sorted distinct shingle hashes of one normalised text (convenience wrapper)."""
    return shingle_batch([text], spec, seed)[0]
