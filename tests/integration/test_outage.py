"""A broker that goes away mid-stream is waited for; the stream resumes without loss.

The broker is paused (SIGSTOP) for longer than the consumer's session timeout while
documents flow, then continued (SIGCONT). Tansu keeps its data in memory, so pausing is
the outage that keeps the data: connections stay open but nothing answers, as in a network
partition that drops packets, the kind of outage no refused connection announces. The
pause is timed to catch a batch between consuming and committing, so its events wait for
their delivery confirmations through the outage.

The broker is this test's own: pausing the session's broker would stall every other test.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.events import OutRecord
from stream_dedup.service.kafka import EventProducer
from stream_dedup.tools.broker import EmbeddedBroker, free_port
from stream_dedup.tools.generate import StreamSpec, write_jsonl

from .support import (
    Topics,
    events,
    http_get,
    offline_reference,
    process_config,
    read_topic,
    scrape,
    write_toml,
)
from .test_process import start, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DOCUMENTS = 4800
#: Documents per burst of the feeder, one burst a second.
BURST = 300
#: Longer than session.timeout.ms (6 s): the consumer's group session expires meanwhile.
OUTAGE_S = 10.0
#: How long one flush waits before the service logs that deliveries are outstanding.
FLUSH_STEP_S = 1.0
#: Pauses tried until one catches a batch whose events are not yet acknowledged.
ATTEMPTS = 10


WAITING = 'msg="waiting for event deliveries"'


def _logged_after(log: Path, since: float, text: str, within_s: float) -> bool:
    """Whether the service logs a line holding ``text`` after ``since`` within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for line in log.read_text(encoding="utf-8").splitlines():
            stamp = re.match(r"ts=([0-9.]+) ", line)
            if stamp and float(stamp.group(1)) >= since and text in line:
                return True
        time.sleep(0.2)
    return False


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker of this test's own, so that pausing it disturbs no other test."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        pytest.skip("pauses a broker it starts itself; KAFKA_BOOTSTRAP_SERVERS names another")
    own = EmbeddedBroker(log_path=tmp_path / "broker.log")
    own.start()
    try:
        yield own
    finally:
        if own.pid is not None:
            os.kill(own.pid, signal.SIGCONT)  # a paused broker would not stop
        own.stop()


def feed(bootstrap: str, topic: str, docs: list[dict[str, Any]], errors: list[str]) -> None:
    """:data:`BURST` documents at a time, one burst a second, through one producer.

    The bursts make batches of a few hundred documents, so a batch is in flight for long
    enough to be caught by the pause. Records produced during the outage wait in the
    producer's queue and are delivered when the broker is back.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(0, len(docs), BURST):
        for doc in docs[i : i + BURST]:
            producer.produce(topic, json.dumps(doc).encode(), on_delivery=delivered)
        producer.poll(0)
        time.sleep(1.0)
    left = producer.flush(120)
    if left:
        errors.append(f"{left} records undelivered")


@pytest.mark.soak
def test_paused_broker_is_waited_for_and_nothing_is_lost(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    bootstrap = broker.bootstrap
    assert broker.pid is not None
    topics = Topics.fresh()
    topics.create(bootstrap)
    stream = tmp_path / "stream.jsonl"
    with stream.open("w", encoding="utf-8") as fh:
        write_jsonl(StreamSpec(documents=DOCUMENTS, seed=17), fh)
    docs: list[dict[str, Any]] = [json.loads(line) for line in stream.read_text().splitlines()]
    reference = offline_reference(docs, tmp_path)

    port = free_port()
    settings = process_config(bootstrap, topics, tmp_path / "index", port)
    settings["service"]["flush_timeout_s"] = FLUSH_STEP_S
    config = write_toml(tmp_path / "stream-dedup.toml", settings)
    log = tmp_path / "service.log"
    feed_errors: list[str] = []
    feeder = threading.Thread(
        target=feed, args=(bootstrap, topics.input, docs, feed_errors), daemon=True
    )
    proc = start(config, log)
    try:
        feeder.start()
        wait_until(lambda: (scrape(port, "stream_dedup_index_documents") or 0) >= 300, 60, "300")
        for attempt in range(ATTEMPTS):
            # Pause while a batch is between consume and commit: consumed (read first)
            # ahead of indexed (read after) means some consumed message is not committed.
            deadline = time.monotonic() + 20
            while True:
                consumed = scrape(port, "stream_dedup_messages_consumed_total") or 0.0
                indexed = scrape(port, "stream_dedup_index_documents") or 0.0
                if consumed > indexed or time.monotonic() > deadline:
                    break
            os.kill(broker.pid, signal.SIGSTOP)
            paused_at = time.time()
            # The pause can land after the batch's deliveries were confirmed (then nothing
            # waits for the broker): resume, and pause again at the next batch.
            if _logged_after(log, paused_at, WAITING, 2.5 * FLUSH_STEP_S):
                break
            assert attempt < ATTEMPTS - 1 and feeder.is_alive(), "no pause caught a batch"
            os.kill(broker.pid, signal.SIGCONT)
            time.sleep(0.3)
        health: list[int] = []
        while time.time() - paused_at < OUTAGE_S:
            assert proc.poll() is None, "the service exited during the outage"
            health.append(http_get(port, "/healthz")[0])
            time.sleep(0.5)
        indexed_during = scrape(port, "stream_dedup_index_documents")
        os.kill(broker.pid, signal.SIGCONT)
        resumed_at = time.time()

        feeder.join(timeout=120)
        assert not feeder.is_alive() and feed_errors == []
        wait_until(
            lambda: scrape(port, "stream_dedup_index_documents") == DOCUMENTS, 90, "all documents"
        )
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert set(health) == {200}  # alive throughout: nothing would restart it
    assert indexed_during is not None and indexed_during < DOCUMENTS

    lines = log.read_text(encoding="utf-8").splitlines()

    def when(line: str) -> float:
        match = re.match(r"ts=([0-9.]+) ", line)
        assert match, line
        return float(match.group(1))

    outage = [ln for ln in lines if paused_at <= when(ln) <= resumed_at + 5.0]
    # the batch caught by the pause waited for its deliveries, logging every flush step
    waits = [ln for ln in outage if WAITING in ln]
    assert waits and all("level=warning" in ln for ln in waits), outage
    waited = [float(re.findall(r"waited_s=([0-9.]+)", ln)[0]) for ln in waits]
    assert waited == sorted(waited) and waited[-1] >= OUTAGE_S - 2 * FLUSH_STEP_S
    # the consumer's group session expired (librdkafka's warning) and its partition with it
    assert any("level=warning" in ln and "session timed out" in ln for ln in outage), outage
    lost = [i for i, ln in enumerate(lines) if 'msg="partitions lost"' in ln]
    assert lost and "level=warning" in lines[lost[0]]
    assert any('msg="partitions assigned"' in ln for ln in lines[lost[-1] :])  # got it back
    assert sum("msg=started" in ln for ln in lines) == 1  # one run: never crashed
    assert not [ln for ln in lines if "level=error" in ln or "Traceback" in ln]

    out = read_topic(bootstrap, topics.unique) + read_topic(bootstrap, topics.duplicates)
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for ev in events(out):
        by_id[ev["id"]].append(ev)
    assert set(by_id) == {d["id"] for d in docs}  # nothing lost
    duplicates = 0
    for doc_id, evs in by_id.items():
        assert all(e == evs[0] for e in evs), (doc_id, evs)  # re-sent events are identical
        for field in ("verdict", "duplicate_of", "similarity", "cluster_id"):
            assert evs[0][field] == reference[doc_id][field], (doc_id, field)
        duplicates += evs[0]["verdict"] == "duplicate"
    assert duplicates > 100
    assert read_topic(bootstrap, topics.dlq, idle_s=1.0) == []
    print(f"events={len(out)} waits={waited} lost={len(lost)}")


def test_deliveries_that_fail_are_produced_again_with_their_headers(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Records whose delivery times out during an outage are re-sent whole once it ends.

    The producer's ``message.timeout.ms`` is shorter than the pause, so librdkafka reports
    every record queued during it as failed; :meth:`EventProducer.confirm` rebuilds each
    from its delivery report and produces it again after a backoff, until delivered.
    """
    assert broker.pid is not None
    topics = Topics.fresh()
    topics.create(broker.bootstrap)
    producer = EventProducer(
        {"bootstrap.servers": broker.bootstrap, "message.timeout.ms": "1500"},
        BrokerWatch("producer"),
    )
    sent = [
        OutRecord(
            topics.unique,
            f"id-{i}".encode(),
            json.dumps({"n": i}).encode(),
            [("stream-dedup.verdict", b"unique"), ("n", str(i).encode())],
        )
        for i in range(40)
    ]
    os.kill(broker.pid, signal.SIGSTOP)
    threading.Timer(4.0, os.kill, (broker.pid, signal.SIGCONT)).start()
    with caplog.at_level(logging.WARNING, logger="stream_dedup.service.kafka"):
        for rec in sent:
            producer.produce(rec)
        producer.confirm(step_s=0.5, backoff=(0.5, 1.0))
    assert producer.close(5.0) == 0
    failed = [
        r
        for r in caplog.records
        if r.getMessage() == "event deliveries failed, producing them again"
    ]
    assert failed, [r.getMessage() for r in caplog.records]
    got = read_topic(broker.bootstrap, topics.unique, expected=len(sent))
    received = {(m.key(), m.value(), tuple(m.headers() or [])) for m in got}
    assert received == {(r.key, r.value, tuple(r.headers)) for r in sent}
