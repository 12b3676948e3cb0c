"""Which lookup keys the index may hold: a Bloom filter over every such key written.

A batch of 2,000 documents looks up ~36,000 band-bucket keys, plus a verdict key (is
this id a replay?) and an exact-text key per document, and nearly all of them miss: a
bucket exists only where an earlier document had the same band. RocksDB answers a miss
from its own Bloom filters, but only after each key has crossed into the library and
probed the memtable and every SST file: for tens of thousands of keys per batch, a large
share of the service's time per document. This filter answers the same question for the
whole batch in one compiled pass (a Python one for a few keys: :mod:`stream_dedup.core.jit`),
with no call per key, and only the keys it cannot rule out are read from the index.

It holds 64-bit fingerprints, never keys, so it cannot say a key exists, only that one
does not: a false positive costs one read that finds nothing, and there are no false
negatives as long as every lookup key the index writes is added, which
:class:`~stream_dedup.index.store.DedupIndex` does in the same call that applies the write.
A bucket key's fingerprint comes from its band and band hash (:func:`bucket_fingerprints`,
computed with the sketch), a verdict or exact-text key's from a fixed hash of its bytes
(:func:`key_fingerprints`): the same in every process, so a filter can be kept on disk.
The index builds it on first use from a scan of those keys (~20 per document: a long
wait for a large index), sized from the number of documents it holds; when a writer
closes the index it saves the filter beside it (:meth:`KeyFilter.save`), stamped with
RocksDB's write sequence number, and the next opening loads it instead, far faster than
a scan, if nothing was written since.

The structure is the *split block Bloom filter* of Apache Parquet and Impala: a key sets
one bit in each of the eight 32-bit words of one 256-bit block, so a lookup touches one
cache line. At 10 bits per key its false-positive rate is about 1%. When more keys arrive
than the filter was sized for, a new filter twice the size is stacked on top instead of
rebuilding: a lookup checks them all.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stream_dedup.core import jit
from stream_dedup.core.hashing import U64
from stream_dedup.core.jit import kernel
from stream_dedup.core.lookup_keys import fingerprints, parse_bucket_keys, splitmix64

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
Words = npt.NDArray[np.uint32]


@kernel
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


@kernel
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


def bucket_fingerprints(bucket_keys: Sequence[bytes]) -> U64:
    """The 64-bit fingerprint of each bucket key (``b`` + band + band hash, 11 bytes)."""
    if not bucket_keys:
        return np.empty(0, dtype=np.uint64)
    parsed = parse_bucket_keys(bucket_keys)
    return fingerprints(parsed["band"], parsed["h"])


@kernel
def _hash_keys(data: npt.NDArray[np.uint8], ends: npt.NDArray[np.int64], out: U64) -> None:
    """A 64-bit hash of each key (``data[ends[i-1]:ends[i]]``): its length, then its bytes
    as little-endian 64-bit words (the last one zero-padded), each mixed into the state."""
    start = 0
    for i in range(ends.size):
        end = ends[i]
        h = splitmix64(np.uint64(end - start) ^ np.uint64(0x9E3779B97F4A7C15))
        j = start
        while j < end:
            word = np.uint64(0)
            for b in range(min(8, end - j)):
                word |= np.uint64(data[j + b]) << np.uint64(8 * b)
            h = splitmix64(h ^ word)
            j += 8
        out[i] = h
        start = end


def key_fingerprints(index_keys: Sequence[bytes]) -> U64:
    """Fingerprints of verdict and exact-text keys: a fixed function of their bytes, the
    same in every process (a stored filter depends on it; see :data:`FILE_MAGIC`)."""
    out = np.empty(len(index_keys), dtype=np.uint64)
    if index_keys:
        ends = np.cumsum(np.fromiter(map(len, index_keys), dtype=np.int64, count=len(out)))
        hash_keys = jit.choose(_hash_keys, items=len(out))
        hash_keys(np.frombuffer(b"".join(index_keys), dtype=np.uint8), ends, out)
    return out


#: First bytes of a stored filter. The number is the fingerprint scheme: a change to a
#: fingerprint function changes it, so a filter saved under another scheme is rebuilt.
FILE_MAGIC = b"SDKEYFILTER1\n"
#: After the magic: sequence stamp, keys added, room left, layers; then blocks per layer.
_HEADER = struct.Struct("<QQQQ")
_LAYER = struct.Struct("<Q")


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
        jit.choose(_insert, items=fps.size)(self._layers[-1], _SALT, fps)
        self._room -= fps.size
        self._count += fps.size

    def save(self, path: Path, stamp: int) -> None:
        """Write the filter to ``path`` (atomically: a new file renamed over), stamped.

        ``stamp`` says which state of the index the filter describes (RocksDB's write
        sequence number); :meth:`load` returns the filter only for the same stamp.
        """
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as out:
            out.write(FILE_MAGIC)
            out.write(_HEADER.pack(stamp, self._count, self._room, len(self._layers)))
            for layer in self._layers:
                out.write(_LAYER.pack(layer.shape[0]))
            for layer in self._layers:
                np.ascontiguousarray(layer, dtype="<u4").tofile(out)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, stamp: int) -> KeyFilter:
        """The filter saved at ``path`` for ``stamp``; raises ValueError (saying why) for a
        file of another stamp, another fingerprint scheme, or a damaged one."""
        with path.open("rb") as src:
            size = os.fstat(src.fileno()).st_size
            head = src.read(len(FILE_MAGIC) + _HEADER.size)
            if not head.startswith(FILE_MAGIC):
                raise ValueError("not a key filter of this release's fingerprint scheme")
            if len(head) < len(FILE_MAGIC) + _HEADER.size:
                raise ValueError("truncated header")
            saved, count, room, layers = _HEADER.unpack_from(head, len(FILE_MAGIC))
            if saved != stamp:
                raise ValueError(f"saved at write {saved}, the index is at write {stamp}")
            table = src.read(layers * _LAYER.size)
            if layers < 1 or len(table) < layers * _LAYER.size:
                raise ValueError("truncated layer table")
            blocks = [_LAYER.unpack_from(table, i * _LAYER.size)[0] for i in range(layers)]
            expected = len(head) + len(table) + 4 * _BLOCK_WORDS * sum(blocks)
            if size != expected:
                raise ValueError(f"{size} bytes where {expected} were expected")
            filt = cls.__new__(cls)
            filt._layers = [
                np.fromfile(src, dtype="<u4", count=n * _BLOCK_WORDS).reshape(n, _BLOCK_WORDS)
                for n in blocks
            ]
        filt._count, filt._room = count, room
        return filt

    def may_hold(self, fps: U64) -> npt.NDArray[np.bool_]:
        """``False`` where the key was certainly never added; ``True`` where it may have been."""
        out = np.zeros(fps.size, dtype=np.bool_)
        query = jit.choose(_query, items=fps.size)
        for layer in self._layers:
            query(layer, _SALT, fps, out)
        return out
