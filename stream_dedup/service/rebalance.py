"""What the loop does when the group moves partitions: seek, checkpoint, or drop.

librdkafka calls these from inside the consumer's ``consume`` (on the loop's own thread),
so they may decide and checkpoint like the loop does. Three events:

* **assign**: every partition is sought to the offset stored in the index, not to the
  group's committed offset (the index is the source of truth, see
  :mod:`stream_dedup.service.checkpoint`); a partition named by a pending batch intent goes to the
  intent's start, so the announced batch is read again whole.
* **revoke**: what was collected is checkpointed before the partitions go, except while an
  intent is pending and its batch is not complete: then the revoked partitions' messages
  are dropped and read again from the index offsets at the next assignment.
* **lost** (the session expired, no revoke): nothing can be committed for the partitions
  any more; their uncommitted messages are dropped and decided again when they come back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition

from stream_dedup.core.sketch import Sketch
from stream_dedup.index import DedupIndex
from stream_dedup.logs import fields
from stream_dedup.service.batches import Batcher, TpKey
from stream_dedup.service.checkpoint import intent_reached, split_intent
from stream_dedup.service.inputs import Decoded
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.prefetch.ahead import SketchAhead

log = logging.getLogger("stream_dedup.service")

#: Decides and checkpoints one decoded batch (the service's batch step).
Process = Callable[[Decoded, Sketch | None], None]


class Rebalance:
    """The consumer's ``on_assign``, ``on_revoke`` and ``on_lost`` callbacks for one loop."""

    def __init__(
        self,
        index: DedupIndex,
        batches: Batcher,
        metrics: Metrics,
        *,
        cooperative: bool,
        process: Process,
        decode: Callable[[list[Message]], Decoded],
        ahead: Callable[[], SketchAhead | None],
    ) -> None:
        self._index = index
        self._batches = batches
        self._metrics = metrics
        self._cooperative = cooperative
        self._process = process
        self._decode = decode
        self._ahead = ahead

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Seek every assigned partition to the offset stored in the index (or the intent's)."""
        self._metrics.rebalances.labels("assign").inc()
        stored = self._index.offsets()
        batches = self._batches
        intent = batches.intent or {}
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in intent:
                tp.offset = intent[key][0]
            elif key in stored:
                tp.offset = stored[key]
            batches.assigned.add(key)
            batches.paused.discard(key)
        log.info(
            "partitions assigned",
            extra=fields(
                partitions=[f"{tp.topic}:{tp.partition}@{tp.offset}" for tp in partitions],
                source="index offsets (others: group offset or auto.offset.reset)",
            ),
        )
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        self._metrics.assigned.set(len(batches.assigned))

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Checkpoint what was collected before the partitions go (see the module docstring)."""
        self._metrics.rebalances.labels("revoke").inc()
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        ahead = self._ahead()
        if ahead is not None:
            ahead.drain(self._process)
        b = self._batches
        if b.intent is not None and intent_reached(b.pending, b.intent):
            announced, b.pending = split_intent(b.pending, b.intent)
            self._process(self._decode(announced), None)
        if b.intent is None:
            batch, b.pending = b.pending, []
            if batch:
                self._process(self._decode(batch), None)
        else:
            batch = []
            b.drop(revoked)
            b.resume_all()
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

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a revoke: drop their uncommitted messages (replayed later)."""
        self._metrics.rebalances.labels("lost").inc()
        lost = {(tp.topic, tp.partition) for tp in partitions}
        b = self._batches
        ahead = self._ahead()
        if ahead is not None:  # not decided yet: back to the collected messages
            b.pending = ahead.take_back() + b.pending
        b.drop(lost)
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
        """The partitions are no longer this consumer's."""
        b = self._batches
        b.assigned -= partitions
        b.paused -= partitions
        b.drop(partitions)
        self._metrics.assigned.set(len(b.assigned))
