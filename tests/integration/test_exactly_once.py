"""Exactly-once delivery against the real broker: one transaction per batch.

A ``read_committed`` reader sees one event per document and one dead letter per bad
message; the group's committed offsets are the index's (they move only inside the
transactions); and a stop between a committed transaction and the index write (the
index fails there, as a full disk makes it) stores the batch at the next start without
emitting its events again.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from traceback import format_exception
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stream_dedup.errors import IndexIOError, TransactionError
from stream_dedup.index import open_index
from stream_dedup.service import starting

from .committed_reader import read_committed
from .support import (
    ServiceThread,
    Topics,
    events,
    kijiji_documents,
    make_config,
    offline_reference,
    produce,
    produce_json,
    read_topic,
)
from .test_index_failure import STORED_BATCHES, open_failing

pytestmark = pytest.mark.broker

BATCH = 100


def group_offsets(bootstrap: str, topics: Topics, partitions: int = 1) -> dict[int, int]:
    """The input offsets committed for the service's group, by partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group})
    try:
        asked = [TopicPartition(topics.input, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, 10)}
    finally:
        consumer.close()


def outputs(bootstrap: str, topics: Topics, expected: int) -> list[dict[str, Any]]:
    """Every event a ``read_committed`` reader sees on the unique and duplicates topics."""
    unique = read_topic(bootstrap, topics.unique, 1, timeout_s=20)
    dups = read_topic(bootstrap, topics.duplicates, 0, timeout_s=20)
    out = events(unique + dups)
    assert len(out) >= expected
    return out


def test_each_event_and_dead_letter_once_and_offsets_committed_in_the_transaction(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    docs = kijiji_documents(5 * BATCH)
    reference = offline_reference(docs, tmp_path)
    bad = [b"{not json", b'{"title": "no id"}', b"[1, 2]"]
    records = [(None, json.dumps(d).encode(), None) for d in docs[:250]]
    records += [(None, value, None) for value in bad]
    records += [(None, json.dumps(d).encode(), None) for d in docs[250:]]
    produce(bootstrap, topics.input, records)
    path = tmp_path / "index"
    config = make_config(
        bootstrap, topics, path, batch={"max_messages": BATCH}, service={"delivery": "exactly-once"}
    )
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(records))
    committed = svc.metric("stream_dedup_transactions_total", {"outcome": "committed"})
    assert svc.stop() == 0

    assert committed >= len(records) // BATCH
    assert svc.metric("stream_dedup_transactions_total", {"outcome": "aborted"}) == 0
    out = outputs(bootstrap, topics, len(docs))
    counts = Counter(ev["id"] for ev in out)
    assert set(counts) == {d["id"] for d in docs} and set(counts.values()) == {1}
    for ev in out:
        ref = reference[ev["id"]]
        fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
        assert {k: ev[k] for k in fields} == {k: ref[k] for k in fields}, ev["id"]
    dead = read_topic(bootstrap, topics.dlq, len(bad), timeout_s=20)
    assert sorted(m.value() for m in dead) == sorted(bad)
    # Kafka's group offsets moved inside the transactions, to where the index stands.
    index = open_index(path, None)
    try:
        assert index.offsets() == {(topics.input, 0): len(records)}
    finally:
        index.close()
    assert group_offsets(bootstrap, topics) == {0: len(records)}


def test_a_stop_after_the_transaction_commits_stores_the_batch_without_emitting_it_again(
    bootstrap: str, topics: Topics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = kijiji_documents(6 * BATCH)
    reference = offline_reference(docs, tmp_path)
    produce_json(bootstrap, topics.input, docs)
    path = tmp_path / "index"
    config = make_config(
        bootstrap, topics, path, batch={"max_messages": BATCH}, service={"delivery": "exactly-once"}
    )

    # The index write after the third transaction fails: Kafka has the batch, the index
    # only its intent.
    monkeypatch.setattr(starting, "open_index", open_failing)
    svc = ServiceThread(config).start()
    with pytest.raises(IndexIOError):
        svc.wait_for("stream_dedup_commits_total", float("inf"), timeout_s=60)
    with pytest.raises(IndexIOError):
        svc.stop()
    assert svc.metric("stream_dedup_transactions_total", {"outcome": "committed"}) == (
        STORED_BATCHES + 1
    )
    index = open_index(path, None)
    try:
        stored = index.counter("documents")
        intent = index.intent()
        assert intent is not None
        start, end = intent[(topics.input, 0)]
        assert start == stored and end > start
    finally:
        index.close()
    assert group_offsets(bootstrap, topics) == {0: end}  # the transaction committed

    monkeypatch.undo()
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs) - stored)
    assert svc.stop() == 0

    out = outputs(bootstrap, topics, len(docs))
    counts = Counter(ev["id"] for ev in out)
    assert set(counts) == {d["id"] for d in docs}
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1][:5]
    for ev in out:
        assert ev["verdict"] == reference[ev["id"]]["verdict"], ev["id"]
    index = open_index(path, None)
    try:
        assert index.counter("documents") == len(docs) and index.intent() is None
        assert index.offsets() == {(topics.input, 0): len(docs)}
    finally:
        index.close()
    assert group_offsets(bootstrap, topics) == {0: len(docs)}


def test_the_marker_reader_keeps_committed_records_and_drops_aborted_and_open_ones(
    bootstrap: str, topics: Topics
) -> None:
    """The reader the kill -9 test trusts, against the broker's own markers: a plain
    record, a committed and an aborted transaction, one left open by a fenced producer
    (aborted by the next ``init_transactions``), and one still open."""
    topic = topics.unique
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"plain")
    assert plain.flush(10) == 0
    tid = f"t-{topics.group}"

    def transactional() -> Producer:
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
        producer.init_transactions(10)
        producer.begin_transaction()
        return producer

    first = transactional()
    for value in (b"c1", b"c2"):
        first.produce(topic, value)
    first.commit_transaction(10)
    first.begin_transaction()
    first.produce(topic, b"aborted")
    first.flush(10)
    first.abort_transaction(10)
    first.begin_transaction()
    first.produce(topic, b"fenced")
    first.flush(10)
    second = transactional()  # fences the first; its open transaction is aborted
    second.produce(topic, b"c3")
    second.commit_transaction(10)
    second.begin_transaction()
    second.produce(topic, b"open")
    second.flush(10)

    log = read_committed(bootstrap, topic)
    assert [v for _k, v in log.committed] == [b"plain", b"c1", b"c2", b"c3"]
    assert (log.commits, log.aborts, log.aborted) == (2, 2, 2)
    second.abort_transaction(10)


def test_an_instance_fenced_by_a_newer_one_stops_and_the_newer_one_delivers_once(
    bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Another producer registers the service's ``transactional.id`` (a second deployment
    by mistake, or a restarted instance while the old one still runs): the old instance's
    next transaction is refused, it stops with :class:`TransactionError` without
    dead-lettering anything, and the next start delivers the rest once."""
    docs = kijiji_documents(4 * BATCH)
    path = tmp_path / "index"
    config = make_config(
        bootstrap, topics, path, batch={"max_messages": BATCH}, service={"delivery": "exactly-once"}
    )
    produce_json(bootstrap, topics.input, docs[: 2 * BATCH])
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_index_documents", 2 * BATCH)

    newer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"stream-dedup-{topics.group}"}
    )
    newer.init_transactions(10)  # fences the running instance
    produce_json(bootstrap, topics.input, docs[2 * BATCH :])
    svc.join(timeout_s=60)  # it stops by itself
    assert isinstance(svc.error, TransactionError), "".join(format_exception(svc.error))
    assert "fence" in str(svc.error).lower()
    assert svc.service.metrics.dead_letters.labels("processing_error")._value.get() == 0
    index = open_index(path, None)
    try:
        assert index.counter("documents") == 2 * BATCH
    finally:
        index.close()

    svc = ServiceThread(config).start()  # fences the other producer in turn
    svc.wait_for("stream_dedup_index_documents", len(docs))
    assert svc.stop() == 0
    out = outputs(bootstrap, topics, len(docs))
    counts = Counter(ev["id"] for ev in out)
    assert set(counts) == {d["id"] for d in docs} and set(counts.values()) == {1}
    assert read_committed(bootstrap, topics.dlq).committed == []
