"""The key-value contract, one suite for the in-memory and the RocksDB backend."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from rocksdict import AccessType, Options, Rdict

from stream_dedup.index import Backend, MemoryBackend, RocksBackend
from stream_dedup.index.backend import OrderedPuts

from .child import run_child


@pytest.fixture
def backend(backend_factory: Callable[[], Backend]) -> Backend:
    return backend_factory()


def test_location(backend: Backend, backend_kind: str) -> None:
    if backend_kind == "memory":
        assert backend.location == ":memory:"
    elif backend_kind.startswith("redis"):
        assert backend.location.startswith("redis://127.0.0.1:")
        assert "(namespace test-" in backend.location
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


def test_document_keys_read_and_scan_like_any_other(backend: Backend) -> None:
    """The RocksDB backend keeps ``d`` keys in their own column family: nobody above sees it."""
    docs = {b"d" + i.to_bytes(8, "big"): bytes([i]) * 40 for i in range(5)}
    others = {b"M": b"meta", b"b\x00\x01": b"bucket", b"v-id": b"verdict", b"e": b"edge"}
    backend.write({**docs, **others})
    mixed = [b"v-id", b"d" + (3).to_bytes(8, "big"), b"M", b"d-missing", b"b\x00\x01"]
    assert backend.get_many(mixed) == [b"verdict", docs[mixed[1]], b"meta", None, b"bucket"]
    assert backend.get_many(list(docs)) == list(docs.values())
    everything = {**docs, **others}
    assert list(backend.scan_prefix(b"")) == sorted(everything.items())
    assert list(backend.scan_keys(b"")) == sorted(everything)
    assert list(backend.scan_prefix(b"d")) == sorted(docs.items())
    assert list(backend.scan_keys(b"d\x00")) == sorted(docs)
    assert list(backend.scan_keys(b"e")) == [b"e"]


def test_prepared_write_with_document_records_is_atomic(backend: Backend) -> None:
    prepared = backend.prepare(
        {b"d\x00": b"doc", b"v1": b"verdict"},
        ordered=OrderedPuts([b"b\x01", b"b\x02"], [b"1", b"2"]),
    )
    assert backend.get_many([b"d\x00", b"v1", b"b\x01"]) == [None, None, None]
    backend.apply(prepared)
    assert backend.get_many([b"d\x00", b"v1", b"b\x01", b"b\x02"]) == [
        b"doc",
        b"verdict",
        b"1",
        b"2",
    ]


def test_rocks_refuses_document_records_among_ordered_puts(tmp_path: Path) -> None:
    backend = RocksBackend(tmp_path / "db")
    try:
        with pytest.raises(ValueError, match="document records"):
            backend.prepare(
                {}, ordered=OrderedPuts([b"b\x01", b"d\x05", b"x"], [b"1", b"doc", b"2"])
            )
    finally:
        backend.close()


def _families(path: Path) -> dict[str, list[bytes]]:
    """Every key per column family, read straight from RocksDB."""
    names = Rdict.list_cf(str(path), Options(raw_mode=True))
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        out: dict[str, list[bytes]] = {}
        for name in names:
            family = db if name == "default" else db.get_column_family(name)
            out[name] = list(family.keys())
            if family is not db:
                family.close()
        return out
    finally:
        db.close()


def test_rocks_keeps_document_records_in_their_own_column_family(tmp_path: Path) -> None:
    path = tmp_path / "db"
    backend = RocksBackend(path)
    backend.write({b"d\x00\x01": b"doc", b"b\x01": b"bucket", b"x": b"exact"})
    backend.close()
    assert _families(path) == {"default": [b"b\x01", b"x"], "docs": [b"d\x00\x01"]}


def test_rocks_moves_documents_of_the_old_layout_at_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An index written before the ``docs`` family works, read-only as it is, and is moved."""
    path = tmp_path / "db"
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    old = Rdict(str(path), opts)
    docs = {b"d" + i.to_bytes(8, "big"): i.to_bytes(4, "little") * 100 for i in range(4500)}
    for key, value in {**docs, b"M": b"meta", b"b\x01": b"bucket", b"v1": b"v"}.items():
        old[key] = value
    old.close()

    view = RocksBackend(path, read_only=True)  # a frozen view takes the layout as it is
    try:
        assert view.get_many([b"d" + (7).to_bytes(8, "big"), b"M"]) == [
            docs[b"d" + (7).to_bytes(8, "big")],
            b"meta",
        ]
        assert sum(1 for _ in view.scan_keys(b"")) == len(docs) + 3
    finally:
        view.close()
    assert "docs" not in _families(path)

    with caplog.at_level(logging.INFO, logger="stream_dedup.index"):
        backend = RocksBackend(path)
    try:
        assert backend.get_many(list(docs)) == list(docs.values())
        assert list(backend.scan_prefix(b"d")) == sorted(docs.items())
        assert backend.get_many([b"M", b"b\x01", b"v1"]) == [b"meta", b"bucket", b"v"]
    finally:
        backend.close()
    moved = [r for r in caplog.records if "own column family" in r.getMessage()]
    assert [r.fields["records"] for r in moved] == [4500]  # type: ignore[attr-defined]
    families = _families(path)
    assert families["default"] == [b"M", b"b\x01", b"v1"]
    assert families["docs"] == sorted(docs)


def _sst_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.sst")}


def _options_section(path: Path, section: str) -> dict[str, str]:
    """One section of the options RocksDB wrote at the last open (its OPTIONS file)."""
    latest = max(path.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    at, out = "", {}
    for line in latest.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            at = line
        elif at == section and "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


def _family_options(path: Path, family: str) -> dict[str, str]:
    """One column family's options as RocksDB wrote them at the last open."""
    return _options_section(path, f'[CFOptions "{family}"]')


def test_rocks_opens_an_index_compacted_level_by_level_and_compacts_it_on(
    tmp_path: Path,
) -> None:
    """Indexes written before universal compaction (leveled: files at L0 and L6) still work.

    RocksDB takes each non-empty level as one sorted run; reads see every key, and the
    old runs are merged with new ones. The options in force are read back from the
    OPTIONS file RocksDB writes at each open.
    """
    path = tmp_path / "db"
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    old = Rdict(str(path), opts)  # RocksDB's default: leveled compaction
    written: dict[bytes, bytes] = {}
    for chunk in range(3):
        for i in range(2000):
            key = b"b" + (chunk * 2000 + i).to_bytes(2, "big") + (i * 7919).to_bytes(8, "big")
            old[key] = written[key] = i.to_bytes(8, "little")
        old.flush()
        if chunk == 0:
            old.compact_range(None, None)  # to the last level
    levels = [old.property_int_value(f"rocksdb.num-files-at-level{n}") for n in range(7)]
    old.close()
    assert levels[0] == 2 and levels[6] == 1  # runs at level 0 and level 6

    backend = RocksBackend(path)
    try:
        default = _family_options(path, "default")
        assert default["compaction_style"] == "kCompactionStyleUniversal"
        assert default["compression"] == "kLZ4Compression"  # flushes and younger runs
        assert default["bottommost_compression"] == "kZSTD"  # the run holding the most
        assert default["level0_file_num_compaction_trigger"] == "12"
        assert backend.get_many(list(written)) == list(written.values())
        before = _sst_files(path)
        for flush in range(14):  # more sorted runs than the compaction trigger
            puts = {b"b\xff" + bytes([flush]) + i.to_bytes(8, "big"): b"x" for i in range(500)}
            backend.write(puts)
            written.update(puts)
            backend.flush()
        backend.db.compact_range(None, None)  # waits for the merge of every run
        assert not before & _sst_files(path)  # the old runs were merged away
        assert dict(backend.scan_prefix(b"b")) == written
    finally:
        backend.close()
    reopened = RocksBackend(path)
    try:
        assert reopened.get_many(list(written)) == list(written.values())
    finally:
        reopened.close()


def test_rocks_log_is_bounded_not_recycled_and_recovers_after_a_kill(tmp_path: Path) -> None:
    """The write-ahead log holds every write that returned, after ``kill -9`` too.

    A child writes batches, flushing now and then so that older logs become obsolete,
    then dies without closing. Every batch it wrote must be there, and nothing else. No
    log file is recycled (a secondary instance following the index stalls on one, and a
    recycled file keeps its full size on disk), and the log is bounded.
    """
    path = tmp_path / "db"
    child = run_child(
        f"""
        import os, signal
        from stream_dedup.index.rocks import RocksBackend
        backend = RocksBackend({str(path)!r})
        for n in range(40):
            puts = {{b"b" + n.to_bytes(2, "big") + i.to_bytes(8, "big"): bytes([n]) * 10
                     for i in range(300)}}
            puts.update({{b"d" + (n * 100 + i).to_bytes(8, "big"): bytes([n]) * 3000
                          for i in range(100)}})
            backend.write(puts)
            if n % 8 == 7 and n < 39:
                backend.flush()  # a new log file next; the old one is obsolete
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        timeout_s=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    options = _options_section(path, "[DBOptions]")
    assert options["recycle_log_file_num"] == "0"
    assert options["max_total_wal_size"] == str(4 << 20)  # the log bounded: bytes on disk
    assert "from recycle list" not in (path / "LOG").read_text()
    backend = RocksBackend(path)
    try:
        buckets = dict(backend.scan_prefix(b"b"))
        docs = dict(backend.scan_prefix(b"d"))
        assert len(buckets) == 40 * 300 and len(docs) == 40 * 100
        assert all(v == bytes([k[2]]) * 10 for k, v in buckets.items())
        for key, value in docs.items():
            assert value == bytes([int.from_bytes(key[1:], "big") // 100]) * 3000
    finally:
        backend.close()
