"""An event the broker refuses for good becomes a dead letter; the partition moves on.

Tansu does not enforce a topic's ``max.message.bytes``, so the refusal comes from the
service's own producer (``producer.message.max.bytes``), as ``MSG_SIZE_TOO_LARGE``: the
same error a broker returns for a record over its limit. Two documents make events over
it (``output.include_document`` copies the document into its event): one with a long id
(repeated in its event, once in its message: its dead letter fits) and one with a huge
text (its dead letter does not fit either: it goes without its value).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.events import DLQ_OFFSET, DLQ_REASON, DLQ_STAGE, OutRecord
from stream_dedup.service.kafka import EventProducer
from stream_dedup.service.refusals import HEADER_VALUE_DROPPED

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

LIMIT = 4000
LONG_ID = "L" * 1000  # four times in its event (key, id, cluster_id, header): over LIMIT


def headers_of(msg: Any) -> dict[str, bytes]:
    return {k: v for k, v in (msg.headers() or [])}


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_refused_events_become_dead_letters_and_the_partition_moves_on(
    bootstrap: str, topics: Topics, tmp_path: Path, delivery: str
) -> None:
    docs = kijiji_documents(40)
    long_id = {"id": LONG_ID, "title": "a short advert whose id is very long indeed"}
    huge = {"id": "huge", "title": " ".join(f"word{i}" for i in range(1200))}  # ~9 KB
    stream = [*docs[:15], long_id, *docs[15:30], huge, *docs[30:]]
    reference = offline_reference(stream, tmp_path)
    produce_json(bootstrap, topics.input, stream)
    config = make_config(
        bootstrap,
        topics,
        tmp_path / "index",
        batch={"max_messages": 10},
        output={"include_document": True},
        service={"delivery": delivery},
        kafka={"producer.message.max.bytes": str(LIMIT)},
    )
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_commits_total", 5, timeout_s=60)
    svc.wait_for("stream_dedup_messages_consumed_total", len(stream))
    assert svc.stop() == 0

    assert svc.metric("stream_dedup_refused_records_total", {"kind": "event"}) == 2
    assert svc.metric("stream_dedup_refused_records_total", {"kind": "dead_letter"}) == 1
    assert svc.metric("stream_dedup_dead_letters_total", {"reason": "refused"}) == 2

    got = events(read_topic(bootstrap, topics.unique, 1, timeout_s=10))
    got += events(read_topic(bootstrap, topics.duplicates, 0, timeout_s=10))
    by_id = {ev["id"]: ev for ev in got}
    assert set(by_id) == {d["id"] for d in docs}  # every other document, none lost
    for doc_id, ev in by_id.items():
        fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
        assert {k: ev[k] for k in fields} == {k: reference[doc_id][k] for k in fields}

    dead = read_topic(bootstrap, topics.dlq, 2, timeout_s=10, idle_s=1)
    assert len(dead) == 2
    first, second = sorted(dead, key=lambda m: int(headers_of(m)[DLQ_OFFSET]))
    for msg, offset in ((first, 15), (second, 31)):
        h = headers_of(msg)
        assert (h[DLQ_REASON], h[DLQ_STAGE], int(h[DLQ_OFFSET])) == (b"refused", b"produce", offset)
    assert json.loads(first.value() or b"") == long_id  # the message itself
    assert HEADER_VALUE_DROPPED not in headers_of(first)
    assert second.value() is None
    dropped = headers_of(second)[HEADER_VALUE_DROPPED].decode()
    assert dropped.startswith(f"{len(json.dumps(huge))} bytes dropped: ")
    assert "too large" in dropped.lower()


def test_a_refusal_in_a_delivery_report_is_replaced_and_the_rest_retried(
    bootstrap: str, topics: Topics
) -> None:
    """A broker that enforces its limits refuses in the delivery report, not in
    ``produce``; Tansu enforces none, so the report of one record is the broker's
    refusal, added to the real ones (the others really are delivered)."""
    producer = EventProducer({"bootstrap.servers": bootstrap}, BrokerWatch("producer"))
    sent = [OutRecord(topics.unique, f"id-{i}".encode(), b"{}", []) for i in range(5)]
    replaced: list[tuple[OutRecord, str]] = []

    def refused(rec: OutRecord, err: KafkaError) -> OutRecord:
        replaced.append((rec, err.str()))
        return OutRecord(topics.dlq, rec.key, rec.value, [(DLQ_REASON, b"refused")])

    producer.begin(refused)
    for rec in sent:
        producer.produce(rec)
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "over the topic's max.message.bytes")
    producer._failed.append(((topics.unique, b"id-3", b"{}"), too_large))
    producer.confirm(5.0, (0.01, 0.02))
    assert [(rec.key, error) for rec, error in replaced] == [
        (b"id-3", "over the topic's max.message.bytes")
    ]
    assert producer.close(5) == 0
    assert len(read_topic(bootstrap, topics.unique, 5, timeout_s=10, idle_s=0.5)) == 5
    dead = read_topic(bootstrap, topics.dlq, 1, timeout_s=10, idle_s=0.5)
    assert [(m.key(), headers_of(m)[DLQ_REASON]) for m in dead] == [(b"id-3", b"refused")]
