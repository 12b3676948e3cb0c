"""Byte layout of the index's keys. One prefix byte per kind of record::

    M                                   -> IndexParams JSON (format version and parameters)
    C <name>                            -> counter, uint64 little-endian
    b <band: u16 BE> <band hash: u64 BE> -> bucket: docnums, uint64 little-endian, oldest first
    d <docnum: u64 BE>                  -> document record (see records.py)
    v <id, UTF-8>                       -> verdict record of a decided id (replay)
    x <16-byte digest of normalised text> -> docnum of the first document with that text
    o <topic, UTF-8> 0x00 <partition: u32 BE> -> next input offset to consume, uint64 LE
    i                                   -> batch intent: JSON [[topic, partition, start, end], ...]
                                           of the batch being emitted; empty once committed

Docnums are dense internal numbers in arrival order, so "earliest" is "smallest docnum"
and a bucket stays eight bytes per member.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from stream_dedup.hashing import U64

META = b"M"
COUNTER = b"C"
BUCKET = b"b"
DOC = b"d"
VERDICT = b"v"
EXACT = b"x"
OFFSET = b"o"
INTENT = b"i"

_BAND_DTYPE = np.dtype([("p", "S1"), ("band", ">u2"), ("h", ">u8")])


def counter_key(name: str) -> bytes:
    return COUNTER + name.encode()


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


def doc_key(docnum: int) -> bytes:
    return DOC + docnum.to_bytes(8, "big")


def verdict_key(doc_id: str) -> bytes:
    return VERDICT + doc_id.encode("utf-8", "surrogatepass")


def exact_key(digest: bytes) -> bytes:
    return EXACT + digest


def offset_key(topic: str, partition: int) -> bytes:
    return OFFSET + topic.encode() + b"\x00" + partition.to_bytes(4, "big")


def parse_offset_key(key: bytes) -> tuple[str, int]:
    body = key[len(OFFSET) :]
    return body[:-5].decode(), int.from_bytes(body[-4:], "big")
