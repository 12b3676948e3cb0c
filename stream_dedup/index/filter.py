"""Which lookup keys the index may hold: a Bloom filter over every such key written.

A batch of 2,000 documents looks up ~36,000 band-bucket keys, plus a verdict key (is
this id a replay?) and an exact-text key per document, and nearly all of them miss: a
bucket exists only where an earlier document had the same band. RocksDB answers a miss
from its own Bloom filters, but only after each key has crossed into the library and
probed the memtable and every SST file, about 1 us per key once the index holds a few
thousand documents: a fifth of the service's time per document. This filter answers the
same question for the whole batch in one compiled pass (~0.03 us per key), and only the
keys it cannot rule out are read from the index.

It holds 64-bit fingerprints, never keys, so it cannot say a key exists, only that one
does not: a false positive costs one read that finds nothing, and there are no false
negatives as long as every lookup key the index writes is added, which
:class:`~stream_dedup.index.store.DedupIndex` does in the same call that applies the write.
A bucket key's fingerprint comes from its band and band hash (:func:`bucket_fingerprints`,
computed with the sketch), a verdict or exact-text key's from Python's own hash of its
bytes (:func:`key_fingerprints`), which differs between processes: the filter is never
stored. The index builds it on first use from a scan of those keys (~0.7 s per million
keys, ~20 keys per document), sized from the number of documents it holds.

The structure is the *split block Bloom filter* of Apache Parquet and Impala: a key sets
one bit in each of the eight 32-bit words of one 256-bit block, so a lookup touches one
cache line. At 10 bits per key its false-positive rate is about 1%. When more keys arrive
than the filter was sized for, a new filter twice the size is stacked on top instead of
rebuilding: a lookup checks them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from stream_dedup.hashing import U64, fmix64
from stream_dedup.index import keys

#: Bits of filter per key it is sized for (about 1% false positives).
BITS_PER_KEY = 10
#: The smallest filter built (1.25 MB): an empty or small index grows into it.
MIN_CAPACITY = 1 << 20

_BLOCK_WORDS = 8
#: The eight odd multipliers of the Parquet specification, one per word of a block.
_SALT = np.array(
    [
        0x47B6137B,
        0x44974D91,
        0x8824AD5B,
        0xA2B7289D,
        0x705495C7,
        0x2DF1424B,
        0x9EFC4947,
        0x5C6BFB31,
    ],
    dtype=np.uint64,
)
_JIT: dict[str, Any] = {"nogil": True, "cache": True, "boundscheck": False}

Words = npt.NDArray[np.uint32]


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _fingerprints(bands: npt.NDArray[np.uint16], hashes: U64, out: U64) -> None:
    """Mix each key's band into its band hash (splitmix64's finaliser)."""
    for i in range(hashes.size):
        x = hashes[i] ^ ((np.uint64(bands[i]) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out[i] = x ^ (x >> np.uint64(31))


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _insert(words: Words, salt: U64, fps: U64) -> None:
    blocks = np.uint64(words.shape[0])
    low = np.uint64(0xFFFFFFFF)
    for i in range(fps.size):
        h = fps[i]
        block = ((h >> np.uint64(32)) * blocks) >> np.uint64(32)
        key = h & low
        for j in range(8):
            bit = ((key * salt[j]) & low) >> np.uint64(27)
            words[block, j] |= np.uint32(1) << np.uint32(bit)


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _query(words: Words, salt: U64, fps: U64, out: npt.NDArray[np.bool_]) -> None:
    """``out[i] |= `` whether every bit of key ``i`` is set in this filter."""
    blocks = np.uint64(words.shape[0])
    low = np.uint64(0xFFFFFFFF)
    for i in range(fps.size):
        if out[i]:
            continue
        h = fps[i]
        block = ((h >> np.uint64(32)) * blocks) >> np.uint64(32)
        key = h & low
        hit = True
        for j in range(8):
            bit = ((key * salt[j]) & low) >> np.uint64(27)
            if not (words[block, j] >> np.uint32(bit)) & np.uint32(1):
                hit = False
                break
        out[i] = hit


def fingerprints(bands: npt.NDArray[np.integer[Any]], hashes: U64) -> U64:
    """The fingerprint of each bucket key given as its band and its band hash."""
    out = np.empty(hashes.size, dtype=np.uint64)
    if hashes.size:
        _fingerprints(bands.astype(np.uint16), hashes.astype(np.uint64), out)
    return out


def bucket_fingerprints(bucket_keys: Sequence[bytes]) -> U64:
    """The 64-bit fingerprint of each bucket key (``b`` + band + band hash, 11 bytes)."""
    if not bucket_keys:
        return np.empty(0, dtype=np.uint64)
    parsed = keys.parse_bucket_keys(bucket_keys)
    return fingerprints(parsed["band"], parsed["h"])


def key_fingerprints(index_keys: Sequence[bytes]) -> U64:
    """Fingerprints of verdict and exact-text keys, for this process only (see above)."""
    hashed = np.fromiter(map(hash, index_keys), dtype=np.int64, count=len(index_keys))
    return fmix64(hashed.view(np.uint64))


class KeyFilter:
    """A stack of split block Bloom filters; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        self._layers: list[Words] = []
        self._room = 0  # keys the top layer is sized for but does not hold yet
        self._count = 0
        self._grow(max(capacity, MIN_CAPACITY))

    def _grow(self, capacity: int) -> None:
        blocks = -(-capacity * BITS_PER_KEY // (32 * _BLOCK_WORDS))
        self._layers.append(np.zeros((blocks, _BLOCK_WORDS), dtype=np.uint32))
        self._room = capacity

    @property
    def count(self) -> int:
        """Keys added (a key added twice counts twice)."""
        return self._count

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self._layers)

    @property
    def layers(self) -> int:
        return len(self._layers)

    def add(self, fps: U64) -> None:
        """Add fingerprints (from :func:`bucket_fingerprints` or :func:`key_fingerprints`)."""
        if fps.size > self._room:
            self._grow(2 * (self._count + fps.size))
        _insert(self._layers[-1], _SALT, fps)
        self._room -= fps.size
        self._count += fps.size

    def may_hold(self, fps: U64) -> npt.NDArray[np.bool_]:
        """``False`` where the key was certainly never added; ``True`` where it may have been."""
        out = np.zeros(fps.size, dtype=np.bool_)
        for layer in self._layers:
            _query(layer, _SALT, fps, out)
        return out
