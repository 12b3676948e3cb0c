"""The commit protocol: how a batch becomes durable. Implemented here and nowhere else.

For every batch, in this order:

1. **Produce** the batch's records (one event per decided document, one dead letter per
   rejected message) asynchronously.
2. **Flush and confirm**: wait until the broker has acknowledged every record
   (``acks=all``). Failed deliveries are produced again; a broker outage is waited out
   with backoff. Nothing below happens until every record is confirmed.
3. **One RocksDB WriteBatch** (:meth:`Deduplicator.commit`): the batch's index updates,
   per-document verdict records, counters *and* the next input offset of every
   (topic, partition) the batch consumed, dead-lettered messages included. This write is
   the commit point.
4. **Commit the offsets to Kafka** so that standard lag tools see progress. Kafka's
   offsets are informational: a failure here is logged and counted, not fatal.

On partition assignment the service seeks to the offsets stored in the index (step 3),
not to Kafka's. So a crash anywhere, ``kill -9`` included:

* before step 3: the index has neither the batch's records nor its offsets; the batch is
  consumed again and decided again over the same committed index. Deciding is
  deterministic, so the replayed events equal the first emission (same verdict,
  ``duplicate_of``, similarity, cluster). Consumers see at most one batch twice, with
  identical content, keyed by document id.
* after step 3: the index resumes after the batch; nothing is replayed.

Nothing is lost (an offset is never stored before its events are confirmed) and nothing
is decided twice differently (verdicts and offsets are stored atomically).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from stream_dedup.dedup import BatchResult, BatchStats, Deduplicator
from stream_dedup.events import OutRecord
from stream_dedup.kafka import EventProducer
from stream_dedup.metrics import Metrics
from stream_dedup.service_config import ServiceSection

log = logging.getLogger("stream_dedup.checkpoint")

Offsets = Mapping[tuple[str, int], int]
#: Called when the client rejects a record outright: returns a replacement (a dead letter).
Rejected = Callable[[int, Exception], OutRecord | None]


def empty_result() -> BatchResult:
    """A batch with nothing to decide (every message was dead-lettered)."""
    return BatchResult([], {}, {}, BatchStats())


class Checkpoint:
    """Runs the commit protocol (see the module docstring) for one batch at a time."""

    def __init__(
        self,
        producer: EventProducer,
        dedup: Deduplicator,
        consumer: Consumer,
        metrics: Metrics,
        settings: ServiceSection,
        keep_waiting: Callable[[], bool],
    ) -> None:
        self._producer = producer
        self._dedup = dedup
        self._consumer = consumer
        self._metrics = metrics
        self._settings = settings
        self._keep_waiting = keep_waiting

    def commit(
        self, records: list[OutRecord], result: BatchResult, offsets: Offsets, rejected: Rejected
    ) -> None:
        """Produce, confirm, write the index, commit to Kafka: in that order."""
        started = time.perf_counter()
        for i, rec in enumerate(records):  # 1. produce
            try:
                self._producer.produce(rec)
            except KafkaException as exc:
                replacement = rejected(i, exc)
                if replacement is not None:
                    self._producer.produce(replacement)
        self._producer.confirm(  # 2. flush and confirm every delivery
            self._settings.flush_timeout_s,
            (self._settings.backoff_initial_s, self._settings.backoff_max_s),
            give_up=lambda: not self._keep_waiting(),
        )
        self._dedup.commit(result, offsets)  # 3. one WriteBatch: index + verdicts + offsets
        self._commit_kafka(offsets)  # 4. offsets to Kafka, for lag tools
        self._metrics.commits.inc()
        self._metrics.commit_duration.observe(time.perf_counter() - started)

    def _commit_kafka(self, offsets: Offsets) -> None:
        if not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            self._metrics.kafka_commit_failures.inc()
            log.warning(
                "Kafka refused the offset commit; the index holds the true offsets",
                extra={
                    "fields": {
                        "error": str(exc),
                        "action": "none needed; lag tools catch up at the next commit",
                    }
                },
            )
