"""Prometheus metrics of the service, on a registry the caller owns.

:class:`Metrics` registers everything on the :class:`CollectorRegistry` it is given (tests
pass their own and read values with ``registry.get_sample_value``). Names follow
Prometheus practice: prefix ``stream_dedup_``, counters end in ``_total``, base units
(seconds, bytes). Labels are bounded and created up front at zero so that dashboards and
alerts see a series before the first event. Values that are only known at scrape time
(index size, consumer lag) come from a custom collector (:mod:`.scrape_metrics`) instead of
being pushed from the hot loop. The per-document histograms are :class:`BulkHistogram`: one
numpy pass per batch instead of a locked ``observe`` per document. The ``*_created`` series
of the client library are not exported (:func:`prometheus_client.disable_created_metrics`):
they double the series count and no query here uses them.

==============================================  =========  =================================
name                                            type       meaning
==============================================  =========  =================================
stream_dedup_messages_consumed_total            counter    input messages taken from Kafka
stream_dedup_verdicts_total{verdict}            counter    events emitted, unique/duplicate
stream_dedup_dead_letters_total{reason}         counter    messages sent to the DLQ
stream_dedup_refused_records_total{kind}        counter    records refused for good, replaced
stream_dedup_replayed_documents_total           counter    ids decided before (stored verdict)
stream_dedup_revisions_total                    counter    ids decided again on a new text
stream_dedup_excerpts_total                     counter    duplicates found as excerpts
stream_dedup_truncated_lookups_total            counter    lookups cut at max_candidates
stream_dedup_time_field_missing_total           counter    input.time_field missing/unreadable
stream_dedup_untimed_documents_total            counter    documents decided with no time
stream_dedup_batch_duration_seconds             histogram  decide + checkpoint of one batch
stream_dedup_document_latency_seconds           histogram  consumed -> checkpointed, per doc
stream_dedup_batch_size_messages                histogram  messages per batch
stream_dedup_candidates_per_document            histogram  band candidates per document
stream_dedup_verifications_per_document         histogram  candidates verified per document
stream_dedup_commits_total                      counter    completed checkpoints
stream_dedup_last_commit_timestamp_seconds      gauge      Unix time of the last checkpoint
stream_dedup_commit_duration_seconds            histogram  one checkpoint (flush, index, kafka)
stream_dedup_index_lease_wait_seconds           histogram  waits for the shared index's lease
stream_dedup_index_lease_held_seconds           histogram  one batch decided and stored in it
stream_dedup_redecided_documents_total          counter    decided before the lease, again in it
stream_dedup_index_up                           gauge      shared index: 0 in a Redis outage
stream_dedup_index_retries_total                counter    index steps retried in an outage
stream_dedup_index_apply_failures_total         counter    shared index: writes left unapplied
stream_dedup_kafka_commit_failures_total        counter    offset commits Kafka refused
stream_dedup_sketch_worker_failures_total       counter    batches sketched in process instead
stream_dedup_sketched_documents_total{by}       counter    sketched by the worker / service
stream_dedup_rebalances_total{kind}             counter    partition assign / revoke
stream_dedup_assigned_partitions                gauge      partitions held now
stream_dedup_index_documents                    gauge      documents decided in the index
stream_dedup_index_size_bytes                   gauge      index size on disk
stream_dedup_index_filter_bytes                 gauge      memory of the index's key filters
stream_dedup_index_held_documents               gauge      documents held (indexed, not expired)
stream_dedup_index_evicted_documents_total      counter    documents expired by retention
stream_dedup_index_oldest_document_timestamp_s. gauge      Unix time of the oldest held document
stream_dedup_index_clock_timestamp_seconds      gauge      the stream's clock (latest doc time)
stream_dedup_index_epochs                       gauge      live epochs (retention slices)
stream_dedup_consumer_lag_messages{topic,part.}  gauge      lag from librdkafka statistics
stream_dedup_decision_lag_seconds{edge}         gauge      now - time of last batch's oldest/newest
stream_dedup_reorder_waiting_messages           gauge      consumed, held by the time-ordered merge
stream_dedup_group_order_wait_seconds_total     counter    waits for the group's low watermark
stream_dedup_group_decided_ahead_batches_total  counter    decided while held back: used/dropped
stream_dedup_group_end_looks_total{outcome}     counter    others' ends looked at: at_end/behind
stream_dedup_transactions_total{outcome}        counter    exactly-once: committed / aborted
stream_dedup_check_requests_total{outcome}      counter    POST /check, /check/batch answered
stream_dedup_check_duration_seconds             histogram  one check request, read to answer
stream_dedup_check_follow_seconds               histogram  check process: one follow of the index
==============================================  =========  =================================

With them the client library's own ``process_*`` (the service process's CPU seconds,
resident memory, open files, start time; on Linux) and ``python_info``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from stream_dedup.errors import DecodeError
from stream_dedup.index.store import IndexStats
from stream_dedup.models import VerdictKind
from stream_dedup.service.bulk_histogram import BulkHistogram
from stream_dedup.service.check_metrics import CheckMetrics, CheckProcessMetrics
from stream_dedup.service.scrape_metrics import PREFIX, ScrapeCollector

if TYPE_CHECKING:
    from stream_dedup.dedup import BatchStats

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_COUNT_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_BATCH_BUCKETS = (1, 10, 50, 100, 500, 1000, 2000, 5000, 10000)

__all__ = ["PREFIX", "BulkHistogram", "Metrics"]


class Metrics:
    """Every metric of the service, registered on ``registry``.

    The constructor registers them group by group, one method per group, in the order of
    the table in the module docstring; the scrape-time collector comes last.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        #: The index's stats and key-filter bytes, read at scrape time.
        self.index_source: Callable[[], tuple[IndexStats, int]] | None = None
        #: Documents sketched by the sketch worker and in the service process, read at
        #: scrape time.
        self.sketch_source: Callable[[], tuple[int, int]] | None = None
        #: A shared index's writes whose apply failed after the commit point, read at
        #: scrape time.
        self.apply_failures_source: Callable[[], int] | None = None
        self._lag: dict[tuple[str, int], int] = {}
        self._lag_lock = threading.Lock()
        self._register_messages(registry)
        self._register_lease(registry)
        self._register_batches(registry)
        self._register_checkpoints(registry)
        self._register_partitions(registry)
        self._register_transactions(registry)
        self.checks = CheckMetrics(registry)
        self.check_process = CheckProcessMetrics(registry)
        registry.register(ScrapeCollector(self))
        # The service process's CPU, memory and open files (process_*; Linux only, as
        # they read /proc) and the Python version (python_info), as the client library's
        # default registry has them; the sketch worker's process is not among them.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)

    def _register_messages(self, r: CollectorRegistry) -> None:
        """What became of the input messages: consumed, verdicts, dead letters, replays,
        lookups cut at ``max_candidates``, and documents without a time of their own."""
        p = PREFIX
        self.consumed = Counter(f"{p}_messages_consumed", "Input messages consumed.", registry=r)
        self.verdicts = Counter(
            f"{p}_verdicts", "Events emitted, by verdict.", ["verdict"], registry=r
        )
        for kind in VerdictKind:
            self.verdicts.labels(kind.value)
        self.dead_letters = Counter(
            f"{p}_dead_letters", "Messages sent to the dead-letter topic.", ["reason"], registry=r
        )
        for reason in (*DecodeError.REASONS, "refused"):
            self.dead_letters.labels(reason)
        self.refused = Counter(
            f"{p}_refused_records",
            "Output records the broker refused for good, by kind: an event (replaced by its "
            "message's dead letter) or a dead letter (sent again without its value).",
            ["kind"],
            registry=r,
        )
        for refused in ("event", "dead_letter"):
            self.refused.labels(refused)
        self.replayed = Counter(
            f"{p}_replayed_documents", "Documents whose id was already decided.", registry=r
        )
        self.revisions = Counter(
            f"{p}_revisions",
            "Documents decided as a new revision: an id seen before with another text.",
            registry=r,
        )
        self.truncated = Counter(
            f"{p}_truncated_lookups", "Lookups cut at max_candidates.", registry=r
        )
        self.excerpts = Counter(f"{p}_excerpts", "Duplicates found as excerpts.", registry=r)
        self.time_field_missing = Counter(
            f"{p}_time_field_missing",
            "Documents whose input.time_field was missing or unreadable (their time is the "
            "message timestamp).",
            registry=r,
        )
        self.untimed = Counter(
            f"{p}_untimed_documents",
            "Documents decided with no time (no time field, no message timestamp): they take "
            "the stream's clock as it stands.",
            registry=r,
        )

    def _register_lease(self, r: CollectorRegistry) -> None:
        """The shared index's lease (Redis backend): waiting for it, and holding it; and
        Redis outages ridden out (``service/index_outage.py``)."""
        p = PREFIX
        self.index_up = Gauge(
            f"{p}_index_up",
            "0 while the shared index's Redis is unreachable and the service retries; 1 "
            "otherwise (always 1 for an index of one instance).",
            registry=r,
        )
        self.index_up.set(1)
        self.index_retries = Counter(
            f"{p}_index_retries",
            "Steps on the shared index (deciding and storing a batch, storing offsets) run "
            "again because Redis was unreachable.",
            registry=r,
        )
        self.lease_wait = Histogram(
            f"{p}_index_lease_wait_seconds",
            "Waits for the shared index's lease (Redis backend) before deciding a batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.lease_held = Histogram(
            f"{p}_index_lease_held_seconds",
            "Deciding and storing one batch inside the shared index's lease: the part of "
            "the work that instances of one group do one at a time.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.redecided = Counter(
            f"{p}_redecided_documents",
            "Documents decided before the shared index's lease and again inside it, because "
            "another instance wrote near them meanwhile: the lease's work that grows with "
            "contention.",
            registry=r,
        )

    def _register_batches(self, r: CollectorRegistry) -> None:
        """One batch: its duration, its documents' latency, its size, and the candidates
        and verifications per document."""
        p = PREFIX
        self.batch_duration = Histogram(
            f"{p}_batch_duration_seconds",
            "Decide and checkpoint of one batch.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.document_latency = BulkHistogram(
            f"{p}_document_latency_seconds",
            "From a message being consumed to its batch being checkpointed.",
            _LATENCY_BUCKETS,
            r,
        )
        self.batch_size = Histogram(
            f"{p}_batch_size_messages", "Messages per batch.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.candidates = BulkHistogram(
            f"{p}_candidates_per_document", "Band candidates found per document.", _COUNT_BUCKETS, r
        )
        self.verifications = BulkHistogram(
            f"{p}_verifications_per_document",
            "Candidates verified per document.",
            _COUNT_BUCKETS,
            r,
        )

    def _register_checkpoints(self, r: CollectorRegistry) -> None:
        """Checkpoints, and what can fail around them: Kafka offset commits and the sketch
        worker."""
        p = PREFIX
        self.commits = Counter(f"{p}_commits", "Completed checkpoints.", registry=r)
        self.last_commit = Gauge(
            f"{p}_last_commit_timestamp_seconds",
            "Unix time of the last completed checkpoint (alert when it stops moving under lag).",
            registry=r,
        )
        self.commit_duration = Histogram(
            f"{p}_commit_duration_seconds",
            "One checkpoint: flush and confirm, index write, Kafka offset commit.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kafka_commit_failures = Counter(
            f"{p}_kafka_commit_failures", "Offset commits that Kafka refused.", registry=r
        )
        self.sketch_worker_failures = Counter(
            f"{p}_sketch_worker_failures",
            "Batches the sketch worker failed on (then sketched in the service process).",
            registry=r,
        )

    def _register_partitions(self, r: CollectorRegistry) -> None:
        """The partitions held, and how far deciding trails the documents' time."""
        p = PREFIX
        self.rebalances = Counter(
            f"{p}_rebalances", "Partition assignments and revocations.", ["kind"], registry=r
        )
        for change in ("assign", "revoke", "lost"):
            self.rebalances.labels(change)
        self.assigned = Gauge(f"{p}_assigned_partitions", "Partitions held now.", registry=r)
        self.decision_lag = Gauge(
            f"{p}_decision_lag_seconds",
            "Now minus the document time of the last batch's oldest / newest document "
            "(how far deciding trails the documents' time).",
            ["edge"],
            registry=r,
        )
        for edge in ("oldest", "newest"):
            self.decision_lag.labels(edge)
        self.reorder_waiting = Gauge(
            f"{p}_reorder_waiting_messages",
            "Messages consumed and held by the time-ordered merge of partitions.",
            registry=r,
        )
        self.group_order_wait = Counter(
            f"{p}_group_order_wait_seconds",
            "Seconds spent waiting for the consumer group's low watermark on a shared index "
            "(other instances' partitions with earlier records; docs/group-order.md).",
            registry=r,
        )
        self.decided_ahead = Counter(
            f"{p}_group_decided_ahead_batches",
            "Batches decided while the group's order held them back: used (the release was "
            "that batch) or dropped (it was not; decided again when released).",
            ["outcome"],
            registry=r,
        )
        for outcome in ("used", "dropped"):
            self.decided_ahead.labels(outcome)
        self.end_looks = Counter(
            f"{p}_group_end_looks",
            "Looks at the broker's end offsets of other instances' partitions published as "
            "at their end: at_end (nothing there since), or behind (records there their "
            "owner had not taken yet: this instance waited for them).",
            ["outcome"],
            registry=r,
        )
        for outcome in ("at_end", "behind"):
            self.end_looks.labels(outcome)

    def _register_transactions(self, r: CollectorRegistry) -> None:
        """Exactly-once delivery: Kafka transactions ended, by outcome."""
        p = PREFIX
        self.transactions = Counter(
            f"{p}_transactions",
            "Kafka transactions ended (exactly-once delivery), by outcome.",
            ["outcome"],
            registry=r,
        )
        for outcome in ("committed", "aborted"):
            self.transactions.labels(outcome)

    def observe_batch(
        self,
        duration_s: float,
        latencies_s: Sequence[float],
        verdicts: tuple[int, int],
        stats: BatchStats,
        times_ms: Sequence[int],
        now_s: float,
    ) -> None:
        """A committed batch: how long it took, each document's latency, its (duplicate,
        unique) verdicts, the deciding work, and its documents' times (epoch ms)."""
        self.batch_duration.observe(duration_s)
        self.document_latency.observe_many(latencies_s)
        self.verdicts.labels("duplicate").inc(verdicts[0])
        self.verdicts.labels("unique").inc(verdicts[1])
        self.observe_work(stats.candidates, stats.verifications)
        self.observe_decided_times(times_ms, now_s)
        self.replayed.inc(stats.replayed)
        self.revisions.inc(stats.revisions)
        self.excerpts.inc(stats.excerpts)
        self.truncated.inc(stats.truncated_lookups)

    def observe_work(self, candidates: Sequence[int], verifications: Sequence[int]) -> None:
        """Per-document candidate and verification counts of one batch."""
        self.candidates.observe_many(candidates)
        self.verifications.observe_many(verifications)

    def observe_decided_times(self, times_ms: Sequence[int], now_s: float) -> None:
        """The decision lag of one batch, from its documents' times (epoch ms)."""
        if times_ms:
            self.decision_lag.labels("oldest").set(now_s - min(times_ms) / 1000.0)
            self.decision_lag.labels("newest").set(now_s - max(times_ms) / 1000.0)

    def on_statistics(self, raw: str) -> None:
        """librdkafka ``stats_cb``: keep the consumer lag of every partition we consume."""
        try:
            stats = json.loads(raw)
        except ValueError:
            return
        lag: dict[tuple[str, int], int] = {}
        for topic, tstats in (stats.get("topics") or {}).items():
            for pid, pstats in (tstats.get("partitions") or {}).items():
                value = pstats.get("consumer_lag", -1)
                if int(pid) >= 0 and value is not None and value >= 0:
                    lag[(topic, int(pid))] = int(value)
        with self._lag_lock:
            self._lag = lag

    def lag(self) -> dict[tuple[str, int], int]:
        with self._lag_lock:
            return dict(self._lag)
