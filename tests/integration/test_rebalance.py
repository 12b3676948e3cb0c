"""A second member joins the service's consumer group, then leaves: nothing is lost.

The service is meant to be the group's only member, but a second one can appear (a
deployment that briefly runs two replicas, an operator's console consumer with the wrong
group). The group then rebalances: the service checkpoints what it collected and gives
partitions up, and when the other member leaves it gets them back and must resume from the
offsets stored in its index. The intruder here reads and *commits* what it read without
deciding it, so a service that resumed from Kafka's group offsets would skip those
documents; only the index offsets give every document an event.

Both rebalance protocols are covered: eager (librdkafka's default assignors: everything
is revoked, then reassigned) and cooperative (``cooperative-sticky``: only the moved
partitions are revoked and assigned, incrementally).
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from stream_dedup.tools.generate import StreamSpec, write_jsonl

from .support import (
    ServiceThread,
    Topics,
    assert_equal_to_offline_in_decision_order,
    events,
    make_config,
    produce,
    read_topic,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DOCUMENTS = 6000  # at most; the feeder stops 300 after the second member left
PARTITIONS = 3


class Feeder(threading.Thread):
    """~150 documents/s round-robin over the partitions until told to finish, then 300 more.

    Round-robin, so that near-duplicates cross partitions; open-ended, so that documents
    flow before, during and after the second member's stay however long the rebalances take.
    """

    def __init__(self, bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.docs = bootstrap, topic, docs
        self.produced = 0
        self.finish = threading.Event()

    def run(self) -> None:
        stop_at = len(self.docs)
        for i in range(0, len(self.docs), 30):
            if self.finish.is_set():
                stop_at = min(stop_at, self.produced + 300)
            if i >= stop_at:
                return
            for p in range(PARTITIONS):
                chunk = self.docs[i + p : i + 30 : PARTITIONS]
                records = ((None, json.dumps(d).encode(), None) for d in chunk)
                produce(self.bootstrap, self.topic, records, p)
            self.produced = min(i + 30, len(self.docs))
            time.sleep(0.2)


def intrude(
    bootstrap: str, topics: Topics, strategy: str | None, svc: ServiceThread, hold_s: float
) -> tuple[set[int], int, list[float]]:
    """Join the group, read and commit for ``hold_s`` once assigned, then leave.

    Returns the partitions the intruder held, how many messages it read, and the service's
    assigned-partitions gauge sampled meanwhile.
    """
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": topics.group,
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
    }
    if strategy is not None:
        conf["partition.assignment.strategy"] = strategy
    member = Consumer(conf)
    held: set[int] = set()

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        held.update(tp.partition for tp in partitions)

    member.subscribe([topics.input], on_assign=on_assign)
    samples: list[float] = []
    read = 0
    deadline = time.monotonic() + 30
    leave_at: float | None = None
    try:
        while leave_at is None or time.monotonic() < leave_at:
            assert time.monotonic() < deadline, "the second member got no partition"
            msg = member.poll(0.1)
            if msg is not None and msg.error() is None:
                read += 1
            samples.append(svc.metric("stream_dedup_assigned_partitions"))
            if leave_at is None and member.assignment():
                leave_at = time.monotonic() + hold_s
        if read:  # what it read counts as consumed for the group, though nothing decided it
            member.commit(asynchronous=False)
    finally:
        member.close()  # leaves the group: the service gets everything back
    return held, read, samples


@pytest.mark.parametrize(
    "strategy",
    [pytest.param(None, marks=pytest.mark.soak), "cooperative-sticky"],
    ids=["eager", "cooperative"],
)
def test_second_member_joins_and_leaves_nothing_lost(
    bootstrap: str, tmp_path: Path, strategy: str | None
) -> None:
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=PARTITIONS)
    stream = tmp_path / "stream.jsonl"
    with stream.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=DOCUMENTS, seed=41), fh)
    generated = [json.loads(line) for line in stream.read_text().splitlines()]

    kafka = {"partition.assignment.strategy": strategy} if strategy else {}
    svc = ServiceThread(make_config(bootstrap, topics, tmp_path / "index", kafka=kafka)).start()
    feeder = Feeder(bootstrap, topics.input, generated)
    try:
        feeder.start()
        svc.wait_for("stream_dedup_index_documents", 300)
        svc.wait_for("stream_dedup_assigned_partitions", PARTITIONS)
        assert svc.service.index.offsets().keys() == {(topics.input, p) for p in range(PARTITIONS)}
        assigns = svc.metric("stream_dedup_rebalances_total", {"kind": "assign"})
        revokes = svc.metric("stream_dedup_rebalances_total", {"kind": "revoke"})
        produced_at_join = feeder.produced

        held, read, samples = intrude(bootstrap, topics, strategy, svc, hold_s=5.0)
        assert feeder.is_alive() and feeder.produced > produced_at_join  # documents flowed
        assert held and len(held) < PARTITIONS
        assert read > 0  # it read (and committed) documents the service had not decided yet
        assert min(samples) < PARTITIONS  # the service gave partitions up
        if strategy == "cooperative-sticky":
            # incremental: the partitions the service kept were never revoked from it
            assert min(samples) == PARTITIONS - len(held)

        feeder.finish.set()
        feeder.join(timeout=60)
        assert not feeder.is_alive()
        docs = generated[: feeder.produced]
        svc.wait_for("stream_dedup_assigned_partitions", PARTITIONS, timeout_s=30)
        svc.wait_for("stream_dedup_index_documents", len(docs), timeout_s=90)
        assert svc.metric("stream_dedup_rebalances_total", {"kind": "revoke"}) > revokes
        assert svc.metric("stream_dedup_rebalances_total", {"kind": "assign"}) >= assigns + 1
        assert svc.metric("stream_dedup_rebalances_total", {"kind": "lost"}) == 0
        assert svc.service.index.offsets() == {
            (topics.input, p): len(docs[p::PARTITIONS]) for p in range(PARTITIONS)
        }
        assert svc.stop() == 0
    finally:
        svc.service.stop()  # a failed assertion must not leave the loop running
        feeder.finish.set()

    out = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events(out):
        by_id[ev["id"]].append(ev)
    assert set(by_id) == {d["id"] for d in docs}  # nothing lost, the intruder's reads included
    for doc_id, evs in by_id.items():
        assert all(e == evs[0] for e in evs), (doc_id, evs)  # a re-read equals the first event
    assert_equal_to_offline_in_decision_order(by_id, docs, tmp_path / "index", tmp_path)
    duplicates = sum(evs[0]["verdict"] == "duplicate" for evs in by_id.values())
    assert duplicates > 100
    assert read_topic(bootstrap, topics.dlq, idle_s=1.0) == []
    print(f"documents={len(docs)} intruder_partitions={sorted(held)} intruder_read={read}")
