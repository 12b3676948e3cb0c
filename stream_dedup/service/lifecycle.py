"""One owner for a batch's life: taken, decided, committed; or dropped when its partitions go.

A batch's life has few verbs, and :class:`BatchLife` is the only place that performs them:
**turn** (take the next batch through the
:class:`~stream_dedup.service.batches.Batcher`, hand it to the sketch worker of
:mod:`.prefetch`, commit the batch before it through the commit strategy chosen at start,
:mod:`stream_dedup.service.checkpoint`), **assign**, **revoke** and **lose** (partitions
move: what each does is written down in ``docs/commit-protocol.md``, "Rebalances"),
**intent done** (the batch announced before a crash is stored: batch normally again),
**finish** (a stop) and **abandon** (a failure: decide nothing more; everything from the
last stored batch on is consumed again at the next start).

librdkafka calls :meth:`assign`, :meth:`revoke` and :meth:`lose` from inside ``consume``,
on the loop's own thread, so they may commit as :meth:`turn` does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    Consumer,
    Message,
    TopicPartition,
)

from stream_dedup.core.sketch import Sketch
from stream_dedup.dedup import BatchResult
from stream_dedup.index import DedupIndex
from stream_dedup.logs import fields
from stream_dedup.service.batches import Batcher
from stream_dedup.service.checkpoint import CommitStrategy
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.group_order import GroupOrder
from stream_dedup.service.inputs import Decoded, InputDecoder, MessageBatch
from stream_dedup.service.lost_index import check_empty_index, check_offsets_retained
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.ordering import RecordTime, TickedTime, time_order
from stream_dedup.service.prefetch.ahead import SketchAhead
from stream_dedup.service.ranges import TpKey
from stream_dedup.service.time_warnings import TimeWarnings

log = logging.getLogger("stream_dedup.service")

#: librdkafka's logical offsets, as the logs say them.
_LOGICAL_OFFSETS = {
    OFFSET_INVALID: "group offset",
    OFFSET_STORED: "group offset",
    OFFSET_BEGINNING: "earliest",
    OFFSET_END: "latest",
}


def _where(offset: int) -> str:
    """An assigned partition's start, as words for librdkafka's logical offsets."""
    return _LOGICAL_OFFSETS.get(offset, str(offset))


class BatchLife:
    """Everything that happens to the service's batches, from consume to commit."""

    def __init__(
        self,
        config: ServiceConfig,
        index: DedupIndex,
        consumer: Consumer,
        strategy: CommitStrategy,
        ahead: SketchAhead,
        inputs: InputDecoder,
        metrics: Metrics,
        stop: threading.Event,
    ) -> None:
        self._index = index
        self._strategy = strategy
        self._ahead = ahead
        self._inputs = inputs
        self._metrics = metrics
        self._on_lost = config.index.on_lost
        self._inline_max = config.service.sketch_inline_max
        self._time_of = RecordTime(config.input.time_field)
        self._time_warnings = TimeWarnings(config.input.time_field, metrics)
        intent = strategy.stored_intent()  # waits out a shared index's outage
        self._group = _group_order(config, index, strategy)
        #: The order's time: the group's tick on a shared index, else the record's time.
        self._order_time: Callable[[Message], int] = (
            self._time_of if self._group is None else TickedTime(self._time_of, self._group.tick_ms)
        )
        decide_held = self._group is not None and config.index.redis.decide_ahead
        self._batches = Batcher(
            config.batch,
            intent,
            stop,
            self._order_time,
            consumer,
            group=self._group,
            on_held=self._decide_held if decide_held else None,
        )
        #: The batch the group's order held back, decided meanwhile: its messages, the
        #: batch decoded and its sketch (:meth:`_decide_held`).
        self._held: tuple[list[Message], Decoded, Sketch] | None = None
        strategy.on_stored = self._batches.decided
        strategy_name = config.kafka.get("partition.assignment.strategy", "")
        self._cooperative = (
            "cooperative" in strategy_name or config.kafka.get("group.protocol") == "consumer"
        )

    @property
    def assigned(self) -> int:
        """How many partitions are this instance's now."""
        return len(self._batches.assigned)

    # -- the loop's verbs ----------------------------------------------------------------

    def start(self) -> None:
        """Say what the first batch is: the one announced before the last stop, if any."""
        intent = self._batches.intent
        if intent is None:
            return
        delivered = self._strategy.replay_delivered(intent)
        log.info(
            "replaying the batch announced before the last stop",
            extra=fields(
                ranges=[f"{t}:{p}@{a}-{b}" for (t, p), (a, b) in sorted(intent.items())],
                delivered=delivered,
                action=self._strategy.replay_action,
            ),
        )

    def turn(self) -> bool:
        """Take the next batch and commit the one before it; True if messages came."""
        wait = not self._ahead.holding
        batches = self._batches
        from_intent = batches.intent is not None
        batch = batches.collect(wait=wait)
        # The batch before it, produced, confirmed only now: its broker round trip ran
        # beside collecting (and, in the group's order, waiting and deciding ahead).
        self._strategy.deliver_pending()
        self._metrics.reorder_waiting.set(len(batches.merge))
        if self._group is not None:
            self._metrics.group_order_wait.inc(self._group.take_waited())
            for outcome, looks in self._group.ends.take_looks().items():
                self._metrics.end_looks.labels(outcome).inc(looks)
        held, self._held = self._held, None
        if held is not None and batch and not _same(held[0], batch):
            self._metrics.decided_ahead.labels("dropped").inc()
            held = None
        if from_intent:  # the announced batch is decided alone, not ahead
            if batch:
                self._process(self._decode(batch), None)
        elif held is not None:
            self._metrics.decided_ahead.labels("used").inc()
            self._process(held[1], held[2])  # nothing is held ahead: it waited for this
        elif batch and (early := self._early(batch)) is not None:
            self._process(*early)
        else:
            if batch:
                self._batches.turns.forget_expected()
            self._ahead.advance(self._read(batch) if batch else None, self._process)
        self._keep_worker_busy()
        return bool(batch)

    def _keep_worker_busy(self) -> None:
        """In the group's order, a worker left with nothing to do sketches this
        instance's next turn: e.g. after a batch that came without one sketched early
        (the first of a backlog, or one the guess missed), which would otherwise leave
        the next turn, then the one decided ahead, to be sketched here."""
        batches = self._batches
        if (
            self._group is not None
            and self._ahead.idle
            and self._held is None
            and batches.intent is None
            and not batches.turns.expecting
        ):
            self._sketch_next(batches.next_turn(whole=True))

    def _early(self, batch: list[Message]) -> tuple[Decoded, Sketch | None] | None:
        """``batch`` decoded and sketched by the worker while the last one was decided,
        if it is the turn it was asked for; then the worker starts on the turn after."""
        early = self._ahead.take_early(batch)
        if early is not None:
            self._sketch_next(self._batches.next_turn(whole=True))
        return early

    def _sketch_next(self, turn: list[Message]) -> None:
        """Have the worker sketch ``turn``, this instance's next turn in the group's
        order, while this one is decided; its release is expected to be that. A turn of
        at most ``service.sketch_inline_max`` records is left to be sketched here when
        it comes, as a small batch is (:class:`SketchAhead`): the worker's round trip
        costs more than its sketch, and a live stream's next tick is seldom complete."""
        if len(turn) > self._inline_max and self._ahead.sketch_early(turn, self._read(turn)):
            self._batches.turns.expect(len(turn))

    def finish(self) -> None:
        """Commit the batch held ahead (a stop: the consumer's revoke commits the rest)."""
        self._ahead.drain(self._process)
        self._strategy.deliver_pending()
        if self._group is not None:
            self._group.close()

    def abandon(self) -> None:
        """Decide nothing more: forget what was collected, consumed again at the next start.

        Closing the consumer revokes its partitions, and the revoke would commit what was
        collected since a failed batch, storing offsets past it.
        """
        self._batches.abandon()
        self._ahead.take_back()
        self._strategy.drop_pending()
        if self._group is not None:
            self._group.close()

    # -- the consumer's rebalance callbacks ------------------------------------------------

    def assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Seek every assigned partition to the offset stored in the index (or the intent's).

        An index with no offsets and no documents while the group has committed offsets
        was lost, and index offsets must lie within what the broker retains:
        ``index.on_lost`` decides (:mod:`.lost_index`).
        """
        self._metrics.rebalances.labels("assign").inc()
        stored = self._strategy.stored_offsets()  # waits out a shared index's outage
        if self._group is not None:
            self._group.partitions_changed()
        intent = self._batches.intent or {}
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in intent:
                tp.offset = intent[key][0]
            elif key in stored:
                tp.offset = stored[key]
        location = self._index.location
        documents = self._strategy.stored_documents
        if not stored and not intent and documents() == 0:
            check_empty_index(consumer, partitions, location, self._on_lost, documents)
        else:
            check_offsets_retained(consumer, partitions, location, self._on_lost)
        self._batches.assign({(tp.topic, tp.partition) for tp in partitions})
        log.info(
            "partitions assigned",
            extra=fields(
                partitions=[f"{tp.topic}:{tp.partition}@{_where(tp.offset)}" for tp in partitions],
                source="index offsets (others: the group's offset, else auto.offset.reset)",
            ),
        )
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        self._metrics.assigned.set(self.assigned)

    def revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what was collected before the partitions go (see the module docstring)."""
        self._metrics.rebalances.labels("revoke").inc()
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        self._strategy.deliver_pending()  # its offsets stored before the partitions go
        self._ahead.drain(self._process)
        batches = self._batches
        announced = batches.take_announced()
        if announced:
            self._process(self._decode(announced), None)
        batch: list[Message] = []
        if batches.intent is None and self._group is None:
            # In the group's time order (shared index) what is pending waits for the
            # watermark instead: it is dropped, and its partitions' next owners consume
            # it again from the offsets stored in the index.
            batch = batches.take_pending()
            if batch:
                self._process(self._decode(batch), None)
        else:
            batches.resume_all()
        self._forget(revoked)
        log.info(
            "partitions revoked",
            extra=fields(
                partitions=[f"{tp.topic}:{tp.partition}" for tp in partitions],
                checkpointed=len(batch),
            ),
        )
        if self._cooperative:
            consumer.incremental_unassign(partitions)

    def lose(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a revoke: drop their uncommitted messages (replayed later)."""
        self._metrics.rebalances.labels("lost").inc()
        lost = {(tp.topic, tp.partition) for tp in partitions}
        self._batches.put_back(self._ahead.take_back())  # not decided yet: collected again
        self._forget(lost)
        log.warning(
            "partitions lost",
            extra=fields(
                partitions=sorted(f"{t}:{p}" for t, p in lost),
                action=(
                    "the session with the group coordinator expired (broker unreachable or"
                    " the loop stalled longer than session.timeout.ms); their uncommitted"
                    " messages are decided again when the partitions come back"
                ),
            ),
        )

    def _forget(self, partitions: set[TpKey]) -> None:
        """Partitions leave: their pending records go (consumed again by their next owner)."""
        self._held = None
        self._batches.forget(partitions)
        self._metrics.assigned.set(self.assigned)

    # -- one batch -----------------------------------------------------------------------

    def _read(self, batch: list[Message]) -> MessageBatch:
        """The batch in time order, with its sources (decoding starts from this)."""
        return self._inputs.read(time_order(batch, self._order_time))

    def _decide_held(self, batch: list[Message]) -> None:
        """While the group's order holds this instance back (the member before it is
        deciding its turn), decide the batch it will be given next, so that only the
        lease's settling is left when it comes (``docs/group-order.md``, "Deciding
        ahead"). Nothing of it leaves the process: a release that is not this batch
        drops it."""
        early = self._ahead.take_early(batch)
        decoded, sketched = early if early is not None else (self._decode(batch), None)
        self._sketch_next(self._batches.next_turn(skip=len(batch), whole=True))
        sketched = self._strategy.decide_ahead(decoded, sketched)
        self._held = None if sketched is None else (batch, decoded, sketched)
        # The wait for the release may be long (a member gone: up to batch.max_idle_ms):
        # the last batch's delivery is confirmed before it, not after.
        self._strategy.deliver_pending()

    def _decode(self, batch: list[Message]) -> Decoded:
        """The batch in time order, decoded here (the first step of processing it)."""
        return self._inputs.decode(self._read(batch))

    def _process(self, decoded: Decoded, sketched: Sketch | None) -> None:
        """Decide (in time order) and commit one decoded batch; then account for it."""
        started = time.perf_counter()
        batch = decoded.batch
        self._metrics.consumed.inc(len(batch))
        self._metrics.batch_size.observe(len(batch))
        replaying = self._batches.intent is not None
        ranges, received = self._batches.leaving(batch)
        result = self._strategy.commit(decoded, sketched, ranges, replaying=replaying)
        if replaying:
            self._batches.intent_done()
        # A shared index's strategy confirms the delivery later (beside the next batch):
        # the batch's latency is measured to its produce, not to that.
        self._observe(batch, result, started, received)
        self._time_warnings.observe(len(decoded.docs), decoded.time_field_missing, result.stats)

    def _observe(
        self, batch: list[Message], result: BatchResult, started: float, received: list[float]
    ) -> None:
        """The metrics of a committed batch."""
        done = time.perf_counter()
        times = [self._time_of(m) for m in batch]
        duplicates = sum(v.is_duplicate for v in result.verdicts)
        self._metrics.observe_batch(
            done - started,
            [done - t for t in received],
            (duplicates, len(result.verdicts) - duplicates),
            result.stats,
            times,
            time.time(),
        )


def _same(guess: list[Message], batch: list[Message]) -> bool:
    """Whether the released batch is the one decided ahead: the same records, taken in
    the same order."""
    return len(guess) == len(batch) and all(a is b for a, b in zip(guess, batch, strict=True))


def _group_order(
    config: ServiceConfig, index: DedupIndex, strategy: CommitStrategy
) -> GroupOrder | None:
    """The consumer group's time order on a shared index (``index.redis.group_order``),
    else None: one instance's partition merge orders its own partitions alone."""
    if not index.shared or not config.index.redis.group_order:
        return None
    heads = index.group_heads(str(config.kafka.get("group.id", "")))
    if heads is None:
        return None
    return GroupOrder(
        heads,
        config.input.topics,
        config.batch.max_idle_ms,
        ride_out=strategy.ride_out,
        tick_ms=config.index.redis.order_tick_ms,
    )
