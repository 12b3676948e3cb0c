"""The commit protocol: how a batch becomes durable. Implemented here and nowhere else.

A batch is a set of input ranges, ``(topic, partition) -> (first offset, last offset + 1)``,
and it is always decided in *time order* (:func:`stream_dedup.service.ordering.time_order`):
each partition's records in offset order, merged by the (time, topic, partition) of their
heads, where a record's time is its message timestamp or ``input.time_field``. When times
do not decrease along a partition this is the order of (time, topic, partition, offset).
The order depends only on the records inside the ranges (their times), never on how the
consumer happened to interleave partitions or how fast they were fetched. Which records
form a batch is chosen by the partition merge (:class:`~stream_dedup.service.ordering.
PartitionMerge`), which releases them across partitions in time order, so a batch is a
time-ordered run that is still one contiguous offset range per partition. For every
batch, in this order:

1. **Record the batch intent**: the batch's ranges, in one small atomic index write
   (:meth:`DedupIndex.write_intent`; fsynced only with ``index.sync``).
2. **Produce** the batch's records (one event per decided document, one dead letter per
   rejected message) asynchronously.
3. **Flush and confirm**: wait until the broker has acknowledged every record
   (``acks=all``). Failed deliveries are produced again; a broker outage is waited out
   with backoff. Nothing below happens until every record is confirmed.
4. **One RocksDB WriteBatch** (:meth:`Deduplicator.prepare`, then
   :meth:`DedupIndex.apply`): the batch's index updates, per-document verdict records,
   counters, the next input offset of every (topic, partition) the batch consumed
   (dead-lettered messages included) *and* the cleared intent. Applying it is the commit
   point. It is built (keys ordered and copied into the ``WriteBatch``: most of its cost)
   while step 3 waits for the broker, and applied only after step 3 confirmed every record.
5. **Commit the offsets to Kafka** so that standard lag tools see progress, without
   waiting for the broker's answer (the consumer's commit callback,
   :func:`kafka_commit_reporter`, reports it while the loop goes on). Kafka's offsets are
   informational: a failure here is logged and counted, not fatal.

On partition assignment the service seeks to the offsets stored in the index (step 4),
not to Kafka's; a partition named by a pending intent is sought to the intent's start.
So a crash anywhere, ``kill -9`` included:

* before step 1 completes: nothing of the batch left the process; it is consumed again
  as an ordinary batch.
* between steps 1 and 4: the index holds the intent but neither the batch's records nor
  its offsets. At start-up the first batch is exactly the intent's ranges (the service
  collects until every intent partition reaches its end offset and holds anything beyond
  for the next batch), decided in time order over the same committed index: the order
  is computed from the ranges' records alone, so it is the first emission's.
  Deciding is deterministic, so the replayed events equal the first emission (same
  verdict, ``duplicate_of``, similarity, cluster), however many partitions there are.
  Consumers see at most one batch twice, with identical content, keyed by document id.
* after step 4: the index resumes after the batch; nothing is replayed.

A document that arrives after a later copy was decided (its partition lagged beyond
``batch.max_idle_ms``, or its time is earlier than records already released) is decided
when it arrives, against everything decided before it: the original becomes the
duplicate of the copy. That is deterministic given the decision order, which the index
records and a replay keeps.

Nothing is lost (an offset is never stored before its events are confirmed) and nothing
is decided twice differently (the replayed batch is the announced batch, and verdicts,
offsets and the cleared intent are stored atomically).

**Exactly-once** (``service.delivery = "exactly-once"``, :mod:`.transactions`). Steps 2,
3 and 5 become one Kafka transaction, and the index write follows its commit:

1. the batch intent, as above;
2. ``begin_transaction``; produce the batch's events and dead letters;
3. ``send_offsets_to_transaction`` with the batch's next input offsets, then
   ``commit_transaction``: the records become visible to ``read_committed`` readers and
   the group's committed offsets move past the batch, atomically. An abortable error
   aborts the transaction and produces the batch again in a new one;
4. the index ``WriteBatch``, as above (built while the transaction commits).

At start-up ``init_transactions`` fences an older instance with the same
``transactional.id`` and completes or aborts the transaction it left; then, if the index
holds an intent, the group's committed offsets (read as stable offsets) say whether that
intent's transaction committed (:func:`~stream_dedup.service.transactions.
intent_delivered`): the offsets move only inside the service's transactions. A crash:

* before step 1 completes: nothing of the batch left the process.
* between steps 1 and 3's commit: the transaction is open or aborted, never committed;
  ``init_transactions`` aborts it, so a ``read_committed`` reader never sees its
  records. The group's offsets are still before the batch: the batch is replayed, as in
  the at-least-once case, in a new transaction; its verdicts are the first decision's.
* after the commit, before step 4: Kafka has the batch's records and offsets, the index
  only the intent. The group's offsets are past the intent, so the batch is collected
  and decided again (the same verdicts) and only its index write is applied: nothing is
  produced again.
* after step 4: nothing is replayed.

So a ``read_committed`` reader sees every event and dead letter exactly once, and the
index never holds a document whose event was aborted: it is written only after the
transaction committed. An at-least-once intent found in exactly-once mode (the mode was
changed) has group offsets before it and is replayed in a transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from stream_dedup.dedup import BatchResult, BatchStats, Deduplicator
from stream_dedup.index.backend import NO_ORDERED_PUTS
from stream_dedup.index.store import Ranges
from stream_dedup.logs import fields
from stream_dedup.service.config import ServiceSection
from stream_dedup.service.events import OutRecord
from stream_dedup.service.kafka import EventProducer
from stream_dedup.service.metrics import Metrics

log = logging.getLogger("stream_dedup.service.checkpoint")

Offsets = Mapping[tuple[str, int], int]
#: Called when the client rejects a record outright: returns a replacement (a dead letter).
Rejected = Callable[[int, Exception], OutRecord | None]


def position(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed, error-free message."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def canonical_order(msgs: list[Message]) -> list[Message]:
    """The batch sorted by (topic, partition, offset): the tie-break of time order.

    Batches are decided in :func:`stream_dedup.service.ordering.time_order`; this order
    (a function of the batch alone, like that one) is what ties of time fall back to.
    """
    return sorted(msgs, key=position)


def batch_ranges(msgs: list[Message]) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (first offset, last offset + 1) of a non-empty batch."""
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for msg in msgs:
        topic, partition, offset = position(msg)
        start, end = ranges.get((topic, partition), (offset, offset + 1))
        ranges[(topic, partition)] = (min(start, offset), max(end, offset + 1))
    return ranges


def intent_reached(msgs: list[Message], intent: Ranges) -> bool:
    """Whether ``msgs`` reach the end of every range of ``intent`` (the batch is complete)."""
    last: dict[tuple[str, int], int] = {}
    for msg in msgs:
        topic, partition, offset = position(msg)
        if (topic, partition) in intent:
            last[(topic, partition)] = max(last.get((topic, partition), -1), offset)
    return all(last.get(tp, -1) >= end - 1 for tp, (_start, end) in intent.items())


def split_intent(msgs: list[Message], intent: Ranges) -> tuple[list[Message], list[Message]]:
    """The messages inside ``intent``'s ranges, and the rest (held, in arrival order)."""
    inside: list[Message] = []
    held: list[Message] = []
    for msg in msgs:
        topic, partition, offset = position(msg)
        span = intent.get((topic, partition))
        in_range = span is not None and span[0] <= offset < span[1]
        (inside if in_range else held).append(msg)
    return inside, held


def empty_result() -> BatchResult:
    """A batch with nothing to decide (every message was dead-lettered)."""
    return BatchResult([], {}, NO_ORDERED_PUTS, {}, BatchStats())


class Checkpoint:
    """Runs the commit protocol (see the module docstring) for one batch at a time.

    ``producer`` is a :class:`~stream_dedup.service.transactions.TransactionalProducer` in
    exactly-once mode (steps 2, 3 and 5 become one transaction), an :class:`EventProducer`
    otherwise.
    """

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
        self,
        records: list[OutRecord],
        result: BatchResult,
        ranges: Ranges,
        rejected: Rejected,
        *,
        delivered: bool = False,
    ) -> None:
        """Record the intent, produce, confirm, write the index, commit to Kafka: in order.

        ``ranges`` are the batch's input ranges; ``result`` must come from deciding the
        batch's documents in time order (see the module docstring). ``delivered``: the
        batch is the pending intent and its transaction committed before the last stop
        (exactly-once only), so its records are not produced again; only the index is
        written.
        """
        started = time.perf_counter()
        offsets = {tp: end for tp, (_start, end) in ranges.items()}
        self._dedup.index.write_intent(ranges)  # 1. the batch intent
        producer = self._producer
        if delivered:
            log.info(
                "the batch announced before the last stop was delivered; storing it",
                extra=fields(action="none: its events are not emitted again"),
            )
        else:
            self._produce(records, rejected)  # 2. produce
        pending = self._dedup.prepare(result, offsets)  # 4. built while the broker acks
        if not delivered:  # 3. confirm every delivery, or commit the transaction
            producer.deliver(
                offsets,
                self._consumer.consumer_group_metadata() if producer.commits_offsets else None,
                self._settings.flush_timeout_s,
                (self._settings.backoff_initial_s, self._settings.backoff_max_s),
                give_up=lambda: not self._keep_waiting(),
            )
        self._dedup.index.apply(pending)  # 4. the commit point; clears the intent
        if not producer.commits_offsets:
            self._commit_kafka(offsets)  # 5. offsets to Kafka, for lag tools
        self._committed(started)

    def store(self, result: BatchResult) -> None:
        """Shared index, step 1: store the decided batch (records, verdicts, counters; no
        offsets) in one atomic write, inside the lease it was decided in.

        The order is the reverse of :meth:`commit`'s, because other instances must see
        the batch's documents before this one lets the lease go. Nothing is lost by it:
        the offsets are stored only by :meth:`deliver`, after the events are confirmed,
        and a batch consumed again after a crash between the two finds every document's
        verdict stored and re-emits identical events (see ``docs/shared-index.md``).
        """
        self._dedup.index.apply(self._dedup.prepare(result))

    def deliver(self, records: list[OutRecord], ranges: Ranges, rejected: Rejected) -> None:
        """Shared index, step 2, outside the lease: produce, confirm every record, then
        store the next input offsets in the index and commit them to Kafka."""
        started = time.perf_counter()
        offsets = {tp: end for tp, (_start, end) in ranges.items()}
        self._produce(records, rejected)
        self._producer.deliver(
            offsets,
            None,
            self._settings.flush_timeout_s,
            (self._settings.backoff_initial_s, self._settings.backoff_max_s),
            give_up=lambda: not self._keep_waiting(),
        )
        self._dedup.index.write_offsets(offsets)
        self._commit_kafka(offsets)
        self._committed(started)

    def _produce(self, records: list[OutRecord], rejected: Rejected) -> None:
        """Hand a batch's records to the producer (a transaction's, in exactly-once mode);
        a record the client rejects outright is replaced by what ``rejected`` gives."""
        producer = self._producer
        producer.begin()
        for i, rec in enumerate(records):
            try:
                producer.produce(rec)
            except KafkaException as exc:
                replacement = rejected(i, exc)
                if replacement is not None:
                    producer.produce(replacement)

    def _committed(self, started: float) -> None:
        self._metrics.commits.inc()
        self._metrics.last_commit.set_to_current_time()
        self._metrics.commit_duration.observe(time.perf_counter() - started)

    def _commit_kafka(self, offsets: Offsets) -> None:
        """Step 5, asynchronous: a synchronous commit is a broker round trip per batch, a
        large share of a small batch's time in the loop at low load."""
        if not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:
            _kafka_commit_failed(self._metrics, str(exc))


def kafka_commit_reporter(
    metrics: Metrics,
) -> Callable[[KafkaError | None, list[TopicPartition]], None]:
    """The consumer's ``on_commit`` callback: how step 5 ended, served while consuming."""

    def report(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        errors = [str(err)] if err is not None else []
        errors += [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in partitions if tp.error]
        if errors:
            _kafka_commit_failed(metrics, "; ".join(errors))

    return report


def _kafka_commit_failed(metrics: Metrics, error: str) -> None:
    metrics.kafka_commit_failures.inc()
    log.warning(
        "Kafka refused the offset commit; the index holds the true offsets",
        extra={
            "fields": {
                "error": error,
                "action": "none needed; lag tools catch up at the next commit",
            }
        },
    )
