"""Band buckets' members on Redis in 4 bytes each (index format 5).

Everywhere else a bucket's value is its members' docnums as uint64 little-endian
(:mod:`.bucket_records`). On Redis a hash field's value is an SDS string of its own: a
one-member bucket's 8 bytes take a 16-byte allocation, and a news document writes ~15
buckets, most of them one member. Docnums below 2^32 (four billion documents) fit in 4
bytes, and a value of ``tag | 4 bytes`` takes an 8-byte allocation: ~120 bytes per
document of Redis memory (docs/benchmarks.md). An exact text's docnum (``x`` records,
one per distinct text) is kept in 4 bytes likewise: ~8 more.

So :class:`~stream_dedup.index.redis_backend.RedisBackend` writes a bucket as
``0x04 | uint32 LE per member`` when every member fits, and hands every reader the usual
uint64 bytes. The two are told apart by length alone: a compact value has odd length
(1 + 4n), a wide one a multiple of 8, so buckets written by format 4 (and a bucket with a
docnum of 2^32 or more, kept wide) read as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from stream_dedup.core.hashing import U32, U64
from stream_dedup.index.keys import BUCKET, EXACT, PACKED_BUCKET_KEY

__all__ = ["compact_buckets", "compact_members", "widen_buckets"]

#: First byte of a compact bucket value.
TAG = 4
_TAG_BYTE = bytes([TAG])
_BUCKET = BUCKET[0]
_KEY_SIZE = PACKED_BUCKET_KEY.itemsize
_EXACT = EXACT[0]
#: An exact text's key: ``x`` and a 16-byte digest.
_EXACT_KEY_SIZE = 17
_HIGH_ZEROS = bytes(4)
_LIMIT = 1 << 32


def compact_buckets(keys: Sequence[bytes], values: Sequence[bytes]) -> list[bytes]:
    """``values`` with every bucket's (``keys[i]`` a bucket key) members in 4 bytes where
    all of them fit, and every exact text's docnum in 4 bytes where it fits; other values
    as they are."""
    fast = _compact_ordered(keys, values)
    if fast is not None:
        return fast
    # One comprehension each, the tests inlined: a batch's ~4,000 verdicts and texts
    # pass through here inside the shared index's lease.
    exact, size, zeros = _EXACT, _EXACT_KEY_SIZE, _HIGH_ZEROS
    out = [
        v[:4] if len(v) == 8 and k[0] == exact and len(k) == size and v[4:] == zeros else v
        for k, v in zip(keys, values, strict=True)
    ]
    bucket, key_size = _BUCKET, _KEY_SIZE
    picked = [
        i
        for i, (k, v) in enumerate(zip(keys, values, strict=True))
        if k[0] == bucket and len(k) == key_size and v
    ]
    if not picked:
        return out
    raws = [values[i] for i in picked]
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    if (lengths & 7).any():  # already compact, or not a bucket value: one at a time
        for i in picked:
            out[i] = _compact_one(values[i])
        return out
    wide = np.frombuffer(b"".join(raws), dtype="<u8")
    if int(wide.max()) >= _LIMIT:
        for i in picked:
            out[i] = _compact_one(values[i])
        return out
    narrow = wide.astype("<u4").tobytes()
    ends = (np.cumsum(lengths) >> 1).tolist()
    starts = ((np.cumsum(lengths) - lengths) >> 1).tolist()
    for i, a, b in zip(picked, starts, ends, strict=True):
        out[i] = _TAG_BYTE + narrow[a:b]
    return out


def compact_members(counts: npt.NDArray[np.int64], members: U64) -> tuple[U32, bytes] | None:
    """The compact values of buckets given as arrays (each key's number of members, the
    members one key after another): every value's length and all of them joined, the
    bytes :func:`compact_buckets` gives each, built without a Python step per bucket.
    ``None`` when a member does not fit in 4 bytes (:func:`compact_buckets` then decides
    bucket by bucket)."""
    if members.size and int(members.max()) >= _LIMIT:
        return None
    sizes = 1 + 4 * counts
    ends = np.cumsum(sizes)
    total = int(ends[-1]) if ends.size else 0
    # Each value is its tag, then its members' 4 bytes: the tags at the values' starts,
    # the members' bytes, in order, everywhere else (a mask, not an index per byte).
    tag = np.zeros(total, dtype=bool)
    tag[ends - sizes] = True
    out = np.empty(total, dtype=np.uint8)
    out[tag] = TAG
    out[~tag] = members.astype("<u4").view(np.uint8)
    return sizes.astype("<u4"), out.tobytes()


def _compact_ordered(keys: Sequence[bytes], values: Sequence[bytes]) -> list[bytes] | None:
    """:func:`compact_buckets` without a Python step per one-member bucket, when every key
    is a band bucket's and every value fits (a batch's ~30,000 bucket writes); ``None``
    otherwise."""
    n = len(keys)
    if n < 64:
        return None
    joined = b"".join(keys)
    if len(joined) != _KEY_SIZE * n:
        return None
    if not (np.frombuffer(joined, dtype=np.uint8)[::_KEY_SIZE] == _BUCKET).all():
        return None
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    if (lengths & 7).any() or not lengths.all():
        return None
    wide = np.frombuffer(b"".join(values), dtype="<u8")
    if int(wide.max()) >= _LIMIT:
        return None
    narrow = wide.astype("<u4")
    counts = lengths >> 3
    starts = np.cumsum(counts) - counts
    out = np.empty(n, dtype=object)
    single = np.flatnonzero(counts == 1)
    rows = np.empty((single.size, 5), dtype=np.uint8)
    rows[:, 0] = TAG
    rows[:, 1:] = narrow[starts[single]].view(np.uint8).reshape(-1, 4)
    out[single] = rows.view("V5").ravel().tolist()
    raw = narrow.tobytes()
    for i in np.flatnonzero(counts > 1).tolist():
        a = 4 * int(starts[i])
        out[i] = _TAG_BYTE + raw[a : a + 4 * int(counts[i])]
    result: list[bytes] = out.tolist()
    return result


def _is_bucket(key: bytes) -> bool:
    return len(key) == _KEY_SIZE and key[0] == _BUCKET


def _is_exact(key: bytes) -> bool:
    return len(key) == _EXACT_KEY_SIZE and key[0] == _EXACT


def _compact_one(value: bytes) -> bytes:
    if len(value) & 7:
        return value
    wide = np.frombuffer(value, dtype="<u8")
    if int(wide.max()) >= _LIMIT:
        return value
    return _TAG_BYTE + wide.astype("<u4").tobytes()


def widen_buckets(keys: Sequence[bytes], values: list[bytes | None]) -> None:
    """Turn every compact bucket value in ``values`` (``keys[i]`` a bucket key, the value
    of odd length) and exact text's docnum (4 bytes) back into uint64 bytes, in place; the
    others stay as they are."""
    at: list[int] = []
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        if v is None:
            continue
        if len(v) & 1 and _is_bucket(k):
            at.append(i)
        elif len(v) == 4 and _is_exact(k):
            values[i] = v + _HIGH_ZEROS
    if not at:
        return
    raws: list[bytes] = [values[i][1:] for i in at]  # type: ignore[index]
    narrow = np.frombuffer(b"".join(raws), dtype="<u4")
    wide = narrow.astype("<u8").tobytes()
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws)) << 1
    ends = np.cumsum(lengths)
    for i, a, b in zip(at, (ends - lengths).tolist(), ends.tolist(), strict=True):
        values[i] = wide[a:b]
