"""The service loop: consume a batch, decide it, checkpoint it; until told to stop.

One instance consumes every partition of the input topics against one index: a
near-duplicate may arrive on any partition, so splitting partitions across instances
would split the index and miss duplicates. The index has exactly one writer (RocksDB's
lock); a second process on the same directory stops at start-up with
:class:`~stream_dedup.errors.IndexLockedError`. High availability is a restart policy plus
a persistent volume for the index: a restarted instance resumes from the offsets stored
in the index (see :mod:`stream_dedup.checkpoint`).

A batch takes the messages already fetched without waiting for more: it closes when none is
left, at ``batch.max_messages``, or ``batch.max_wait_ms`` after its first message, and is
decided in the canonical (topic, partition, offset) order. After a crash the first batch
is instead the one the index's batch intent announces, collected until complete
(see :mod:`stream_dedup.checkpoint`); normal batching resumes once it is committed.
Bad input never stops the loop: a message that cannot be decoded, or whose processing
raises, goes to the dead-letter topic (:mod:`stream_dedup.outputs` builds a batch's events
and dead letters) and its offset is committed like any other.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry

from stream_dedup.ahead import SketchAhead
from stream_dedup.checkpoint import (
    Checkpoint,
    batch_ranges,
    canonical_order,
    intent_reached,
    position,
    split_intent,
)
from stream_dedup.dedup import Deduplicator
from stream_dedup.endpoints import HttpEndpoints
from stream_dedup.index import DedupIndex, open_index
from stream_dedup.index.store import Ranges
from stream_dedup.kafka import (
    BrokerWatch,
    DeliveryAbandonedError,
    EventProducer,
    build_consumer,
    raise_if_fatal,
)
from stream_dedup.metrics import Metrics
from stream_dedup.outputs import BatchOutputs, Decoded
from stream_dedup.service_config import ServiceConfig
from stream_dedup.sketch import Sketch
from stream_dedup.sketch_worker import SketchWorkerError

log = logging.getLogger("stream_dedup.service")

TpKey = tuple[str, int]
DeduplicatorFactory = Callable[[DedupIndex, ServiceConfig], Deduplicator]


def default_deduplicator(index: DedupIndex, config: ServiceConfig) -> Deduplicator:
    return Deduplicator(index, config.dedup.dedup_config())


def _fields(**kw: object) -> dict[str, dict[str, object]]:
    return {"fields": kw}


class Service:
    """``stream-dedup run``: construct, then :meth:`run` until :meth:`stop`.

    The constructor opens the index (so a second instance fails before touching Kafka)
    but no network connection; :meth:`run` starts the HTTP port and the Kafka clients.
    """

    def __init__(
        self,
        config: ServiceConfig,
        registry: CollectorRegistry | None = None,
        deduplicator: DeduplicatorFactory = default_deduplicator,
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = Metrics(self.registry)
        dedup_config = config.dedup.dedup_config()
        self.index = open_index(
            config.index.path, dedup_config.index_params(), sync=config.index.sync
        )
        self.dedup = deduplicator(self.index, config)
        self.metrics.index_source = lambda: (
            self.index.counter("documents"),
            self.index.size_bytes(),
        )
        self._outputs = BatchOutputs(config, self.dedup, self.metrics)
        strategy = config.kafka.get("partition.assignment.strategy", "")
        self._cooperative = (
            "cooperative" in strategy or config.kafka.get("group.protocol") == "consumer"
        )
        self._stop = threading.Event()
        self._stop_requested_at: float | None = None
        self._last_beat = time.monotonic()
        self._assigned: set[tuple[str, int]] = set()
        self._index_open = True
        self._pending: list[Message] = []
        #: Ranges of a batch announced but not committed before the last stop: replay it.
        self._intent = self.index.intent()
        self._paused: set[tuple[str, int]] = set()
        self._intent_warned_at = time.monotonic() - 15.0  # first warning after ~15 s
        self._received_at: dict[int, float] = {}
        self.http: HttpEndpoints | None = None
        self._consumer: Consumer | None = None
        self._checkpoint: Checkpoint | None = None
        self._ahead: SketchAhead | None = None

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish its batch, checkpoint and return (thread- and signal-safe)."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stop.set()

    def _keep_waiting(self) -> bool:
        """While confirming deliveries: beat, and give up only when a stop is overdue."""
        self._beat()
        if self._stop_requested_at is None:
            return True
        budget = self.config.service.shutdown_timeout_s * 0.8
        return time.monotonic() - self._stop_requested_at < budget

    def _beat(self) -> None:
        self._last_beat = time.monotonic()

    def health(self) -> tuple[bool, dict[str, object]]:
        age = time.monotonic() - self._last_beat
        return age < self.config.http.health_max_age_s, {"last_loop_s": round(age, 3)}

    def ready(self) -> tuple[bool, dict[str, object]]:
        ok = bool(self._assigned) and self._index_open
        return ok, {"partitions": len(self._assigned), "index_open": self._index_open}

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT request a graceful stop (only from the main thread)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("stop requested", extra=_fields(signal=signal.Signals(signum).name))
            self.stop()
            self._arm_watchdog()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _arm_watchdog(self) -> None:
        """Bound the stop: if it takes longer than ``shutdown_timeout_s``, exit hard."""

        def expire() -> None:
            log.error(
                "graceful stop overran its time; exiting without a final checkpoint",
                extra=_fields(
                    timeout_s=self.config.service.shutdown_timeout_s,
                    action="none: the last batch is replayed at the next start",
                ),
            )
            os._exit(1)

        timer = threading.Timer(self.config.service.shutdown_timeout_s, expire)
        timer.daemon = True
        timer.start()

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Consume until stopped; returns the exit code (0 after a clean stop)."""
        cfg = self.config
        if cfg.http.enabled:
            self.http = HttpEndpoints(
                cfg.http.host, cfg.http.port, self.registry, self.health, self.ready
            )
            self.http.start()
        self._ahead = SketchAhead(  # the worker loads while we warm up
            self.dedup.config if cfg.service.sketch_worker else None, self._worker_failed
        )
        ahead = self._ahead
        self.dedup.warm_up()
        consumer_watch = BrokerWatch("consumer")
        producer = EventProducer(cfg.kafka, BrokerWatch("producer"))
        consumer = build_consumer(cfg.kafka, consumer_watch, self.metrics.on_statistics)
        self._consumer = consumer
        self._checkpoint = Checkpoint(
            producer, self.dedup, consumer, self.metrics, cfg.service, self._keep_waiting
        )
        consumer.subscribe(
            list(cfg.input.topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info(
            "started",
            extra=_fields(
                topics=list(cfg.input.topics),
                unique_topic=cfg.unique_topic,
                duplicate_topic=cfg.duplicate_topic,
                dlq_topic=cfg.dlq_topic,
                index=self.index.location,
                indexed_documents=self.index.counter("documents"),
                http_port=self.http.port if self.http else None,
            ),
        )
        if self._intent is not None:
            log.info(
                "replaying the batch announced before the last stop",
                extra=_fields(
                    ranges=[f"{t}:{p}@{a}-{b}" for (t, p), (a, b) in sorted(self._intent.items())],
                    action="none: its events are re-emitted identically",
                ),
            )
        code = 0
        try:
            while not self._stop.is_set():
                self._beat()
                if consumer_watch.fatal is not None:
                    raise KafkaException(consumer_watch.fatal)
                from_intent = self._intent is not None
                batch = self._collect(consumer, wait=not ahead.holding)
                if batch:
                    consumer_watch.alive()
                if from_intent:
                    if batch:
                        self._process(self._decode(batch), None)
                    continue
                ahead.advance(self._decode(batch) if batch else None, self._process)
            ahead.drain(self._process)
        except DeliveryAbandonedError as exc:
            log.warning(
                "stopped before the last batch was confirmed; it will be replayed",
                extra=_fields(error=str(exc), action="none: replayed events are identical"),
            )
            self._pending = []
            ahead.take_back()
            code = 1
        finally:
            self._shutdown(consumer, producer)
        return code

    def _shutdown(self, consumer: Consumer, producer: EventProducer) -> None:
        self._stop.set()
        try:
            consumer.close()  # leaves the group; the revoke callback checkpoints leftovers
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer close failed", extra=_fields(error=str(exc)))
        left = producer.close(5.0)
        if left:
            log.warning("records left undelivered at exit", extra=_fields(records=left))
        if self._ahead is not None:
            self._ahead.close()
        self._assigned.clear()
        self._index_open = False
        self.index.close()
        if self.http is not None:
            self.http.stop()
        log.info("stopped", extra=_fields(documents=self.index.counter("documents")))

    def _collect(self, consumer: Consumer, *, wait: bool = True) -> list[Message]:
        """Up to ``max_messages``: what has arrived, taken without waiting for more.

        The first message is awaited with ``poll`` (returns as soon as one is there);
        the rest are taken with ``consume(n, 0)``, which returns what librdkafka has
        already fetched. The batch closes when nothing more is there, at ``max_messages``,
        or ``max_wait_ms`` after the first message while messages keep coming. A
        ``consume(n, timeout)`` would instead wait out its whole timeout whenever fewer
        than n messages come, adding the window to every document's latency at low load;
        under load the batch still grows, from what arrives while the last one is decided.
        With ``wait=False`` (a batch is being sketched ahead) the first message is not
        awaited either. While a batch intent is pending, the batch is the intent's
        (:meth:`_collect_intent`).
        """
        if self._intent is not None:
            return self._collect_intent(consumer, self._intent)
        limit = self.config.batch.max_messages
        wait_s = self.config.batch.max_wait_ms / 1000.0
        if not self._pending:
            first = consumer.poll(0.2 if wait else 0.0)
            if first is None:
                return []
            self._take([first])
        deadline = time.monotonic() + wait_s
        while len(self._pending) < limit and not self._stop.is_set():
            more = consumer.consume(limit - len(self._pending), 0)
            self._take(more)
            if not more or time.monotonic() >= deadline:
                break
        batch, self._pending = self._pending[:limit], self._pending[limit:]
        return batch

    def _collect_intent(self, consumer: Consumer, intent: Ranges) -> list[Message]:
        """The announced batch once every intent partition reached its end, else ``[]``.

        Messages beyond a range, or from other partitions, are held (in arrival order) for
        the next batch. Partitions with nothing more to give this batch are paused so the
        held messages stay few; they resume when the batch is complete.
        """
        missing = sorted(set(intent) - self._assigned)
        if missing:
            self._pause([tp for tp in self._assigned if tp not in self._paused])
            now = time.monotonic()
            if now - self._intent_warned_at > 30.0:
                self._intent_warned_at = now
                log.warning(
                    "waiting for the partitions of the batch to replay",
                    extra=_fields(
                        missing=[f"{t}:{p}" for t, p in missing],
                        action="run one instance for all partitions of the input topics; "
                        "stop any other member of this consumer group",
                    ),
                )
            msg = consumer.poll(0.2)  # serves the rebalance callbacks
            if msg is not None:
                self._take([msg])
            return []
        if not intent_reached(self._pending, intent):
            self._take(consumer.consume(self.config.batch.max_messages, 0.2))
            self._pause(self._done_for_intent(intent))
            if not intent_reached(self._pending, intent):
                return []
        batch, self._pending = split_intent(self._pending, intent)
        return batch

    def _done_for_intent(self, intent: Ranges) -> list[TpKey]:
        """Assigned, unpaused partitions that cannot add to the announced batch."""
        last: dict[TpKey, int] = {}
        for msg in self._pending:
            topic, partition, offset = position(msg)
            last[(topic, partition)] = max(last.get((topic, partition), -1), offset)
        return [
            tp
            for tp in self._assigned
            if tp not in self._paused
            and (tp not in intent or last.get(tp, -1) >= intent[tp][1] - 1)
        ]

    def _pause(self, partitions: list[TpKey]) -> None:
        if partitions and self._consumer is not None:
            self._consumer.pause([TopicPartition(t, p) for t, p in partitions])
            self._paused.update(partitions)

    def _resume_all(self) -> None:
        """Resume what :meth:`_pause` paused (fetching restarts after the last message seen)."""
        if self._paused and self._consumer is not None:
            live = [TopicPartition(t, p) for t, p in self._paused if (t, p) in self._assigned]
            if live:
                self._consumer.resume(live)
        self._paused.clear()

    def _take(self, msgs: list[Message]) -> None:
        """Keep consumed messages for the batch; log (or raise, if fatal) consumer errors."""
        received = time.perf_counter()
        for msg in msgs:
            err = raise_if_fatal(msg)
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error", extra=_fields(error=err.str()))
                continue
            self._pending.append(msg)
            self._received_at[id(msg)] = received

    # -- one batch -----------------------------------------------------------------------

    def _decode(self, batch: list[Message]) -> Decoded:
        """The batch in the canonical order, decoded (the first step of processing it)."""
        return self._outputs.decode(canonical_order(batch))

    def _worker_failed(self, exc: SketchWorkerError) -> None:
        self.metrics.sketch_worker_failures.inc()
        log.warning(
            "sketch worker failed; this batch is sketched in the service process",
            extra=_fields(
                error=str(exc),
                action="none: verdicts are unaffected; a dead worker is started again",
            ),
        )

    def _process(self, decoded: Decoded, sketched: Sketch | None) -> None:
        """Decide (in canonical order), build records, checkpoint: one decoded batch."""
        assert self._checkpoint is not None
        started = time.perf_counter()
        batch = decoded.batch
        self.metrics.consumed.inc(len(batch))
        self.metrics.batch_size.observe(len(batch))
        out = self._outputs.build(decoded, sketched)
        self._checkpoint.commit(out.records, out.result, batch_ranges(batch), out.rejected)
        if self._intent is not None:  # the announced batch is stored: batch normally again
            self._intent = None
            self._resume_all()
        done = time.perf_counter()
        self.metrics.batch_duration.observe(done - started)
        received = self._received_at
        self.metrics.document_latency.observe_many(
            [done - received.pop(id(msg), started) for msg in batch]
        )
        result = out.result
        duplicates = sum(v.is_duplicate for v in result.verdicts)
        self.metrics.verdicts.labels("duplicate").inc(duplicates)
        self.metrics.verdicts.labels("unique").inc(len(result.verdicts) - duplicates)
        self.metrics.observe_work(result.stats.candidates, result.stats.verifications)
        self.metrics.replayed.inc(result.stats.replayed)
        self.metrics.truncated.inc(result.stats.truncated_lookups)

    # -- rebalances ----------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Seek every assigned partition to the offset stored in the index.

        A partition named by a pending batch intent goes to the intent's start (the same
        offset when the index has one), so the announced batch is read again whole.
        """
        self.metrics.rebalances.labels("assign").inc()
        stored = self.index.offsets()
        intent = self._intent or {}
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in intent:
                tp.offset = intent[key][0]
            elif key in stored:
                tp.offset = stored[key]
            self._assigned.add(key)
            self._paused.discard(key)
        log.info(
            "partitions assigned",
            extra=_fields(
                partitions=[f"{tp.topic}:{tp.partition}@{tp.offset}" for tp in partitions],
                source="index offsets (others: group offset or auto.offset.reset)",
            ),
        )
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        self.metrics.assigned.set(len(self._assigned))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Checkpoint what was collected before the partitions go.

        While a batch intent is pending, only the complete announced batch may be
        checkpointed; otherwise the revoked partitions' messages are dropped here and read
        again from the index offsets at the next assignment.
        """
        self.metrics.rebalances.labels("revoke").inc()
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        if self._ahead is not None:
            self._ahead.drain(self._process)
        if self._intent is not None and intent_reached(self._pending, self._intent):
            announced, self._pending = split_intent(self._pending, self._intent)
            self._process(self._decode(announced), None)
        if self._intent is None:
            batch, self._pending = self._pending, []
            if batch:
                self._process(self._decode(batch), None)
        else:
            batch = []
            self._pending = [m for m in self._pending if (m.topic(), m.partition()) not in revoked]
            self._resume_all()
        self._assigned -= revoked
        self._paused -= revoked
        self.metrics.assigned.set(len(self._assigned))
        log.info(
            "partitions revoked",
            extra=_fields(
                partitions=[f"{tp.topic}:{tp.partition}" for tp in partitions],
                checkpointed=len(batch),
            ),
        )
        if self._cooperative:
            consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a revoke: drop their uncommitted messages (replayed later)."""
        self.metrics.rebalances.labels("lost").inc()
        lost = {(tp.topic, tp.partition) for tp in partitions}
        if self._ahead is not None:  # not decided yet: back to the collected messages
            self._pending = self._ahead.take_back() + self._pending
        self._pending = [m for m in self._pending if (m.topic(), m.partition()) not in lost]
        self._assigned -= lost
        self._paused -= lost
        self.metrics.assigned.set(len(self._assigned))
        log.warning(
            "partitions lost",
            extra=_fields(
                partitions=sorted(f"{t}:{p}" for t, p in lost),
                action=(
                    "the session with the group coordinator expired (broker unreachable or"
                    " the loop stalled longer than session.timeout.ms); their uncommitted"
                    " messages are decided again when the partitions come back"
                ),
            ),
        )
