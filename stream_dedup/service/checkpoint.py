"""How a batch becomes durable: one commit strategy per delivery mode, chosen once at start.

The protocol, its crash points and why it loses nothing are written down once, in
``docs/commit-protocol.md`` (the shared index's variant in ``docs/shared-index.md``); the
numbered comments below are its steps. Four named strategies implement it behind one
interface, :class:`~stream_dedup.service.commit_strategy.CommitStrategy` (with the steps
they share); the shared index's two are in :mod:`.shared_commit`:

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
from abc import abstractmethod
from collections.abc import Callable

from confluent_kafka import Consumer

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult
from stream_dedup.logs import fields
from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.commit_strategy import (
    CommitStrategy,
    Offsets,
    kafka_commit_reporter,
    next_offsets,
)
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import Decider
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.kafka import EventProducer
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ranges import Ranges
from stream_dedup.service.shared_commit import SharedExactlyOnce, SharedIndex
from stream_dedup.service.transactions import TransactionalProducer, intent_delivered

__all__ = [
    "AtLeastOnce",
    "CommitStrategy",
    "ExactlyOnce",
    "SharedExactlyOnce",
    "SharedIndex",
    "kafka_commit_reporter",
    "open_strategy",
]

log = logging.getLogger("stream_dedup.service.checkpoint")


class _IntentFirst(CommitStrategy):
    """The order of an index this instance owns: intent, deliver, then one index write."""

    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        out = self._decider.build(decoded, sketched)
        started = time.perf_counter()
        offsets = next_offsets(ranges)
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
