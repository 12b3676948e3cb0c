"""The key-value contract, one suite for the in-memory and the RocksDB backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stream_dedup.index import Backend, MemoryBackend, RocksBackend


@pytest.fixture
def backend(backend_factory: Callable[[], Backend]) -> Backend:
    return backend_factory()


def test_location(backend: Backend, backend_kind: str) -> None:
    if backend_kind == "memory":
        assert backend.location == ":memory:"
    else:
        assert backend.location.endswith("rocks-0")


def test_get_many_in_order_with_none_for_absent(backend: Backend) -> None:
    assert backend.get_many([]) == []
    assert backend.get_many([b"a"]) == [None]
    backend.write({b"a": b"1", b"c": b"3", b"\x00\xff": b"\x00"})
    assert backend.get_many([b"c", b"missing", b"a", b"\x00\xff", b"a"]) == [
        b"3",
        None,
        b"1",
        b"\x00",
        b"1",
    ]


def test_write_overwrites_and_keeps_other_keys(backend: Backend) -> None:
    backend.write({b"k1": b"old", b"k2": b"two"})
    backend.write({b"k1": b"new", b"k3": b""})
    assert backend.get_many([b"k1", b"k2", b"k3"]) == [b"new", b"two", b""]
    backend.write({})
    assert backend.get_many([b"k1"]) == [b"new"]


def test_write_of_many_keys_in_one_call(backend: Backend) -> None:
    puts = {i.to_bytes(4, "big"): bytes([i % 256]) * (i % 50) for i in range(5000)}
    backend.write(puts)
    keys = list(puts)
    assert backend.get_many(keys) == [puts[k] for k in keys]


def test_prepared_write_changes_nothing_until_applied(backend: Backend) -> None:
    backend.write({b"a": b"old"})
    prepared = backend.prepare({b"a": b"new", b"b": b"2"})
    assert backend.get_many([b"a", b"b"]) == [b"old", None]
    backend.apply(prepared)
    assert backend.get_many([b"a", b"b"]) == [b"new", b"2"]


def test_scan_prefix_in_key_order_and_bounded_by_prefix(backend: Backend) -> None:
    backend.write(
        {
            b"a\xff": b"before",
            b"b": b"bare",
            b"b\x00": b"zero",
            b"b\x01z": b"1z",
            b"b\xff\xff": b"ff",
            b"ba": b"ba",
            b"c": b"after",
        }
    )
    got = list(backend.scan_prefix(b"b"))
    assert got == [
        (b"b", b"bare"),
        (b"b\x00", b"zero"),
        (b"b\x01z", b"1z"),
        (b"ba", b"ba"),
        (b"b\xff\xff", b"ff"),
    ]
    assert list(backend.scan_prefix(b"b\x01")) == [(b"b\x01z", b"1z")]
    assert list(backend.scan_prefix(b"d")) == []
    assert list(backend.scan_prefix(b"c")) == [(b"c", b"after")]


def test_memory_size_is_bytes_of_live_keys_and_values() -> None:
    backend = MemoryBackend()
    assert backend.size_bytes() == 0
    backend.write({b"key": b"12345", b"k2": b"x"})
    assert backend.size_bytes() == 3 + 5 + 2 + 1
    backend.write({b"key": b"12"})  # overwrite: value shrinks, key counted once
    assert backend.size_bytes() == 3 + 2 + 2 + 1
    backend.write({b"key": b"1234567890"})
    assert backend.size_bytes() == 3 + 10 + 2 + 1
    backend.close()
    assert backend.size_bytes() == 0


def test_size_grows_with_data(backend: Backend) -> None:
    empty = backend.size_bytes()
    assert empty >= 0
    payload = bytes(range(256)) * 8
    backend.write({i.to_bytes(4, "big"): payload for i in range(500)})  # ~1 MB
    assert backend.size_bytes() >= empty + 500 * len(payload) // 4  # compression allowed


def test_rocks_data_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "db"
    first = RocksBackend(path)
    first.write({b"x": b"1", b"y": b"2"})
    first.close()
    second = RocksBackend(path)
    try:
        assert second.get_many([b"x", b"y", b"z"]) == [b"1", b"2", None]
        assert [k for k, _ in second.scan_prefix(b"")] == [b"x", b"y"]
    finally:
        second.close()
