"""The batch-observed histogram exports exactly what the client library's histogram would;
failed Kafka offset commits are counted."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from confluent_kafka import KafkaError, TopicPartition
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from stream_dedup.dedup import BatchStats
from stream_dedup.service.checkpoint import kafka_commit_reporter
from stream_dedup.service.metrics import BulkHistogram, Metrics

BUCKETS = (0, 1, 2, 5, 10, 0.25)


def test_batch_histogram_matches_prometheus_histogram_sample_for_sample() -> None:
    bounds = tuple(sorted(BUCKETS))
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BulkHistogram("x_per_doc", "help", bounds, ours)
    reference = Histogram("x_per_doc", "help", buckets=bounds, registry=theirs)
    rng = np.random.default_rng(7)
    for size in (0, 1, 17, 500):
        # bounds themselves, negatives, values past the last bound
        values = np.concatenate([rng.integers(-1, 14, size), np.asarray(bounds)[: size % 7]])
        batch.observe_many(values.tolist())
        for v in values.tolist():
            reference.observe(v)
    ours_text = generate_latest(ours).decode()
    theirs_text = generate_latest(theirs).decode()
    assert [ln for ln in ours_text.splitlines() if not ln.endswith("_created")] == [
        ln for ln in theirs_text.splitlines() if "_created" not in ln
    ]
    assert ours.get_sample_value("x_per_doc_bucket", {"le": "1.0"}) == theirs.get_sample_value(
        "x_per_doc_bucket", {"le": "1.0"}
    )
    assert (ours.get_sample_value("x_per_doc_count") or 0) > 500


def test_where_documents_were_sketched_is_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    name = "stream_dedup_sketched_documents_total"
    assert registry.get_sample_value(name, {"by": "worker"}) is None  # no source: none
    counts = [5, 2]
    metrics.sketch_source = lambda: (counts[0], counts[1])
    assert registry.get_sample_value(name, {"by": "worker"}) == 5
    counts[:] = [9, 4]
    assert registry.get_sample_value(name, {"by": "worker"}) == 9
    assert registry.get_sample_value(name, {"by": "service"}) == 4


def test_a_shared_index_s_failed_applies_are_read_at_scrape_time() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    name = "stream_dedup_index_apply_failures_total"
    assert registry.get_sample_value(name) is None  # no source: none
    failures = [0]
    metrics.apply_failures_source = lambda: failures[0]
    assert registry.get_sample_value(name) == 0
    failures[0] = 2
    assert registry.get_sample_value(name) == 2


def test_service_metrics_have_no_created_series() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.consumed.inc(3)
    metrics.observe_work([0, 4, 40], [0, 1, 3])
    text = generate_latest(registry).decode()
    assert "_created" not in text
    assert registry.get_sample_value("stream_dedup_messages_consumed_total") == 3
    assert registry.get_sample_value("stream_dedup_candidates_per_document_count") == 3
    assert registry.get_sample_value("stream_dedup_candidates_per_document_sum") == 44
    assert (
        registry.get_sample_value("stream_dedup_candidates_per_document_bucket", {"le": "5.0"}) == 2
    )


def test_kafka_commit_reporter_counts_and_logs_only_failed_commits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    report = kafka_commit_reporter(metrics)
    with caplog.at_level(logging.WARNING, logger="stream_dedup.service.checkpoint"):
        report(None, [TopicPartition("news", 0, 42)])
        assert registry.get_sample_value("stream_dedup_kafka_commit_failures_total") == 0
        assert not caplog.records
        report(KafkaError(KafkaError.REQUEST_TIMED_OUT), [TopicPartition("news", 0, 42)])
    assert registry.get_sample_value("stream_dedup_kafka_commit_failures_total") == 1
    assert [r.getMessage() for r in caplog.records] == [
        "Kafka refused the offset commit; the index holds the true offsets"
    ]


def test_decision_lag_and_reorder_waiting_gauges() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert registry.get_sample_value("stream_dedup_decision_lag_seconds", {"edge": "oldest"}) == 0
    metrics.observe_decided_times([1_000_000, 1_004_000, 1_002_500], now_s=1_010.0)
    assert registry.get_sample_value("stream_dedup_decision_lag_seconds", {"edge": "oldest"}) == 10
    assert registry.get_sample_value("stream_dedup_decision_lag_seconds", {"edge": "newest"}) == 6
    metrics.observe_decided_times([], now_s=2_000.0)  # an empty batch leaves them
    assert registry.get_sample_value("stream_dedup_decision_lag_seconds", {"edge": "newest"}) == 6
    metrics.reorder_waiting.set(42)
    assert registry.get_sample_value("stream_dedup_reorder_waiting_messages") == 42


def test_revisions_are_counted_per_batch() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert registry.get_sample_value("stream_dedup_revisions_total") == 0
    for revisions in (3, 0, 2):
        metrics.observe_batch(0.01, [0.01], (1, 1), BatchStats(revisions=revisions), [], 0.0)
    assert registry.get_sample_value("stream_dedup_revisions_total") == 5
