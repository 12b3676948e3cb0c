"""The shared index's change log on real Redis servers: each instance's key filter kept in
step with the others' writes, so that a lease reads only the keys it cannot rule out,
and the cases where the log cannot tell everything (an instance far behind, a write
without fingerprints, a crash after the commit point)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest

from stream_dedup.core.hashing import U64
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import IndexUnreachableError
from stream_dedup.index import keys
from stream_dedup.index import redis_backend as redis_backend_module
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_log import ChangeCursor, encode_entry
from stream_dedup.models import Document

from .shared_instances import decide_and_store, shared_instances
from .test_dedup import article


class Counting(RedisBackend):
    """A Redis backend that counts the record fields it reads (epoch > 0 or not)."""

    read_fields = 0

    def get_many(self, keys_: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        self.read_fields += len(keys_)
        return super().get_many(keys_, epoch)


@pytest.fixture
def shared(shared_redis_url: str) -> Iterator[Callable[[], Deduplicator]]:
    """``make()``: one more instance on one index, its backend counting its reads."""
    with shared_instances(shared_redis_url, Counting) as make:
        yield make


def reads(dedup: Deduplicator) -> int:
    backend = dedup.index._backend
    assert isinstance(backend, Counting)
    return backend.read_fields


def originals(n: int, first: int = 0) -> list[Document]:
    return [Document(f"o{i}", article(i)) for i in range(first, first + n)]


def copies(seeds: range) -> list[Document]:
    return [Document(f"c{i}", article(i) + " (update)") for i in seeds]


def test_a_lease_reads_only_the_keys_the_filter_cannot_rule_out(
    shared: Callable[[], Deduplicator],
) -> None:
    """Two instances take turns; each one's filter learns the other's keys from the log:
    copies are found, and a batch of new documents reads a small share of its ~20 keys
    per document (those that exist, and ~1% false positives)."""
    first, second = shared(), shared()
    assert set(decide_and_store(first, originals(40)).values()) == {None}
    assert set(decide_and_store(second, originals(40, 100)).values()) == {None}
    before = reads(first)
    assert decide_and_store(first, copies(range(100, 140))) == {
        f"c{i}": f"o{i}" for i in range(100, 140)
    }
    before_new = reads(second)
    assert set(decide_and_store(second, originals(40, 500)).values()) == {None}
    # New documents: their keys are in no filter. Without the filter, ~20 a document.
    assert reads(second) - before_new < 2 * 40
    # Copies: their ~20 bucket keys exist (written by the other instance), plus records.
    assert reads(first) - before > 10 * 40


def test_an_instance_further_behind_than_the_log_reads_everything_then_rebuilds(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_backend_module, "LOG_ENTRIES", 2)
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])  # second builds its filter
    backend = second.index._backend
    assert isinstance(backend, RedisBackend) and backend.following
    for b in range(4):  # more batches than the log keeps
        decide_and_store(first, originals(5, 10 * b))
    found = decide_and_store(second, copies(range(0, 40, 10)))
    assert found == {f"c{i}": f"o{i}" for i in range(0, 40, 10)}
    assert not backend.following  # that lease read every key; the filter is built anew
    decide_and_store(first, originals(3, 200))
    assert decide_and_store(second, copies(range(200, 203))) == {
        f"c{i}": f"o{i}" for i in range(200, 203)
    }
    assert backend.following


def test_a_write_of_unknown_keys_makes_the_others_rebuild(
    shared: Callable[[], Deduplicator],
) -> None:
    """A write without fingerprints (as a snapshot's restore makes) logs an empty entry:
    a follower cannot trust its filter and reads every key, then builds it again."""
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])
    backend = first.index._backend
    assert isinstance(backend, RedisBackend)
    with first.index.exclusive():
        result = first.decide(originals(3))
        pending = first.prepare(result)
        # The same write, its keys not told:
        backend.apply(
            backend.prepare({}, epoch=pending.epoch)._replace(entry=encode_entry(0, None))
        )
        first.index.apply(pending)
    # first's own entry (with its keys) follows the empty one; second must not skip them.
    assert decide_and_store(second, copies(range(3))) == {f"c{i}": f"o{i}" for i in range(3)}


def test_a_follower_finds_a_write_a_crash_cut_after_its_commit_point(
    shared: Callable[[], Deduplicator],
) -> None:
    """The log entry is stored with the redo record: a follower that applies the redo
    record learns its keys too."""
    first, second = shared(), shared()
    decide_and_store(second, [Document("warm", article(9999))])
    backend = first.index._backend
    assert isinstance(backend, RedisBackend)
    with first.index.exclusive():
        pending = first.prepare(first.decide(originals(6)))
        write = pending.write
        # The commit point, and the process dies here: nothing else of the write is applied.
        backend.commit_point(write)
    assert backend._client.hlen(backend._redos) == 1
    assert decide_and_store(second, copies(range(6))) == {f"c{i}": f"o{i}" for i in range(6)}
    assert second.index.read([keys.verdict_key("o5")]) != [None]


def test_the_cursor_moves_past_its_own_write_only_when_it_is_the_next_entry() -> None:
    cursor = ChangeCursor()
    cursor.own(5)
    assert cursor.at is None  # not following: nothing to move
    cursor.follow(3)
    cursor.read([5, 1, encode_entry(2, _fps(7)), encode_entry(2, _fps(8))])
    assert cursor.at == 5
    cursor.own(7)  # another write came between: read again later
    assert cursor.at == 5
    cursor.own(6)
    assert cursor.at == 6
    drained = cursor.drain()
    assert drained is not None
    assert [(e, f.tolist()) for e, f in drained] == [(2, [7]), (2, [8])]
    cursor.read([9, 0])  # the log no longer reaches back
    assert cursor.drain() is None and cursor.at is None
    cursor.follow(9)
    cursor.read([2, 1, encode_entry(0, _fps(1))])  # a version below: Redis lost the log
    assert cursor.drain() is None and cursor.at is None


def _fps(value: int) -> U64:
    return np.array([value], dtype=np.uint64)


def test_a_filter_build_cut_short_is_started_again(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan that fails half way (Redis went away) leaves no half-built filter trusted:
    the next lease builds it again before it skips any key."""
    first, second = shared(), shared()
    decide_and_store(first, originals(10))
    backend = second.index._backend
    assert isinstance(backend, RedisBackend)
    scan = backend.scan_keys
    calls = 0

    def failing_scan(prefix: bytes, epoch: int = 0) -> Iterator[bytes]:
        nonlocal calls
        calls += 1
        if calls == 2:  # the buckets were scanned, the exact texts not
            raise IndexUnreachableError(backend.location, "scanning", "gone")
        return scan(prefix, epoch)

    monkeypatch.setattr(backend, "scan_keys", failing_scan)
    with pytest.raises(IndexUnreachableError):
        decide_and_store(second, [Document("x", article(5000))])
    # The copies' exact texts are what the cut scan did not reach.
    assert decide_and_store(second, [Document("again", article(3))]) == {"again": "o3"}
    assert calls > 3  # built again whole
