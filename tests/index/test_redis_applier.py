"""The shared index's applier thread: a write applied after its commit point, beside the batch.

What must hold, on a real Redis node and a 3-master cluster: the batch goes on once its
write passed the commit point, while the write is applied; the instance reads its own
writes all the same; its writes reach the hashes in commit order, each sent once; closing
finishes what was handed over.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from stream_dedup.core import jit
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import keys, redis_applier
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_resp import resp_bulks
from stream_dedup.index.redis_wire import Command, Packed
from stream_dedup.models import Document

from .shared_instances import decide_and_store
from .test_dedup import article
from .test_shared_redo import arguments_of, backend_of, originals

#: How long each apply is held back in these tests: far longer than a batch's deciding.
SLOW_S = 0.4


def slow_applies(backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Hold every batch of commands sent from the applier thread back by :data:`SLOW_S`;
    answers, per batch sent from it, the write versions of its record-hash parts."""
    sent: list[list[int]] = []
    run = backend._wire.run
    applied = backend._keys.applied

    def slow(commands: Sequence[Command | Packed]) -> list[Any]:
        if threading.current_thread().name.startswith("redis-apply"):
            time.sleep(SLOW_S)
            sent_as = map(arguments_of, commands)
            sent.append([int(c[5]) for c in sent_as if c[0] == b"EVAL" and c[3] != applied])
        return run(commands)

    monkeypatch.setattr(backend._wire, "run", slow)
    return sent


def test_the_batch_goes_on_while_its_write_is_applied_and_reads_it_back(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = shared()
    backend = backend_of(first)
    decide_and_store(first, [Document("warm", article(9999))])  # the first batch's set-up
    sent = slow_applies(backend, monkeypatch)
    started = time.monotonic()
    assert decide_and_store(first, originals(4)) == {f"o{i}": None for i in range(4)}
    assert time.monotonic() - started < SLOW_S  # not waiting for the apply
    assert backend._client.hlen(backend._redos) == 1  # committed, not applied yet
    # a read outside a lease overlays nothing: it waits for the instance's own apply
    assert backend.get_many([keys.verdict_key("o2")]) != [None]
    assert time.monotonic() - started >= SLOW_S
    assert backend._client.hlen(backend._redos) == 0
    assert sent  # applied by the applier thread


def test_the_next_lease_reads_a_write_its_thread_still_applies(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside the next lease the own write being applied is read through its record,
    without waiting for the apply; each write's parts are sent once, in commit order."""
    first = shared()
    backend = backend_of(first)
    sent = slow_applies(backend, monkeypatch)
    decide_and_store(first, originals(4))
    started = time.monotonic()
    copies = [Document(f"c{i}", article(i) + " update") for i in range(4)]
    assert decide_and_store(first, copies) == {f"c{i}": f"o{i}" for i in range(4)}
    assert time.monotonic() - started < SLOW_S  # decided over the write being applied
    backend.wait_applied()
    # the second apply found the first write applied by the thread: not sent again
    assert len(sent) == 2 and len(set(sent[0])) == 1 and len(set(sent[1])) == 1
    assert sent[0][0] < sent[1][0]
    assert backend._client.hlen(backend._redos) == 0
    assert first.index.counter("documents") == 8


def test_close_finishes_the_writes_handed_over(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = shared()
    backend = backend_of(first)
    slow_applies(backend, monkeypatch)
    decide_and_store(first, originals(5))
    first.index.close()
    later = shared()
    other = backend_of(later)
    assert other._client.hlen(other._redos) == 0  # applied before the connection closed
    assert other.get_many([keys.verdict_key("o4")]) != [None]
    assert later.index.counter("documents") == 5


def test_other_processes_are_told_of_a_commit_once_it_is_applied(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index's commit notice (the service's check process reads the record hashes,
    without redo records) comes once the write is applied, not at its commit point."""
    first = shared()
    backend = backend_of(first)
    decide_and_store(first, [Document("warm", article(9999))])
    slow_applies(backend, monkeypatch)
    told: list[int] = []
    done = threading.Event()

    def notice() -> None:
        told.append(backend._client.hlen(backend._redos))
        done.set()

    first.index.on_commit = notice
    decide_and_store(first, originals(3))
    assert told == []  # the batch went on; the write is still being applied
    assert done.wait(10)
    assert told == [0]  # applied, its record deleted, before the notice


def test_a_failed_apply_is_counted_and_the_next_write_applies_its_record(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis refusing the applier thread's commands once: the failure is counted (the
    service's ``stream_dedup_index_apply_failures_total``), the write's redo record waits,
    the batch after it applies both, and nothing is lost."""
    first = shared()
    backend = backend_of(first)
    decide_and_store(first, [Document("warm", article(9999))])
    backend.wait_applied()
    run = backend._wire.run
    refused: list[int] = []

    def refuse_once(commands: Sequence[Command | Packed]) -> list[Any]:
        if threading.current_thread().name.startswith("redis-apply") and not refused:
            refused.append(len(commands))
            raise redis.ConnectionError("connection reset by peer")
        return run(commands)

    monkeypatch.setattr(backend._wire, "run", refuse_once)
    assert first.index.apply_failures() == 0
    decide_and_store(first, originals(3))
    deadline = time.monotonic() + 10
    while first.index.apply_failures() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert refused and first.index.apply_failures() == 1
    assert backend._client.hlen(backend._redos) == 1  # the write waits in its record
    copies = [Document(f"c{i}", article(i) + " update") for i in range(3)]
    assert decide_and_store(first, copies) == {f"c{i}": f"o{i}" for i in range(3)}
    backend.wait_applied()
    assert backend._client.hlen(backend._redos) == 0  # both applied by the next write
    assert first.index.apply_failures() == 1
    assert first.index.counter("documents") == 7
    later = backend_of(shared())
    assert later.get_many([keys.verdict_key(f"o{i}") for i in range(3)]).count(None) == 0


def test_the_warm_up_loads_the_apply_loop_on_the_applier_thread(
    shared: Callable[[], Deduplicator], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = shared()
    threads: list[str] = []
    load = redis_applier.load_kernel
    monkeypatch.setattr(
        redis_applier,
        "load_kernel",
        lambda: (threads.append(threading.current_thread().name), load())[1],
    )
    first.warm_up()
    backend_of(first)._applier.warm_up().result(timeout=60)  # queued behind the first
    assert len(threads) == 2 and all(t.startswith("redis-apply") for t in threads)
    assert jit.compiled(resp_bulks).signatures  # loaded (or compiled) there
