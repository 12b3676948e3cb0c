"""A Redis outage in the middle of a shared index's batch write, then the batch again.

What the service's retry (``service/index_outage.py``) relies on: the same batch, decided
and stored again under a new lease once Redis is back, gives the same verdicts and
stores each document once, whether the outage came before the write's commit point (its
redo record) or after it, when the lease is let go and the write is applied on the
applier thread (the batch has its verdicts then, and the write is finished once Redis is
back); and the retry does not wait out this instance's own lease.
The server is real and persists every command (AOF); the outage is a stop and a start
on the same port.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import IndexUnreachableError
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_applier import Applier
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_prepare import Write
from stream_dedup.index.redis_redo import RedoQueue
from stream_dedup.models import Document, Verdict
from stream_dedup.tools import redis_local
from tests.conftest import fresh_namespace

from .test_dedup import article, edit

LOCK_TTL_MS = 10_000


class StopsMidWrite(RedisBackend):
    """Stops its Redis server inside the next write: before its commit point (``at`` 1,
    the write's one script inside the lease) or before the rest is applied (``at`` 2, after
    the commit point, once the lease is let go)."""

    def __init__(self, node: redis_local.PersistentNode, namespace: str) -> None:
        super().__init__(node.url, namespace=namespace, lock_ttl_ms=LOCK_TTL_MS, timeout_s=2)
        self.node = node
        self.at = 0
        self._queue = _StoppingQueue(self)
        self._applier = Applier(self._queue, self._epoch_set, self._failing)

    def stop_at(self, at: int) -> None:
        if self.at == at:
            self.at = 0
            self.node.stop()

    def commit_point(self, prepared: Write) -> tuple[int, list[int]]:
        self.stop_at(1)
        return super().commit_point(prepared)


class _StoppingQueue(RedoQueue):
    def __init__(self, backend: StopsMidWrite) -> None:
        super().__init__(backend._client, backend._wire, backend._keys)
        self._backend = backend

    def apply(self, waiting: Sequence[int], epoch_set: bytes) -> None:
        self._backend.stop_at(2)
        super().apply(waiting, epoch_set)


@pytest.fixture
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis_local.PersistentNode]:
    if redis_local.redis_server_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with redis_local.persistent_node(tmp_path_factory.mktemp("redis")) as started:
        yield started


def decide_and_store(dedup: Deduplicator, docs: list[Document]) -> list[Verdict]:
    with dedup.index.exclusive():
        result = dedup.decide(docs)
        dedup.index.apply(dedup.prepare(result))
    return list(result.verdicts)


def batches() -> tuple[list[Document], list[Document]]:
    first = [Document(f"o{i}", article(i)) for i in range(20)]
    second = [Document(f"c{i}", edit(article(i), 3, i)) for i in range(0, 20, 2)]
    second += [Document(f"n{i}", article(100 + i)) for i in range(5)]
    return first, second


@pytest.mark.parametrize("at", [1, 2], ids=["before-the-commit-point", "after-the-commit-point"])
def test_a_batch_interrupted_by_an_outage_is_stored_once_with_the_same_verdicts(
    node: redis_local.PersistentNode, at: int
) -> None:
    config = DedupConfig()
    first, second = batches()
    reference_backend = RedisBackend(node.url, namespace=fresh_namespace())
    reference = Deduplicator(DedupIndex(reference_backend, IndexParams.of(config)), config)
    decide_and_store(reference, first)
    expected = decide_and_store(reference, second)
    reference.index.close()
    assert sum(v.duplicate_of is not None for v in expected) == 10

    backend = StopsMidWrite(node, fresh_namespace())
    dedup = Deduplicator(DedupIndex(backend, IndexParams.of(config)), config)
    decide_and_store(dedup, first)
    backend.at = at
    if at == 1:
        with pytest.raises(IndexUnreachableError):
            decide_and_store(dedup, second)
    else:
        # Whole at its commit point: the batch goes on while the applier thread fails,
        # and a read that needs the write in the hashes finishes it or fails as a write.
        assert decide_and_store(dedup, second) == expected
        with pytest.raises(IndexUnreachableError, match="applying a write"):
            backend.wait_applied()
    node.start()
    started = time.monotonic()
    again = decide_and_store(dedup, second)
    assert time.monotonic() - started < LOCK_TTL_MS / 2000  # its own lease released at once
    # After the commit point the batch was stored: its documents get their verdicts back.
    assert [v.replayed for v in again] == [at == 2] * len(second)
    assert [dataclasses.replace(v, replayed=False) for v in again] == expected
    assert dedup.index.counter("documents") == len(first) + len(second)
    dedup.index.close()
