"""The service loop: consume a batch, decide it, checkpoint it; until told to stop.

One instance consumes every partition of the input topics against one index: a
near-duplicate may arrive on any partition, so splitting partitions across instances
would split the index and miss duplicates. The index has exactly one writer (RocksDB's
lock); a second process on the same directory stops at start-up with
:class:`~stream_dedup.errors.IndexLockedError`. High availability is a restart policy plus
a persistent volume for the index: a restarted instance resumes from the offsets stored
in the index (see :mod:`stream_dedup.service.checkpoint`).

Each turn of the loop takes a batch (:mod:`stream_dedup.service.batches`: what has arrived,
or after a crash the batch announced before it; records are released across partitions in
document time by :mod:`stream_dedup.service.ordering`), decodes it in time order, and hands
it to :mod:`.prefetch`, which has the sketch worker sketch it while this process decides
and checkpoints the batch before it.
Bad input never stops the loop: a message that cannot be decoded, or whose processing
raises, goes to the dead-letter topic (:mod:`stream_dedup.service.decide` builds a batch's events
and dead letters) and its offset is committed like any other. When the group moves
partitions, :mod:`stream_dedup.service.rebalance` seeks, checkpoints or drops.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from confluent_kafka import Consumer, KafkaException, Message
from prometheus_client import CollectorRegistry

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex, RedisSettings, open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.logs import fields
from stream_dedup.service import gc_tuning
from stream_dedup.service.batches import Batcher
from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.checkpoint import (
    Checkpoint,
    batch_ranges,
    kafka_commit_reporter,
)
from stream_dedup.service.config import IndexConfig, ServiceConfig
from stream_dedup.service.decide import Decider
from stream_dedup.service.http import HttpEndpoints
from stream_dedup.service.inputs import Decoded, InputDecoder, MessageBatch
from stream_dedup.service.kafka import DeliveryAbandonedError, EventProducer, build_consumer
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ordering import RecordTime, time_order
from stream_dedup.service.prefetch.ahead import SketchAhead
from stream_dedup.service.prefetch.worker import SketchWorkerError
from stream_dedup.service.rebalance import Rebalance
from stream_dedup.service.transactions import TransactionalProducer, intent_delivered

log = logging.getLogger("stream_dedup.service")

#: Keys between progress lines while the key filter is built at start-up (a few seconds).
_FILTER_LOG_EVERY = 5_000_000

DeduplicatorFactory = Callable[[DedupIndex, ServiceConfig], Deduplicator]


def open_configured_index(settings: IndexConfig, params: IndexParams) -> DedupIndex:
    """The index the ``[index]`` settings name: a RocksDB directory this instance owns, or
    the Redis index every instance of the group shares."""
    r = settings.redis
    where = (
        RedisSettings(r.url, r.namespace, r.password or None, r.tls_ca_file or None, r.lock_ttl_ms)
        if settings.backend == "redis"
        else settings.path
    )
    return open_index(where, params, sync=settings.sync, retention=settings.policy())


def default_deduplicator(index: DedupIndex, config: ServiceConfig) -> Deduplicator:
    return Deduplicator(index, config.dedup)


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
        dedup_config = config.dedup
        self.index = open_configured_index(config.index, IndexParams.of(dedup_config))
        self.dedup = deduplicator(self.index, config)
        self.metrics.index_source = lambda: (self.index.stats(), self.index.filter_bytes())
        self._time_of = RecordTime(config.input.time_field)
        self._inputs = InputDecoder(config.input.message_format(), self._time_of)
        self._outputs = Decider(config, self.dedup, self.metrics)
        self._stop = threading.Event()
        self._stop_requested_at: float | None = None
        self._last_beat = time.monotonic()
        self._filter_logged = 0
        self._index_open = True
        self._batches = Batcher(config.batch, self.index.intent(), self._stop, self._time_of)
        strategy = config.kafka.get("partition.assignment.strategy", "")
        self._rebalance = Rebalance(
            self.index,
            self._batches,
            self.metrics,
            cooperative=(
                "cooperative" in strategy or config.kafka.get("group.protocol") == "consumer"
            ),
            process=self._process,
            decode=self._decode,
            ahead=lambda: self._ahead,
        )
        self.http: HttpEndpoints | None = None
        self._consumer: Consumer | None = None
        self._checkpoint: Checkpoint | None = None
        self._ahead: SketchAhead | None = None
        #: Exactly-once: the pending intent's transaction committed before the last stop.
        self._intent_delivered = False

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

    def _filter_progress(self, added: int) -> None:
        """While the key filter is built at start-up: beat, and log every ~5 million keys."""
        self._beat()
        if added >= self._filter_logged + _FILTER_LOG_EVERY:
            self._filter_logged = added
            log.info(
                "building the key filter from the index",
                extra=fields(keys_so_far=added, action="wait; the service subscribes next"),
            )

    def health(self) -> tuple[bool, dict[str, object]]:
        age = time.monotonic() - self._last_beat
        return age < self.config.http.health_max_age_s, {"last_loop_s": round(age, 3)}

    def ready(self) -> tuple[bool, dict[str, object]]:
        assigned = self._batches.assigned
        ok = bool(assigned) and self._index_open
        return ok, {"partitions": len(assigned), "index_open": self._index_open}

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT request a graceful stop (only from the main thread)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("stop requested", extra=fields(signal=signal.Signals(signum).name))
            self.stop()
            self._arm_watchdog()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _arm_watchdog(self) -> None:
        """Bound the stop: if it takes longer than ``shutdown_timeout_s``, exit hard."""

        def expire() -> None:
            log.error(
                "graceful stop overran its time; exiting without a final checkpoint",
                extra=fields(
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
            self.dedup.config if cfg.service.sketch_worker else None,
            self._inputs,
            self._worker_failed,
            cfg.service.sketch_inline_max,
        )
        ahead = self._ahead
        self.index.load_filter(self._filter_progress)
        self.dedup.warm_up(log.info)  # says so first when the kernels must be compiled
        consumer_watch = BrokerWatch("consumer")
        settings = cfg.client_settings()
        producer: EventProducer
        if cfg.exactly_once:
            transactional = TransactionalProducer(
                settings,
                BrokerWatch("producer"),
                on_outcome=lambda outcome: self.metrics.transactions.labels(outcome).inc(),
            )
            transactional.init(cfg.service.flush_timeout_s, lambda: not self._keep_waiting())
            producer = transactional
        else:
            producer = EventProducer(settings, BrokerWatch("producer"))
        consumer = build_consumer(
            settings,
            consumer_watch,
            self.metrics.on_statistics,
            on_commit=kafka_commit_reporter(self.metrics),
        )
        self._consumer = consumer
        self._batches.consumer = consumer
        self._checkpoint = Checkpoint(
            producer, self.dedup, consumer, self.metrics, cfg.service, self._keep_waiting
        )
        consumer.subscribe(
            list(cfg.input.topics),
            on_assign=self._rebalance.on_assign,
            on_revoke=self._rebalance.on_revoke,
            on_lost=self._rebalance.on_lost,
        )
        log.info(
            "started",
            extra=fields(
                topics=list(cfg.input.topics),
                unique_topic=cfg.unique_topic,
                duplicate_topic=cfg.duplicate_topic,
                dlq_topic=cfg.dlq_topic,
                index=self.index.location,
                indexed_documents=self.index.counter("documents"),
                http_port=self.http.port if self.http else None,
            ),
        )
        intent = self._batches.intent
        if intent is not None:
            self._intent_delivered = cfg.exactly_once and intent_delivered(
                consumer, intent, cfg.service.flush_timeout_s
            )
            log.info(
                "replaying the batch announced before the last stop",
                extra=fields(
                    ranges=[f"{t}:{p}@{a}-{b}" for (t, p), (a, b) in sorted(intent.items())],
                    delivered=self._intent_delivered,
                    action="none: its events are re-emitted identically"
                    if not cfg.exactly_once
                    else "none: it is delivered once",
                ),
            )
        code = 0
        gc_tuning.enter()
        try:
            while not self._stop.is_set():
                self._beat()
                gc_tuning.collect_due()
                if consumer_watch.fatal is not None:
                    raise KafkaException(consumer_watch.fatal)
                from_intent = self._batches.intent is not None
                batch = self._batches.collect(consumer, wait=not ahead.holding)
                self.metrics.reorder_waiting.set(len(self._batches.merge))
                if batch:
                    consumer_watch.alive()
                if from_intent:
                    if batch:
                        self._process(self._decode(batch), None)
                    continue
                ahead.advance(self._read(batch) if batch else None, self._process)
            ahead.drain(self._process)
        except DeliveryAbandonedError as exc:
            log.warning(
                "stopped before the last batch was confirmed; it will be replayed",
                extra=fields(error=str(exc), action="none: replayed events are identical"),
            )
            self._batches.pending = []
            ahead.take_back()
            code = 1
        except BaseException as exc:
            # A batch failed (the index could not be written, a bug): decide nothing more.
            # Closing the consumer revokes its partitions, and the revoke would checkpoint
            # what was collected since, storing offsets past the failed batch. Everything
            # from the last stored batch on is consumed again at the next start.
            self._batches.pending = []
            ahead.take_back()
            log.error(
                "stopping: the service cannot go on",
                extra=fields(
                    error=f"{type(exc).__name__}: {exc}",
                    action="fix the cause and start again; the batch not stored is replayed",
                ),
            )
            raise
        finally:
            self._shutdown(consumer, producer)
            gc_tuning.leave()
        return code

    def _shutdown(self, consumer: Consumer, producer: EventProducer) -> None:
        """Leave the group, then release everything else even if leaving failed: the
        revoke callback checkpoints leftovers, and an index error there must not keep the
        index's lock held or the HTTP port open."""
        self._stop.set()
        try:
            consumer.close()  # leaves the group; the revoke callback checkpoints leftovers
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer close failed", extra=fields(error=str(exc)))
        finally:
            left = producer.close(5.0)
            if left:
                log.warning("records left undelivered at exit", extra=fields(records=left))
            if self._ahead is not None:
                self._ahead.close()
            self._batches.assigned.clear()
            self._index_open = False
            self.index.close()
            if self.http is not None:
                self.http.stop()
        log.info("stopped", extra=fields(documents=self.index.counter("documents")))

    # -- one batch -----------------------------------------------------------------------

    def _read(self, batch: list[Message]) -> MessageBatch:
        """The batch in time order, with its sources (decoding starts from this)."""
        return self._inputs.read(time_order(batch, self._time_of))

    def _decode(self, batch: list[Message]) -> Decoded:
        """The batch in time order, decoded here (the first step of processing it)."""
        return self._inputs.decode(self._read(batch))

    def _worker_failed(self, exc: SketchWorkerError) -> None:
        self.metrics.sketch_worker_failures.inc()
        log.warning(
            "sketch worker failed; this batch is decoded and sketched in the service process",
            extra=fields(
                error=str(exc),
                action="none: verdicts are unaffected; a dead worker is started again",
            ),
        )

    def _process(self, decoded: Decoded, sketched: Sketch | None) -> None:
        """Decide (in time order), build records, checkpoint: one decoded batch."""
        assert self._checkpoint is not None
        started = time.perf_counter()
        batch = decoded.batch
        self.metrics.consumed.inc(len(batch))
        self.metrics.batch_size.observe(len(batch))
        if self.index.shared:
            # Deciding and storing take the shared index's lease; delivery does not.
            waited = time.perf_counter()
            with self.index.exclusive():
                held = time.perf_counter()
                self.metrics.lease_wait.observe(held - waited)
                out = self._outputs.build(decoded, sketched)
                self._checkpoint.store(out.result)
            self.metrics.lease_held.observe(time.perf_counter() - held)
            self._checkpoint.deliver(out.records, batch_ranges(batch), out.rejected)
            replaying = False
        else:
            out = self._outputs.build(decoded, sketched)
            replaying = self._batches.intent is not None
            self._checkpoint.commit(
                out.records,
                out.result,
                batch_ranges(batch),
                out.rejected,
                delivered=replaying and self._intent_delivered,
            )
        if replaying:  # the announced batch is stored: batch normally
            self._batches.intent = None
            self._intent_delivered = False
            self._batches.resume_all()
        done = time.perf_counter()
        self.metrics.batch_duration.observe(done - started)
        received = self._batches.received_at
        self.metrics.document_latency.observe_many(
            [done - received.pop(id(msg), started) for msg in batch]
        )
        result = out.result
        duplicates = sum(v.is_duplicate for v in result.verdicts)
        self.metrics.verdicts.labels("duplicate").inc(duplicates)
        self.metrics.verdicts.labels("unique").inc(len(result.verdicts) - duplicates)
        self.metrics.observe_work(result.stats.candidates, result.stats.verifications)
        self.metrics.observe_decided_times([self._time_of(m) for m in batch], time.time())
        self.metrics.replayed.inc(result.stats.replayed)
        self.metrics.truncated.inc(result.stats.truncated_lookups)
