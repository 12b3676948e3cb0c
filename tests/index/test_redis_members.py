"""Band buckets on Redis hold 4-byte members (index format 5), read back as 8-byte ones,
beside buckets that format 4 wrote with 8-byte members, on a real redis-server."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import redis

from stream_dedup.index.backend import BucketArrays, OrderedPuts
from stream_dedup.index.keys import bucket_keys
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_layout import decode_redo, encode_redo
from stream_dedup.index.redis_members import TAG, compact_buckets, compact_members, widen_buckets
from stream_dedup.index.redis_prepare import prepare_write

from ..conftest import fresh_namespace


def _members(*docnums: int) -> bytes:
    return np.array(docnums, dtype="<u8").tobytes()


def _keys(n: int, first: int = 1) -> list[bytes]:
    hashes = np.arange(first, first + n, dtype=np.uint64).reshape(-1, 1)
    hashes *= np.uint64(0x9E3779B97F4A7C15)
    return sorted(bucket_keys(hashes))


def test_compact_and_widen_round_trip_and_leave_others_alone() -> None:
    keys = [*_keys(4), b"vsome-id", b"d" + bytes(8), b"x" + bytes(16), b"x" + bytes(16)]
    wide = [
        *[_members(7), _members(1, 2, 3), _members(2**32 - 1), _members(5, 2**32)],
        *[b"x", b"abc", _members(9), _members(2**33)],
    ]
    compact = compact_buckets(keys, wide)
    assert compact[0] == bytes([TAG]) + (7).to_bytes(4, "little")
    # 2^32 and more do not fit: kept wide
    assert [len(v) for v in compact] == [5, 13, 5, 16, 1, 3, 4, 8]
    assert compact[3:6] == wide[3:6]
    assert compact[6] == (9).to_bytes(4, "little") and compact[7] == wide[7]
    back: list[bytes | None] = [*compact, None]
    widen_buckets([*keys, _keys(1)[0]], back)
    assert back == [*wide, None]


def test_compact_of_many_one_member_buckets_in_one_pass() -> None:
    keys = _keys(500)
    docnums = np.random.default_rng(3).integers(0, 2**32, 500)
    wide = [_members(int(d)) if i % 7 else _members(1, int(d)) for i, d in enumerate(docnums)]
    compact = compact_buckets(keys, wide)
    assert all(
        v[0] == TAG and len(v) == 1 + len(w) // 2 for v, w in zip(compact, wide, strict=True)
    )
    assert compact[3] == bytes([TAG]) + int(docnums[3]).to_bytes(4, "little")
    values: list[bytes | None] = list(compact)
    widen_buckets(keys, values)
    assert values == wide


def test_redis_stores_4_byte_members_and_reads_8_byte_ones(redis_url: str) -> None:
    namespace = fresh_namespace()
    backend = RedisBackend(redis_url, namespace=namespace)
    try:
        keys = _keys(300)
        values = [_members(i, i + 1) if i % 3 else _members(i) for i in range(300)]
        backend.apply(backend.prepare({}, OrderedPuts(keys, values), epoch=0))
        backend.wait_applied()  # the raw reads below do not wait for the applier thread
        # A bucket as format 4 wrote it: 8-byte members, through a plain write.
        old_key, absent = _keys(2, first=1000)
        client = redis.Redis.from_url(redis_url)
        name = backend._keys.hash(0, old_key[-1])
        client.hset(name, old_key, _members(11, 12, 13))
        raw = client.hget(backend._keys.hash(0, keys[0][-1]), keys[0])
        assert raw is not None and len(raw) == 5 and raw[0] == TAG
        assert backend.get_many([*keys, old_key, absent]) == [
            *values,
            _members(11, 12, 13),
            None,
        ]
        # Members past 2^32 stay 8 bytes.
        backend.apply(backend.prepare({}, OrderedPuts([keys[1]], [_members(2**40)]), epoch=0))
        backend.wait_applied()
        raw = client.hget(backend._keys.hash(0, keys[1][-1]), keys[1])
        assert raw == _members(2**40)
        assert backend.get_many([keys[1]]) == [_members(2**40)]
        client.close()
    finally:
        backend.close()


def test_members_as_arrays_compact_to_the_bytes_of_each_bucket() -> None:
    """:func:`compact_members` (a batch's buckets from arrays) gives every bucket the bytes
    :func:`compact_buckets` gives it, and declines a member of 2^32 or more."""
    rng = np.random.default_rng(5)
    counts = rng.integers(1, 6, 500).astype(np.int64)
    flat = rng.integers(0, 2**32, int(counts.sum())).astype("<u8")
    ends = np.cumsum(counts)
    keys = _keys(counts.size)
    wide = [flat[e - c : e].tobytes() for e, c in zip(ends.tolist(), counts.tolist(), strict=True)]
    packed = compact_members(counts, flat)
    assert packed is not None
    sizes, joined = packed
    expected = compact_buckets(keys, wide)
    assert sizes.tolist() == [len(v) for v in expected]
    assert joined == b"".join(expected)
    flat[7] = 2**32
    assert compact_members(counts, flat) is None


def test_a_write_from_member_arrays_reads_back_as_one_from_values(redis_url: str) -> None:
    """The redo record built from the members as arrays is the one built from the values,
    byte for byte, and a write from it reads back as written (on a real redis-server)."""
    counts = np.array([1, 3, 1, 2], dtype=np.int64)
    flat = np.array([7, 1, 2, 3, 9, 4, 5], dtype="<u8")
    keys = _keys(4, first=900)
    wide = [_members(7), _members(1, 2, 3), _members(9), _members(4, 5)]
    puts = {b"v" + b"id-1": b"{}", b"x" + bytes(16): _members(3)}
    packed = prepare_write(
        puts, OrderedPuts(keys, wide, BucketArrays(b"".join(keys), counts, flat)), 2, None
    )
    plain = prepare_write(puts, OrderedPuts(keys, wide), 2, None)
    assert packed.rest is None and plain.rest is not None
    assert packed.redo == plain.redo
    backend = RedisBackend(redis_url, namespace=fresh_namespace())
    try:
        backend.apply(
            backend.prepare(
                puts, OrderedPuts(keys, wide, BucketArrays(b"".join(keys), counts, flat)), 2
            )
        )
        assert backend.get_many(keys, 2) == wide
        assert backend.get_many(list(puts), 2) == list(puts.values())
    finally:
        backend.close()


def test_a_redo_record_decodes_to_its_keys_and_values() -> None:
    """Band bucket keys decode by one array view when every key after ``first`` is one,
    key by key otherwise (a tail of mixed keys); empty parts too."""
    rng = np.random.default_rng(3)
    for n_buckets, n_mixed in [(0, 5), (5, 0), (300, 40), (0, 0)]:
        buckets = _keys(n_buckets, first=1 + int(rng.integers(0, 1000)))
        values = [bytes([TAG]) + bytes(4 * int(rng.integers(1, 4))) for _ in buckets]
        mixed = [b"v" + str(i).encode() * int(rng.integers(1, 4)) for i in range(n_mixed)]
        texts = [b"y" * int(rng.integers(0, 50)) for _ in mixed]
        blob = encode_redo(3, mixed + buckets, texts + values, n_mixed)
        assert decode_redo(blob) == (3, mixed + buckets, texts + values, n_mixed)
    odd = [b"v1", b"b" + bytes(10), b"vlonger"]
    abc = [b"a", b"b", b"c"]
    assert decode_redo(encode_redo(4, odd, abc, 1)) == (4, odd, abc, 1)


def _sockets() -> set[str]:
    """This process's open sockets (their inodes), from ``/proc``."""
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith("socket:"):
            out.add(target)
    return out


def test_closing_a_backend_closes_its_sockets_on_a_node_and_a_cluster(
    shared_redis_url: str,
) -> None:
    """Without waiting for the garbage collector: a cluster client's close leaves the
    pools of its node clients open, so the backend disconnects them itself."""
    gc.collect()
    before = _sockets()
    backends = [RedisBackend(shared_redis_url, namespace=fresh_namespace()) for _ in range(2)]
    for backend in backends:
        backend.get_many([b"vsome-id", b"x" + bytes(16)])
    assert _sockets() - before  # connected
    gc.disable()  # the sockets must close now, not when a collection finds them
    try:
        for backend in backends:
            backend.close()
        assert _sockets() - before == set()
    finally:
        gc.enable()
