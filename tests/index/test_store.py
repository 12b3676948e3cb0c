"""The typed index over both backends: metadata, mismatches, atomic commits, locking."""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.errors import (
    IndexCorruptError,
    IndexLockedError,
    IndexMismatchError,
    IndexStoreError,
)
from stream_dedup.index import (
    Backend,
    DedupIndex,
    IndexParams,
    MemoryBackend,
    keys,
    open_index,
)
from stream_dedup.index.backend import NO_ORDERED_PUTS, OrderedPuts
from stream_dedup.index.params import FORMAT_VERSION
from stream_dedup.index.store import COUNTERS

from .child import run_child

PARAMS = IndexParams.of(DedupConfig())

IndexFactory = Callable[[IndexParams | None], DedupIndex]


def test_new_index_stores_its_parameters(index_factory: IndexFactory) -> None:
    index = index_factory(PARAMS)
    assert index.params == PARAMS
    assert index.params.format_version == FORMAT_VERSION
    assert {c: index.counter(c) for c in COUNTERS} == dict.fromkeys(COUNTERS, 0)
    assert index.offsets() == {}
    assert IndexParams.from_bytes(index.read([keys.META])[0] or b"") == PARAMS


def test_default_parameters_are_all_persisted() -> None:
    # Containment off: its parameters are 0 and not written, so the stored metadata is
    # the one an index always had.
    assert json.loads(PARAMS.to_bytes()) == {
        "normalizer_version": 1,
        "shingler_version": 1,
        "shingle_kind": "char",
        "shingle_k": 5,
        "signature_scheme": "oph-optimal-densification-v1",
        "num_perm": 128,
        "seed": 1,
        "bands": 18,
        "rows": 7,
        "threshold": 0.8,
        "verify": "exact",
        "index_policy": "all",
        "format_version": FORMAT_VERSION,
    }
    assert dataclasses.asdict(PARAMS).keys() - json.loads(PARAMS.to_bytes()).keys() == {
        "containment",
        "containment_rate",
        "containment_cap",
    }


def test_reopen_with_same_or_no_parameters(backend_factory: Callable[[], Backend]) -> None:
    backend = backend_factory()
    DedupIndex(backend, PARAMS)
    assert DedupIndex(backend, PARAMS).params == PARAMS
    assert DedupIndex(backend, None).params == PARAMS


def test_opening_a_non_index_without_parameters_fails(
    backend_factory: Callable[[], Backend],
) -> None:
    with pytest.raises(IndexStoreError, match="not a stream-dedup index"):
        DedupIndex(backend_factory(), None)


def test_corrupt_metadata_is_reported(backend_factory: Callable[[], Backend]) -> None:
    backend = backend_factory()
    backend.write({keys.META: b"{not json"})
    with pytest.raises(IndexCorruptError, match="metadata"):
        DedupIndex(backend, PARAMS)


def test_mismatch_names_every_differing_key(backend_factory: Callable[[], Backend]) -> None:
    backend = backend_factory()
    DedupIndex(backend, PARAMS)
    other = IndexParams.of(DedupConfig(threshold=0.9, seed=7))
    with pytest.raises(IndexMismatchError) as info:
        DedupIndex(backend, other)
    err = info.value
    assert set(err.differences) == {"threshold", "seed", "bands", "rows"}
    assert err.differences["seed"] == (1, 7)
    assert err.differences["threshold"] == (0.8, 0.9)
    message = str(err)
    assert "seed: index has 1, asked for 7" in message
    assert "threshold: index has 0.8, asked for 0.9" in message
    assert "stream-dedup stats --index" in message  # says what to do
    assert err.path == backend.location


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"num_perm": 256}, "num_perm"),
        ({"verify": "signature"}, "verify"),
        ({"index_policy": "uniques"}, "index_policy"),
        ({"normalizer_version": 2}, "normalizer_version"),
        ({"shingle_k": 4}, "shingle_k"),
        ({"format_version": FORMAT_VERSION + 1}, "format_version"),
    ],
)
def test_mismatch_on_any_single_parameter(
    backend_factory: Callable[[], Backend], change: dict[str, object], key: str
) -> None:
    backend = backend_factory()
    DedupIndex(backend, PARAMS)
    with pytest.raises(IndexMismatchError, match=key) as info:
        DedupIndex(backend, dataclasses.replace(PARAMS, **change))  # type: ignore[arg-type]
    assert list(info.value.differences) == [key]


class RecordingBackend:
    """Wraps a backend, records every write, and can be told to fail the next one."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.writes: list[dict[bytes, bytes]] = []
        self.fail_next = False
        self.location = inner.location
        self.get_many = inner.get_many
        self.scan_prefix = inner.scan_prefix
        self.size_bytes = inner.size_bytes
        self.close = inner.close
        self.epochs = inner.epochs
        self.drop_epoch = inner.drop_epoch
        self.shared = inner.shared
        self.exclusive = inner.exclusive

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        self.writes.append(dict(puts))
        self.inner.write(puts)

    def prepare(
        self,
        puts: Mapping[bytes, bytes],
        ordered: OrderedPuts = NO_ORDERED_PUTS,
        epoch: int = 0,
        changed: object = None,
    ) -> dict[bytes, bytes]:
        # A plain dict of the puts, as the in-memory backend prepares them (it keeps no
        # state for that); apply() then records and forwards it as one write.
        assert epoch == 0, "this index keeps no retention"
        return MemoryBackend().prepare(puts, ordered)[1]

    def apply(
        self, prepared: dict[bytes, bytes], committed: Callable[[], None] | None = None
    ) -> None:
        self.write(prepared)
        if committed is not None:
            committed()


def test_commit_is_one_write_with_records_counters_and_offsets(
    backend_factory: Callable[[], Backend],
) -> None:
    backend = RecordingBackend(backend_factory())
    index = DedupIndex(backend, PARAMS)  # type: ignore[arg-type]
    backend.writes.clear()
    index.commit(
        {b"d\x00": b"record", b"v\x01": b"verdict"},
        {"documents": 3, "duplicates": 1},
        {("news", 0): 10, ("news", 256): 7, ("wire.eu", 3): 99},
    )
    assert len(backend.writes) == 1
    written = backend.writes[0]
    assert written[b"d\x00"] == b"record"
    assert written[keys.counter_key("documents")] == (3).to_bytes(8, "little")
    assert written[keys.counter_key("duplicates")] == (1).to_bytes(8, "little")
    assert written[keys.offset_key("news", 256)] == (7).to_bytes(8, "little")
    assert index.counter("documents") == 3
    assert index.offsets() == {("news", 0): 10, ("news", 256): 7, ("wire.eu", 3): 99}

    index.commit({}, {"documents": 2}, {("news", 0): 12})
    assert index.counter("documents") == 5
    assert index.counter("duplicates") == 1
    assert index.offsets()[("news", 0)] == 12


def test_failed_commit_changes_nothing(backend_factory: Callable[[], Backend]) -> None:
    backend = RecordingBackend(backend_factory())
    index = DedupIndex(backend, PARAMS)  # type: ignore[arg-type]
    index.commit({b"v\x01": b"a"}, {"documents": 1}, {("t", 0): 1})
    backend.fail_next = True
    with pytest.raises(OSError, match="disk full"):
        index.commit({b"v\x02": b"b"}, {"documents": 1}, {("t", 0): 2})
    assert index.counter("documents") == 1
    assert index.offsets() == {("t", 0): 1}
    assert index.read([b"v\x02"]) == [None]
    index.commit({b"v\x02": b"b"}, {"documents": 1}, {("t", 0): 2})
    assert index.counter("documents") == 2


def test_stats(index_factory: IndexFactory) -> None:
    index = index_factory(PARAMS)
    index.commit({b"x": b"y" * 100}, {"documents": 4, "indexed": 3, "duplicates": 1, "empty": 1})
    s = index.stats()
    assert (s.documents, s.indexed, s.duplicates, s.empty) == (4, 3, 1, 1)
    assert s.params == PARAMS
    assert s.location == index.location
    assert s.size_bytes > 0


# RocksDB only: persistence and the one-writer lock.


def test_rocks_counters_offsets_and_records_visible_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    index = open_index(path, PARAMS)
    index.commit({b"v\x01": b"one"}, {"documents": 2, "indexed": 1}, {("in", 5): 42})
    index.close()
    again = open_index(path, None)
    try:
        assert again.params == PARAMS
        assert again.counter("documents") == 2
        assert again.counter("indexed") == 1
        assert again.offsets() == {("in", 5): 42}
        assert again.read([b"v\x01"]) == [b"one"]
    finally:
        again.close()


def test_rocks_open_twice_in_one_process_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    index = open_index(path, PARAMS)
    try:
        with pytest.raises(IndexLockedError) as info:
            open_index(path, PARAMS)
        assert "one writer" in str(info.value)
        assert info.value.path == str(path)
    finally:
        index.close()
    open_index(path, PARAMS).close()  # the lock went with the first writer


def test_rocks_mismatch_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    open_index(path, PARAMS).close()
    with pytest.raises(IndexMismatchError):
        open_index(path, IndexParams.of(DedupConfig(seed=9)))
    open_index(path, PARAMS).close()


def test_rocks_open_from_a_second_process_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    index = open_index(path, PARAMS)
    try:
        child = run_child(
            f"""
            import sys
            from stream_dedup.errors import IndexLockedError
            from stream_dedup.index import IndexParams, open_index
            try:
                open_index({str(path)!r}, None)
            except IndexLockedError as exc:
                print("locked:", exc)
                sys.exit(0)
            sys.exit(5)
            """
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.startswith("locked: index at")
    finally:
        index.close()


def test_rocks_commit_survives_a_killed_process(tmp_path: Path) -> None:
    """A commit that returned is in the write-ahead log even if the process dies unclosed."""
    path = tmp_path / "idx"
    child = run_child(
        f"""
        import os, signal
        from stream_dedup.core.config import DedupConfig
        from stream_dedup.index import IndexParams, open_index
        index = open_index({str(path)!r}, IndexParams.of(DedupConfig()))
        index.commit({{b"v\\x07": b"kept"}}, {{"documents": 1}}, {{("t", 0): 8}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    index = open_index(path, PARAMS)
    try:
        assert index.counter("documents") == 1
        assert index.offsets() == {("t", 0): 8}
        assert index.read([b"v\x07"]) == [b"kept"]
    finally:
        index.close()


def test_open_index_without_path_is_a_fresh_memory_index_each_time() -> None:
    first = open_index(None, PARAMS)
    first.commit({b"v\x01": b"a"}, {"documents": 1})
    second = open_index(None, PARAMS)
    assert first.location == second.location == ":memory:"
    assert (first.counter("documents"), second.counter("documents")) == (1, 0)
    assert second.read([b"v\x01"]) == [None]


# The batch intent: announced before the events go out, cleared by the commit.


def test_batch_intent_round_trip_and_cleared_by_the_commit(index_factory: IndexFactory) -> None:
    index = index_factory(PARAMS)
    assert index.intent() is None
    ranges = {("news", 2): (10, 15), ("news", 0): (3, 4), ("wire.eu", 256): (0, 500)}
    index.write_intent(ranges)
    assert index.intent() == ranges
    assert index.offsets() == {}  # announcing a batch stores no offsets
    index.commit({b"v\x01": b"a"}, {"documents": 1}, {tp: end for tp, (_, end) in ranges.items()})
    assert index.intent() is None
    assert index.offsets() == {("news", 2): 15, ("news", 0): 4, ("wire.eu", 256): 500}


def test_batch_intent_is_one_small_write_and_cleared_in_the_commit_write(
    backend_factory: Callable[[], Backend],
) -> None:
    backend = RecordingBackend(backend_factory())
    index = DedupIndex(backend, PARAMS)  # type: ignore[arg-type]
    backend.writes.clear()
    index.write_intent({("news", 1): (7, 9)})
    assert backend.writes == [{keys.INTENT: b'[["news",1,7,9]]'}]
    index.commit({b"v\x01": b"a"}, {"documents": 1}, {("news", 1): 9})
    assert len(backend.writes) == 2
    assert backend.writes[1][keys.INTENT] == b""
    assert backend.writes[1][keys.offset_key("news", 1)] == (9).to_bytes(8, "little")
    index.commit({b"v\x02": b"b"}, {"documents": 1}, {("news", 1): 10})
    assert keys.INTENT not in backend.writes[2]  # nothing pending, nothing to clear


def test_failed_commit_keeps_the_batch_intent(backend_factory: Callable[[], Backend]) -> None:
    backend = RecordingBackend(backend_factory())
    index = DedupIndex(backend, PARAMS)  # type: ignore[arg-type]
    index.write_intent({("t", 0): (1, 2)})
    backend.fail_next = True
    with pytest.raises(OSError, match="disk full"):
        index.commit({b"v\x02": b"b"}, {"documents": 1}, {("t", 0): 2})
    assert index.intent() == {("t", 0): (1, 2)}
    index.commit({b"v\x02": b"b"}, {"documents": 1}, {("t", 0): 2})
    assert index.intent() is None


def test_rocks_batch_intent_survives_a_killed_process_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    child = run_child(
        f"""
        import os, signal
        from stream_dedup.core.config import DedupConfig
        from stream_dedup.index import IndexParams, open_index
        index = open_index({str(path)!r}, IndexParams.of(DedupConfig()))
        index.commit({{b"v\\x07": b"kept"}}, {{"documents": 1}}, {{("t", 0): 8}})
        index.write_intent({{("t", 0): (8, 20), ("t", 1): (0, 5)}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    index = open_index(path, PARAMS)
    try:
        assert index.intent() == {("t", 0): (8, 20), ("t", 1): (0, 5)}
        assert index.offsets() == {("t", 0): 8}
        index.commit({}, {"documents": 12}, {("t", 0): 20, ("t", 1): 5})  # clears after reopen
    finally:
        index.close()
    again = open_index(path, PARAMS)
    try:
        assert again.intent() is None
    finally:
        again.close()


def test_prepared_commit_applies_later_and_only_while_current() -> None:
    index = open_index(None, PARAMS)
    pending = index.prepare({b"d\x01": b"record"}, {"documents": 1}, {("news", 0): 5})
    assert index.read([b"d\x01"]) == [None]
    assert index.counter("documents") == 0
    index.apply(pending)
    assert index.read([b"d\x01"]) == [b"record"]
    assert index.counter("documents") == 1
    assert index.offsets() == {("news", 0): 5}
    stale = index.prepare({b"d\x02": b"record"}, {"documents": 1})
    index.write_intent({("news", 0): (5, 9)})
    with pytest.raises(RuntimeError, match="written after this commit was prepared"):
        index.apply(stale)
    assert index.read([b"d\x02"]) == [None]
    assert index.counter("documents") == 1
