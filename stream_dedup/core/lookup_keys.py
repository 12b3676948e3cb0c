"""The keys a document is looked up under: its band keys and its exact-text key.

A band key names one LSH bucket: the band's number and a hash of the band's signature
values (:func:`~stream_dedup.core.bands.band_hashes`), packed as bytes::

    b <band: u16 BE> <band hash: u64 BE>        11 bytes
    x <16-byte BLAKE2b digest of the normalised text, UTF-8>

The bytes are the keys under which the index stores a bucket's members and the first
document with a text (:mod:`stream_dedup.index.keys` takes this layout over, so it is
persisted: changing it needs an index format version bump). They are computed here, with
the batch's sketch, because a batch's ~36,000 band keys are cheapest to build, sort and
fingerprint as arrays, off the process that decides.

A band key's *fingerprint* (:func:`fingerprints`) is a 64-bit mix of its band and band
hash: what the index's key filter (:mod:`stream_dedup.index.filter`) stores and asks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stream_dedup.core import jit
from stream_dedup.core.hashing import U64
from stream_dedup.core.jit import kernel

#: Prefix byte of a band key.
BUCKET = b"b"
#: Prefix byte of an exact-text key.
EXACT = b"x"

_BAND_DTYPE = np.dtype([("p", "S1"), ("band", ">u2"), ("h", ">u8")])


#: One bucket key as a numpy scalar: an unstructured void of a bucket key's width, which
#: ``tolist()`` turns into the whole key as ``bytes`` (trailing NULs kept).
PACKED_BUCKET_KEY = np.dtype(f"V{_BAND_DTYPE.itemsize}")


def packed_bucket_keys(band_hashes: U64) -> npt.NDArray[np.void]:
    """:func:`bucket_keys` as one array of :data:`PACKED_BUCKET_KEY` (``.tolist()`` gives them)."""
    n, bands = band_hashes.shape
    packed = np.empty(n * bands, dtype=_BAND_DTYPE)
    packed["p"] = BUCKET
    packed["band"] = np.tile(np.arange(bands, dtype=np.uint16), n)
    packed["h"] = band_hashes.reshape(-1)
    return packed.view(PACKED_BUCKET_KEY)


def bucket_keys(band_hashes: U64) -> list[bytes]:
    """Keys for an ``(n_docs, bands)`` array of band hashes, row-major."""
    keys: list[bytes] = packed_bucket_keys(band_hashes).tolist()
    return keys


def parse_bucket_keys(bucket_keys: Sequence[bytes]) -> npt.NDArray[np.void]:
    """Bucket keys back to a structured array with fields ``band`` and ``h``.

    Raises ``ValueError`` if any key is not a bucket key.
    """
    joined = b"".join(bucket_keys)
    if len(joined) != len(bucket_keys) * _BAND_DTYPE.itemsize:
        raise ValueError("not all of these keys are bucket keys (11 bytes each)")
    parsed = np.frombuffer(joined, dtype=_BAND_DTYPE)
    if not (parsed["p"] == BUCKET).all():
        raise ValueError("not all of these keys are bucket keys (prefix b)")
    return parsed


def bucket_order(band_hashes: U64) -> npt.NDArray[np.intp]:
    """Positions in :func:`bucket_keys` ``(band_hashes)`` of its keys in ascending order.

    A bucket key sorts by band, then by hash (both big-endian), so this is each band's
    hashes sorted, band after band. A batch writes ~36,000 bucket keys and RocksDB takes
    a write batch several times faster in key order; sorting here, in numpy, spares the
    service process most of sorting them as ``bytes``.
    """
    bands = band_hashes.shape[1]
    rows = np.argsort(band_hashes, axis=0, kind="stable")
    order: npt.NDArray[np.intp] = (rows * bands + np.arange(bands)).T.reshape(-1)
    return order


def bucket_shared(band_hashes: U64, order: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
    """The key positions of a batch that share their bucket with another position.

    ``order`` is :func:`bucket_order` ``(band_hashes)``. Returns an ``(m, 2)`` array of
    ``(position, first position with the same key)`` rows, for every key that occurs more
    than once in the batch (a near-duplicate pair within it): the only buckets whose
    contents the batch's own documents change for each other. All other buckets are read
    once from the index and written at most once, so deciding skips them unless the index
    held them already.
    """
    n = band_hashes.shape[0]
    if n < 2:
        return np.empty((0, 2), dtype=np.intp)
    ordered = band_hashes.reshape(-1)[order]
    starts = np.ones(ordered.size, dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    starts[::n] = True  # ``order`` runs band by band, ``n`` positions each
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    sizes = np.diff(np.append(first, ordered.size))
    shared = sizes[group] > 1
    # The sort is stable, so a group's first position in ``order`` is its smallest.
    rows: npt.NDArray[np.intp] = np.stack(
        [order[shared], order[first][group][shared]], axis=1
    ).astype(np.intp)
    return rows


def content_digest(utf8: bytes) -> bytes:
    """16-byte digest of normalised text (UTF-8) for the exact-duplicate fast path."""
    return hashlib.blake2b(utf8, digest_size=16).digest()


def exact_key(digest: bytes) -> bytes:
    return EXACT + digest


@kernel
def splitmix64(h: Any) -> Any:
    """splitmix64's finaliser: a bijection of 64-bit words that spreads every bit."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@kernel
def _fingerprints(bands: npt.NDArray[np.uint16], hashes: U64, out: U64) -> None:
    """Mix each key's band into its band hash (splitmix64's finaliser)."""
    for i in range(hashes.size):
        golden = (np.uint64(bands[i]) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        out[i] = splitmix64(hashes[i] ^ golden)


def fingerprints(bands: npt.NDArray[np.integer[Any]], hashes: U64) -> U64:
    """The fingerprint of each bucket key given as its band and its band hash."""
    out = np.empty(hashes.size, dtype=np.uint64)
    if hashes.size:
        mix = jit.choose(_fingerprints, items=hashes.size)
        mix(bands.astype(np.uint16), hashes.astype(np.uint64), out)
    return out


def band_bucket_keys(band: int, hashes: U64) -> tuple[list[bytes], U64]:
    """Bucket keys of one band for ``hashes`` (in that order), and their fingerprints: the
    keys of containment's sampled values (:mod:`stream_dedup.core.containment`)."""
    packed = np.empty(hashes.size, dtype=_BAND_DTYPE)
    packed["p"] = BUCKET
    packed["band"] = band
    packed["h"] = hashes
    keys: list[bytes] = packed.view(PACKED_BUCKET_KEY).tolist()
    bands = np.full(hashes.size, band, dtype=np.uint16)
    return keys, fingerprints(bands, hashes)
