"""A failing index stops the service: nothing is dead-lettered, the batch is replayed.

The broker is real and so is RocksDB on disk; the fault is injected in a
:class:`RocksBackend` whose batch writes start failing, as a full or failing disk makes
RocksDB fail them (:class:`~stream_dedup.errors.IndexIOError`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.errors import IndexIOError
from stream_dedup.index import DedupIndex, RocksBackend, open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.rocks import PreparedBatch
from stream_dedup.service import starting

from .support import (
    ServiceThread,
    Topics,
    events,
    kijiji_documents,
    make_config,
    offline_reference,
    produce_json,
    read_topic,
)

pytestmark = pytest.mark.broker

#: Batches stored before the index's writes start failing.
STORED_BATCHES = 2
BATCH = 100


class FailingWrites(RocksBackend):
    """RocksDB on disk whose batch writes fail after the first ``ok`` ones.

    Small writes (the index metadata, a batch's intent) still succeed, so the failure
    comes at the commit point, after the batch's events were produced and confirmed.
    """

    def __init__(self, path: str | Path, ok: int, *, sync: bool = False) -> None:
        super().__init__(path, sync=sync)
        self.ok = ok
        self.stored = 0

    def write(self, puts: Mapping[bytes, bytes]) -> None:
        RocksBackend.apply(self, self.prepare(puts))

    def apply(self, prepared: PreparedBatch, committed: Callable[[], None] | None = None) -> None:
        if self.stored >= self.ok:
            raise IndexIOError(
                self.location, "writing a batch", "IO error: No space left on device"
            )
        super().apply(prepared, committed)
        self.stored += 1


def open_failing(
    path: Any, params: IndexParams | None, *, sync: bool = False, retention: Any = None
) -> DedupIndex:
    """:func:`open_index` of the service, over :class:`FailingWrites`."""
    return DedupIndex(FailingWrites(path, STORED_BATCHES, sync=sync), params, retention)


@pytest.mark.slow
def test_a_failing_index_write_stops_the_service_and_the_batch_is_replayed(
    bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    package_logs: list[logging.LogRecord],
) -> None:
    docs = kijiji_documents(6 * BATCH)
    reference = offline_reference(docs, tmp_path)
    produce_json(bootstrap, topics.input, docs)
    path = tmp_path / "index"
    config = make_config(bootstrap, topics, path, batch={"max_messages": BATCH})

    monkeypatch.setattr(starting, "open_index", open_failing)
    svc = ServiceThread(config).start()
    with pytest.raises(IndexIOError, match="No space left on device"):
        svc.wait_for("stream_dedup_commits_total", float("inf"), timeout_s=60)
    with pytest.raises(IndexIOError):
        svc.stop()
    assert svc.metric("stream_dedup_commits_total") == STORED_BATCHES
    assert svc.metric("stream_dedup_dead_letters_total", {"reason": "processing_error"}) == 0
    assert read_topic(bootstrap, topics.dlq, 0, timeout_s=10, idle_s=2) == []
    stopping = [r for r in package_logs if r.getMessage() == "stopping: the service cannot go on"]
    assert len(stopping) == 1 and stopping[0].levelno == logging.ERROR

    # What the index holds: the stored batches, and the intent of the failed one.
    index = open_index(path, None)
    try:
        stored = index.counter("documents")
        assert 0 < stored < len(docs)
        assert index.offsets() == {(topics.input, 0): stored}
        intent = index.intent()
        assert intent is not None and intent[(topics.input, 0)][0] == stored
    finally:
        index.close()
    before = events(read_topic(bootstrap, topics.unique, 1, timeout_s=10))
    before += events(read_topic(bootstrap, topics.duplicates, 0, timeout_s=10))

    # Restarted on a healthy index: the failed batch again, identically, then the rest.
    monkeypatch.undo()
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs) - stored)
    assert svc.stop() == 0

    after = events(read_topic(bootstrap, topics.unique, 1, timeout_s=10))
    after += events(read_topic(bootstrap, topics.duplicates, 0, timeout_s=10))
    first: dict[str, dict[str, Any]] = {}
    for ev in after:
        assert first.setdefault(ev["id"], ev) == ev, f"{ev['id']} emitted twice, differently"
    assert set(first) == {d["id"] for d in docs}
    assert len(after) > len(first) and len(before) > stored
    for doc_id, ev in first.items():
        ref = reference[doc_id]
        fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
        assert {k: ev[k] for k in fields} == {k: ref[k] for k in fields}, doc_id
    assert read_topic(bootstrap, topics.dlq, 0, timeout_s=5, idle_s=2) == []
    index = open_index(path, None)
    try:
        assert index.counter("documents") == len(docs)
        assert index.intent() is None
    finally:
        index.close()
