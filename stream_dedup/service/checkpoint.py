"""How a batch becomes durable: one commit strategy per delivery mode, chosen once at start.

The protocol, its crash points and why it loses nothing are written down once, in
``docs/commit-protocol.md`` (the shared index's variant in ``docs/shared-index.md``); the
numbered comments below are its steps. Three named strategies implement it behind one
interface, :class:`CommitStrategy`:

* :class:`AtLeastOnce` (the default): record the batch intent, produce, confirm every
  delivery, one index write with the offsets, commit the offsets to Kafka.
* :class:`ExactlyOnce` (``service.delivery = "exactly-once"``): the same order, with the
  records and the input offsets in one Kafka transaction
  (:class:`~stream_dedup.service.transactions.TransactionalProducer`).
* :class:`SharedIndex` (``index.backend = "redis"``): decide and store under the shared
  index's lease, then deliver and store the offsets outside it.
* :class:`SharedExactlyOnce` (both): the shared index's order, its delivery and input
  offsets in one Kafka transaction; Kafka's group offsets are the input's position.

:func:`open_strategy` picks one from the settings. The batch's owner
(:class:`~stream_dedup.service.lifecycle.BatchLife`) hands each decoded batch to
:meth:`CommitStrategy.commit`, which decides it (:class:`~stream_dedup.service.decide.
Decider`) and makes it durable; nothing else writes the index or produces.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult
from stream_dedup.index import DedupIndex
from stream_dedup.logs import fields
from stream_dedup.service.batches import Ranges, TpKey
from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import DecidedBatch, Decider
from stream_dedup.service.events import OutRecord
from stream_dedup.service.index_outage import IndexOutage
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.kafka import EventProducer
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.refusals import Refused
from stream_dedup.service.transactions import TransactionalProducer, intent_delivered

log = logging.getLogger("stream_dedup.service.checkpoint")

T = TypeVar("T")

Offsets = Mapping[TpKey, int]


class CommitStrategy(ABC):
    """Decides a batch and makes it durable, in one delivery mode's order.

    Owns the producer (closed by :meth:`close`); uses the consumer only to commit offsets
    and, in exactly-once mode, for its group metadata. ``keep_waiting`` is asked while
    deliveries are unconfirmed: False gives up (the batch is replayed at the next start).
    """

    #: What the operator should do when the first batch replays an announced one.
    replay_action = "none: its events are re-emitted identically"
    #: Told each batch's input ranges as soon as the batch is stored, before it is
    #: delivered (the shared index: the group's heads move on, :mod:`.group_order`).
    on_stored: Callable[[Ranges], None] | None = None

    def __init__(
        self,
        producer: EventProducer,
        consumer: Consumer,
        decider: Decider,
        metrics: Metrics,
        config: ServiceConfig,
        keep_waiting: Callable[[], bool],
    ) -> None:
        self._producer = producer
        self._consumer = consumer
        self._decider = decider
        self._index: DedupIndex = decider.dedup.index
        self._metrics = metrics
        self._settings = config.service
        self._keep_waiting = keep_waiting

    @property
    def index_down_since(self) -> float | None:
        """When the shared index's current outage began (monotonic clock), or None: the
        service is not ready meanwhile."""
        return None

    def ride_out(self, operation: str, step: Callable[[], T]) -> T:
        """``step()``, waiting out a shared index's outage as the commit's own steps do
        (the group's heads exchange goes through it: an outage seen there first must make
        the service unready and count against ``index.redis.outage_limit_s`` too)."""
        return step()

    def stored_offsets(self) -> dict[TpKey, int]:
        """The next offset of each partition as the index stores it, read when partitions
        are assigned."""
        return self._index.offsets()

    def stored_intent(self) -> Ranges | None:
        """The batch the index announced and never committed (read once, at start)."""
        return self._index.intent()

    def stored_documents(self) -> int:
        """How many documents the index holds (asked when partitions are assigned)."""
        return self._index.counter("documents")

    def replay_delivered(self, intent: Ranges) -> bool:
        """Whether the batch ``intent`` announces was delivered before the last stop (then
        its replay stores it without producing it again). Asked once, at start."""
        return False

    @abstractmethod
    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        """Decide ``decoded`` (the batch of input ``ranges``, in time order) and make it
        durable; ``replaying``: it is the batch the index's intent announced."""

    def close(self, timeout_s: float) -> int:
        """Flush (or abort) what is left; returns the number of records undelivered."""
        return self._producer.close(timeout_s)

    # -- the steps the strategies share ---------------------------------------------------

    def _produce(self, records: list[OutRecord], refused: Refused) -> None:
        """Hand a batch's records to the producer (a transaction's, in exactly-once mode);
        a record refused for good, now or at delivery, is replaced by what ``refused``
        gives (:mod:`.refusals`)."""
        producer = self._producer
        producer.begin(refused)
        for rec in records:
            producer.produce(rec)

    def _confirm(self, offsets: Offsets, group: object = None) -> None:
        """Return once every record is delivered (or the transaction committed)."""
        settings = self._settings
        self._producer.deliver(
            offsets,
            group,
            settings.flush_timeout_s,
            (settings.backoff_initial_s, settings.backoff_max_s),
            give_up=lambda: not self._keep_waiting(),
        )

    def _commit_kafka(self, offsets: Offsets) -> None:
        """Offsets to Kafka, for lag tools; asynchronous: a synchronous commit is a broker
        round trip per batch, a large share of a small batch's time at low load."""
        if not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            self._consumer.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:
            _kafka_commit_failed(self._metrics, str(exc))

    def _committed(self, started: float) -> None:
        self._metrics.commits.inc()
        self._metrics.last_commit.set_to_current_time()
        self._metrics.commit_duration.observe(time.perf_counter() - started)


class _IntentFirst(CommitStrategy):
    """The order of an index this instance owns: intent, deliver, then one index write."""

    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        out = self._decider.build(decoded, sketched)
        started = time.perf_counter()
        offsets = _next_offsets(ranges)
        self._index.write_intent(ranges)  # 1. the batch intent
        delivered = replaying and self._delivered_before()
        if delivered:
            log.info(
                "the batch announced before the last stop was delivered; storing it",
                extra=fields(action="none: its events are not emitted again"),
            )
        else:
            self._produce(out.records, out.refused)  # 2. produce
        pending = self._decider.dedup.prepare(out.result, offsets)  # 4. built while acked
        if not delivered:
            self._deliver(offsets)  # 3. confirm every delivery, or commit the transaction
        self._index.apply(pending)  # 4. the commit point; clears the intent
        self._after_store(offsets)  # 5.
        self._committed(started)
        return out.result

    def _delivered_before(self) -> bool:
        return False

    @abstractmethod
    def _deliver(self, offsets: Offsets) -> None: ...

    @abstractmethod
    def _after_store(self, offsets: Offsets) -> None: ...


class AtLeastOnce(_IntentFirst):
    """Confirm every delivery, store, then commit the offsets to Kafka for lag tools: a
    crash replays at most one batch, with identical events."""

    def _deliver(self, offsets: Offsets) -> None:
        self._confirm(offsets)

    def _after_store(self, offsets: Offsets) -> None:
        self._commit_kafka(offsets)  # 5. offsets to Kafka, for lag tools


class ExactlyOnce(_IntentFirst):
    """Records and input offsets in one Kafka transaction, then the index write: a
    ``read_committed`` reader sees every event once."""

    replay_action = "none: it is delivered once"
    #: The pending intent's transaction committed before the last stop (set at start).
    _intent_delivered = False

    def replay_delivered(self, intent: Ranges) -> bool:
        self._intent_delivered = intent_delivered(
            self._consumer, intent, self._settings.flush_timeout_s
        )
        return self._intent_delivered

    def _delivered_before(self) -> bool:
        delivered, self._intent_delivered = self._intent_delivered, False
        return delivered

    def _deliver(self, offsets: Offsets) -> None:
        self._confirm(offsets, self._consumer.consumer_group_metadata())

    def _after_store(self, offsets: Offsets) -> None:
        """Nothing: the transaction committed the offsets to the group already."""


class SharedIndex(CommitStrategy):
    """Decide and store under the shared index's lease, deliver outside it.

    The reverse of the owned index's order, because other instances must see the batch's
    documents before this one lets the lease go. Nothing is lost by it: the offsets are
    stored only after the events are confirmed, and a batch consumed again after a crash
    between the two finds every verdict stored and re-emits identical events
    (``docs/shared-index.md``). There are no intents: ``replaying`` is never true here.

    A Redis outage is ridden out (:class:`~stream_dedup.service.index_outage.IndexOutage`,
    up to ``index.redis.outage_limit_s``): steps 1 and 4 are each retried whole, as a
    replay in process would run them.
    """

    def __init__(
        self,
        producer: EventProducer,
        consumer: Consumer,
        decider: Decider,
        metrics: Metrics,
        config: ServiceConfig,
        keep_waiting: Callable[[], bool],
    ) -> None:
        super().__init__(producer, consumer, decider, metrics, config, keep_waiting)
        self._outage = IndexOutage(config.index.redis.outage_limit_s, metrics, keep_waiting)

    @property
    def index_down_since(self) -> float | None:
        return self._outage.down_since

    def ride_out(self, operation: str, step: Callable[[], T]) -> T:
        return self._outage.call(operation, step)

    def stored_offsets(self) -> dict[TpKey, int]:
        return self._outage.call("reading offsets", self._index.offsets)

    def stored_intent(self) -> Ranges | None:
        return self._outage.call("reading the batch intent", self._index.intent)

    def stored_documents(self) -> int:
        return self._outage.call("counting documents", lambda: self._index.counter("documents"))

    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        out = self._store(decoded, sketched, ranges)  # 1. decide and store, under the lease
        started = time.perf_counter()
        offsets = _next_offsets(ranges)
        self._produce(out.records, out.refused)  # 2. produce
        self._confirm(offsets)  # 3. confirm every delivery
        self._outage.call("storing offsets", lambda: self._index.write_offsets(offsets))  # 4.
        self._commit_kafka(offsets)  # 5. offsets to Kafka, for lag tools
        self._committed(started)
        return out.result

    def _store(self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges) -> DecidedBatch:
        """Step 1, retried whole through an outage of the index; then ``on_stored`` (the
        group's time order publishes its new heads before delivery)."""
        built: list[DecidedBatch] = []  # one per attempt that got as far as deciding
        out = self._outage.call(
            "deciding and storing a batch",
            lambda: self._decide_and_store(decoded, sketched, built),
        )
        if self.on_stored is not None:
            self.on_stored(ranges)
        return out

    def _decide_and_store(
        self, decoded: Decoded, sketched: Sketch | None, built: list[DecidedBatch]
    ) -> DecidedBatch:
        """Step 1: under the lease, decide the batch and store it (one atomic write).

        Run again after an outage, it takes a new lease, which first applies a write the
        outage interrupted after its commit point; the batch's documents stored by then
        get their stored verdicts back, so its events are the same as the first try's.
        ``built`` holds the earlier attempts' builds: their dead letters are counted once.
        """
        metrics = self._metrics
        waited = time.perf_counter()
        with self._index.exclusive():
            held = time.perf_counter()
            metrics.lease_wait.observe(held - waited)
            out = self._decider.build(decoded, sketched, told=bool(built))
            built.append(out)
            self._index.apply(self._decider.dedup.prepare(out.result))  # 1. store
        metrics.lease_held.observe(self._index.lease_end() - held)
        self._decider.dedup.after_lease()
        return out


class SharedExactlyOnce(SharedIndex):
    """The shared index's order with the delivery in one Kafka transaction.

    Store-then-deliver: the batch is decided and stored under the lease first (as
    :class:`SharedIndex`), then its records and input offsets go in one transaction with
    the group's metadata (a member of an older generation is refused: zombie fencing).
    Kafka's committed group offsets are the input's position (:meth:`stored_offsets`): a
    crash before the commit leaves them before the batch, whose next owner replays the
    stored verdicts, byte-identical, in a new transaction. The index's offsets, written
    after the commit, are bookkeeping only (``docs/shared-index.md``, exactly-once).
    """

    replay_action = "none: it is delivered once"

    def stored_offsets(self) -> dict[TpKey, int]:
        """None: every partition starts at the group's committed offset (read stable, so
        a transaction still open on it is waited for), never at the index's."""
        return {}

    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        out = self._store(decoded, sketched, ranges)  # 1. decide and store, under the lease
        started = time.perf_counter()
        offsets = _next_offsets(ranges)
        self._produce(out.records, out.refused)  # 2. produce, in a transaction
        self._confirm(offsets, self._consumer.consumer_group_metadata())  # 3. commit it
        self._outage.call("storing offsets", lambda: self._index.write_offsets(offsets))  # 4.
        self._committed(started)
        return out.result


def open_strategy(
    config: ServiceConfig,
    consumer: Consumer,
    decider: Decider,
    metrics: Metrics,
    keep_waiting: Callable[[], bool],
) -> CommitStrategy:
    """The strategy the settings name, with its producer (registered with the transaction
    coordinator first in exactly-once mode, waiting out an absent broker)."""
    settings = config.client_settings()
    if config.exactly_once:
        transactional = TransactionalProducer(
            settings,
            BrokerWatch("producer"),
            on_outcome=lambda outcome: metrics.transactions.labels(outcome).inc(),
        )
        transactional.init(config.service.flush_timeout_s, lambda: not keep_waiting())
        eos = SharedExactlyOnce if decider.dedup.index.shared else ExactlyOnce
        return eos(transactional, consumer, decider, metrics, config, keep_waiting)
    producer = EventProducer(settings, BrokerWatch("producer"))
    kind = SharedIndex if decider.dedup.index.shared else AtLeastOnce
    return kind(producer, consumer, decider, metrics, config, keep_waiting)


def _next_offsets(ranges: Ranges) -> dict[TpKey, int]:
    """The offset to resume each partition at once the batch of ``ranges`` is stored."""
    return {tp: end for tp, (_start, end) in ranges.items()}


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
        extra=fields(error=error, action="none needed; lag tools catch up at the next commit"),
    )
