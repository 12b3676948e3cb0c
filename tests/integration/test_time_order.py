"""Verdicts follow document time through a 3-partition topic, from a backlog and live.

A stream with known near-duplicates (the Kijiji ads, and the ``generate`` wire stream) is
produced in time order, keyed by id (so it spreads over 3 partitions) with explicit
increasing message timestamps. The service's verdicts must equal the offline command's
on the time-ordered file, and their quality against exact ground truth (brute force,
:mod:`tests.quality.conftest`) must stay that of a single ordered stream.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from stream_dedup.cli.app import main as cli_main
from tests.quality.conftest import Corpus, GroundTruth, kijiji_corpus, news_corpus, shared_truth

from .support import ServiceThread, Topics, events, make_config, read_topic

pytestmark = pytest.mark.broker

PARTITIONS = 3
#: Documents per second while the service runs (the live case).
LIVE_RATE = 400
BASE_MS = 1_795_000_000_000


@pytest.fixture(scope="module")
def truths(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, GroundTruth]:
    return {
        c.name: shared_truth(c, tmp_path_factory, worker_id)
        for c in (kijiji_corpus(), news_corpus())
    }


def offline_verdicts(corpus: Corpus, work: Path) -> list[dict[str, Any]]:
    """The ``dedup`` command's verdicts on the time-ordered file, in stream order."""
    source, target = work / "input.jsonl", work / "verdicts.jsonl"
    source.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus.records),
        encoding="utf-8",
    )
    argv = ["dedup", str(source), "-o", str(target), "-q"]
    assert cli_main([*argv, "--content-fields", corpus.content_fields]) == 0
    lines = target.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def produce_timed(
    bootstrap: str, topic: str, corpus: Corpus, rate: float | None, field: bool = False
) -> None:
    """Every record keyed by id, timestamps increasing in stream order; at ``rate`` per
    second (None: as fast as possible). With ``field`` the time is the record's
    ``published_at`` (ISO-8601) and the message timestamps run backwards."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    errors: list[Any] = []
    started = time.monotonic()
    for n, record in enumerate(corpus.records):
        if rate is not None:
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        stamp = BASE_MS + 10 * n
        if field:
            published = datetime.fromtimestamp(stamp / 1000, UTC).isoformat()
            record = {**record, "published_at": published}
            stamp = BASE_MS - 10 * n
        while True:
            try:
                producer.produce(
                    topic,
                    key=str(record["id"]).encode(),
                    value=json.dumps(record, ensure_ascii=False).encode(),
                    timestamp=stamp,
                    on_delivery=lambda err, _m: errors.append(err) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors


def run_and_compare(
    bootstrap: str, tmp_path: Path, truth: GroundTruth, live: bool, field: bool = False
) -> None:
    corpus = truth.corpus
    reference = offline_verdicts(corpus, tmp_path)
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=PARTITIONS)
    config = make_config(
        bootstrap,
        topics,
        tmp_path / "index",
        input={
            "content_fields": corpus.content_fields.split(","),
            "time_field": "published_at" if field else "",
        },
    )
    if not live:
        produce_timed(bootstrap, topics.input, corpus, None, field)
    svc = ServiceThread(config).start()
    try:
        if live:
            svc.wait_for("stream_dedup_assigned_partitions", PARTITIONS)
            feeder = threading.Thread(
                target=produce_timed, args=(bootstrap, topics.input, corpus, LIVE_RATE)
            )
            feeder.start()
            feeder.join()
        svc.wait_for("stream_dedup_messages_consumed_total", len(corpus.records), 60)
        lag = svc.metric("stream_dedup_decision_lag_seconds", {"edge": "newest"})
        assert lag > 0  # documents' times are in the past of the test's clock
    finally:
        assert svc.stop() == 0
    assert svc.metric("stream_dedup_reorder_waiting_messages") == 0

    out = read_topic(bootstrap, topics.unique, 1, timeout_s=20) + read_topic(
        bootstrap, topics.duplicates, 1, timeout_s=20
    )
    got = {e["id"]: e for e in events(out)}
    assert len(got) == len(corpus.records)
    assert {e["partition"] for e in got.values()} == set(range(PARTITIONS))
    fields = ("verdict", "duplicate_of")
    agree = sum(all(got[r["id"]][k] == r[k] for k in fields) for r in reference) / len(reference)
    in_order = [got[i] for i in corpus.ids]
    quality = truth.quality(in_order, "service")
    f1 = 2 * quality.precision * quality.recall / (quality.precision + quality.recall)
    mode = ("live" if live else "backlog") + (" by published_at" if field else "")
    print(f"{corpus.name}/{mode}: agreement {agree:.4%}, {quality}, F1 {f1:.4f}")
    assert agree >= 0.995, (mode, agree)
    assert f1 >= 0.99, (mode, str(quality), f1)


@pytest.mark.parametrize("corpus", ["kijiji", "news"])
def test_backlog_over_three_partitions_is_decided_in_time_order(
    bootstrap: str, tmp_path: Path, truths: dict[str, GroundTruth], corpus: str
) -> None:
    run_and_compare(bootstrap, tmp_path, truths[corpus], live=False)


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["kijiji", "news"])
def test_live_stream_over_three_partitions_is_decided_in_time_order(
    bootstrap: str, tmp_path: Path, truths: dict[str, GroundTruth], corpus: str
) -> None:
    run_and_compare(bootstrap, tmp_path, truths[corpus], live=True)


def test_a_json_time_field_orders_a_backlog_against_its_message_timestamps(
    bootstrap: str, tmp_path: Path, truths: dict[str, GroundTruth]
) -> None:
    """``input.time_field``: ISO-8601 ``published_at`` in stream order, while the message
    timestamps run backwards (by them alone the stream would be decided reversed)."""
    run_and_compare(bootstrap, tmp_path, truths["kijiji"], live=False, field=True)
