"""The interface of a commit strategy and the steps its strategies share.

:class:`CommitStrategy` is what the batch's owner calls; the strategies themselves (one per
delivery mode) are in :mod:`.checkpoint` (an index this instance owns) and
:mod:`.shared_commit` (a shared index), which also say why each orders the steps as it does.
The steps here are the protocol's (``docs/commit-protocol.md``): produce, confirm the
deliveries, commit the offsets to Kafka, count the checkpoint.
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
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import Decider
from stream_dedup.service.events import OutRecord
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.kafka import EventProducer
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ranges import Ranges, TpKey
from stream_dedup.service.refusals import Refused

__all__ = ["CommitStrategy", "Offsets", "kafka_commit_reporter", "next_offsets"]

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
        """How many documents the index holds (asked when partitions are assigned): the
        index's own counter, which this process alone writes (a shared index's strategy
        reads Redis)."""
        return self._index.counter("documents")

    def replay_delivered(self, intent: Ranges) -> bool:
        """Whether the batch ``intent`` announces was delivered before the last stop (then
        its replay stores it without producing it again). Asked once, at start."""
        return False

    def decide_ahead(self, decoded: Decoded, sketched: Sketch | None) -> Sketch | None:
        """Decide ``decoded`` (``sketched``: its sketch, if made) now, before it is
        released to this instance, for :meth:`commit` to settle when it comes; its
        sketch, or None where nothing was decided. Only a shared index's group order
        holds a batch back (:class:`SharedIndex`)."""
        return None

    @abstractmethod
    def commit(
        self, decoded: Decoded, sketched: Sketch | None, ranges: Ranges, *, replaying: bool
    ) -> BatchResult:
        """Decide ``decoded`` (the batch of input ``ranges``, in time order) and make it
        durable; ``replaying``: it is the batch the index's intent announced. A strategy
        may leave the last steps (confirming its delivery, storing its offsets) to
        :meth:`deliver_pending`."""

    def deliver_pending(self) -> None:
        """Finish the batch :meth:`commit` left undelivered, if any (none here: each
        commit delivers its batch)."""
        return

    def drop_pending(self) -> None:
        """Forget the batch :meth:`commit` left undelivered (a failure: it is consumed
        again at the next start)."""
        return

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
            kafka_commit_failed(self._metrics, str(exc))

    def _committed(self, started: float) -> None:
        self._metrics.commits.inc()
        self._metrics.last_commit.set_to_current_time()
        self._metrics.commit_duration.observe(time.perf_counter() - started)


def next_offsets(ranges: Ranges) -> dict[TpKey, int]:
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
            kafka_commit_failed(metrics, "; ".join(errors))

    return report


def kafka_commit_failed(metrics: Metrics, error: str) -> None:
    metrics.kafka_commit_failures.inc()
    log.warning(
        "Kafka refused the offset commit; the index holds the true offsets",
        extra=fields(error=error, action="none needed; lag tools catch up at the next commit"),
    )
