"""Taking batches from the consumer: what has arrived, or the batch announced before a crash.

A batch is a set of input ranges (:mod:`.ranges`); a crash replays the ranges stored as
the batch's *intent*.

A batch takes the messages already fetched without waiting for more: it closes when none is
left, at ``batch.max_messages``, or ``batch.max_wait_ms`` after its first message, and goes
through the partition merge (:class:`~stream_dedup.service.ordering.PartitionMerge`): records
in document time across the assigned partitions, held back while an assigned partition has
nothing buffered, is not known to be at its end, and has been empty for less than
``batch.max_idle_ms``. After a crash the first batch is the one the index's intent announces,
collected until complete (``docs/commit-protocol.md``), then batching resumes.

On a shared index the release is also cut below the group's time order, and this
instance's next turn in it is known ahead: :class:`~.group_turns.GroupTurns`.

The :class:`Batcher` collects; :class:`~stream_dedup.service.lifecycle.BatchLife` alone calls
its verbs, so its state changes here and in :mod:`.group_turns` only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition

from stream_dedup.logs import LogThrottle, fields
from stream_dedup.service.config import BatchConfig
from stream_dedup.service.group_order import GroupOrder
from stream_dedup.service.group_turns import GroupTurns
from stream_dedup.service.kafka import consumed_records
from stream_dedup.service.ordering import PartitionMerge, RecordTime
from stream_dedup.service.ranges import (
    Ranges,
    TpKey,
    batch_ranges,
    done_for_intent,
    intent_reached,
    split_intent,
)

log = logging.getLogger("stream_dedup.service")

#: At most this many batches' worth of messages wait in the partition merge: beyond it,
#: a partition with nothing buffered is waited for only until ``batch.max_idle_ms``.
_HELD_BATCHES = 20


class Batcher:
    """The messages consumed but not yet processed, and how the next batch is cut from them."""

    def __init__(
        self,
        batch: BatchConfig,
        intent: Ranges | None,
        stop: threading.Event,
        time_of: Callable[[Message], int] | None = None,
        consumer: Consumer | None = None,
        group: GroupOrder | None = None,
        on_held: Callable[[list[Message]], None] | None = None,
    ) -> None:
        """``consumer`` is what batches are taken from (and partitions paused on);
        ``intent`` the ranges of a batch announced but not stored before the last stop;
        ``group`` the consumer group's time order on a shared index (else None);
        ``on_held`` is given the batch the group's order will release next while it holds
        this instance back (:meth:`collect`), to decide it meanwhile."""
        self._batch = batch
        self._stop = stop
        self._intent = intent
        self._consumer = consumer
        self._time_of = time_of if time_of is not None else RecordTime()
        #: The consumed messages not yet in a batch, per partition (the reorder stage).
        self.merge = PartitionMerge(batch.max_idle_ms / 1000.0, self._time_of)
        self._paused: set[TpKey] = set()
        self._assigned: set[TpKey] = set()
        #: When each pending message (by ``id``) was taken from the consumer.
        self._received_at: dict[int, float] = {}
        self._intent_warned_at = time.monotonic() - 15.0  # first warning after ~15 s
        #: A consume error that persists comes back at every poll that reports it: each
        #: kind (code, partition) is logged once a minute, with the count of those left out.
        self._errors = LogThrottle(60.0)
        #: This instance's place in the group's order (heads, next turn, the releases it
        #: expects); inert without the order.
        self.turns = GroupTurns(self.merge, self._time_of, group, on_held)

    # -- what it holds -------------------------------------------------------------------

    @property
    def intent(self) -> Ranges | None:
        """The ranges of the announced batch still to replay, or None when batching normally."""
        return self._intent

    @property
    def assigned(self) -> frozenset[TpKey]:
        return frozenset(self._assigned)

    @property
    def pending(self) -> list[Message]:
        """The messages consumed but not yet in a batch, partition by partition."""
        return self.merge.messages()

    def leaving(self, batch: list[Message]) -> tuple[dict[TpKey, tuple[int, int]], list[float]]:
        """A batch taken for processing leaves: its ranges, and when each of its messages
        was consumed (``perf_counter``; forgotten here, they were kept for the latency)."""
        received = self._received_at
        now = time.perf_counter()
        return batch_ranges(batch), [received.pop(id(msg), now) for msg in batch]

    # -- verbs of the batch's owner ------------------------------------------------------

    def decided(self, ranges: Ranges) -> None:
        """The batch of ``ranges`` is stored: its heads move on, told to the group at once."""
        self.turns.decided(ranges, self._assigned)

    def next_turn(self, skip: int = 0, *, whole: bool = False) -> list[Message]:
        """This instance's next turn in the group's order as buffered now
        (:meth:`.GroupTurns.next_turn`); empty without the order."""
        return self.turns.next_turn(self._batch.max_messages, self.watched(), skip, whole=whole)

    def assign(self, partitions: set[TpKey]) -> None:
        """The partitions are this consumer's now (fetching, not paused)."""
        self._assigned |= partitions
        self._paused -= partitions

    def forget(self, partitions: set[TpKey]) -> None:
        """The partitions are no longer this consumer's: their pending messages go too."""
        self._assigned -= partitions
        self._paused -= partitions
        self.merge.drop(partitions)
        self.turns.forget(partitions)

    def put_back(self, msgs: list[Message]) -> None:
        """The one batch released and not stored comes back, before everything pending."""
        self.turns.clear_inflight()
        self._refill(msgs + self.pending)

    def abandon(self) -> None:
        """Forget every pending message (consumed again from the stored offsets)."""
        self._refill([])
        self._received_at.clear()
        self.turns.clear_inflight()

    def take_pending(self) -> list[Message]:
        """Everything pending, as one batch (the partitions are about to go)."""
        batch = self.pending
        self._refill([])
        return batch

    def take_announced(self) -> list[Message]:
        """The announced batch if every message of it is here (the rest stays), else []."""
        intent = self._intent
        if intent is None or not intent_reached(self.pending, intent):
            return []
        batch, held = split_intent(self.pending, intent)
        self._refill(held)
        return batch

    def intent_done(self) -> None:
        """The announced batch is stored: batch normally, resume what waiting for it paused."""
        self._intent = None
        self.resume_all()

    def _refill(self, msgs: list[Message]) -> None:
        self.turns.forget_expected()
        self.merge.clear()
        for msg in msgs:
            self.merge.add(msg)

    def watched(self) -> set[TpKey]:
        """The partitions the merge waits for: assigned and fetching, or holding records."""
        return (self._assigned - self._paused) | self.merge.partitions()

    def collect(self, *, wait: bool = True) -> list[Message]:
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

        What is taken goes to the partition merge, which releases the batch in document
        time across partitions (:mod:`stream_dedup.service.ordering`); up to
        ``max_messages`` per watched partition are taken before releasing, so that every
        partition has its say. While a partition with nothing buffered holds the release
        back (at most ``batch.max_idle_ms``), the wait is spent taking more, a little at
        a time; with ``wait=False`` nothing is waited for.
        """
        consumer = self._consumer
        assert consumer is not None, "a Batcher collects from the consumer it was given"
        if self._intent is not None:
            return self._collect_intent(consumer, self._intent)
        limit = self._batch.max_messages
        merge, group = self.merge, self.turns.group
        if not merge:
            if group is not None:
                group.keep_alive(self.turns.heads(self._assigned))
            first = consumer.poll(0.2 if wait else 0.0)
            if first is None:
                return []
            self.take([first])
            if not merge:
                return []
        deadline = time.monotonic() + self._batch.max_wait_ms / 1000.0
        while not self._stop.is_set():
            watched = self.watched()
            room = limit * max(1, len(watched)) - len(merge)
            more = consumer.consume(min(limit, room), 0) if room > 0 else []
            self.take(more)
            if more and time.monotonic() < deadline:
                continue
            batch, held = self.turns.release(limit, self.watched(), self._assigned, consumer)
            if batch or not wait or not merge:
                return batch
            # Held back by a partition with nothing buffered: its records may be queued
            # behind the others' in the consumer, so take more (beyond the usual room,
            # up to a bound on memory) while waiting a little for them. Held back by the
            # group's watermark: take what is there, then wait for the member holding
            # this one back to hand the turn over (it wakes this one; the group's pause
            # is the longest wait).
            left = merge.blocking(self.watched())
            timeout = min(0.05, left if left is not None else 0.0)
            room = len(merge) < limit * _HELD_BATCHES
            if held is not None and group is not None:
                if room:
                    self.take(consumer.consume(limit, 0))
                if not self.turns.guessed(limit, self.watched()):
                    group.wait(group.pause(held.hold_ms))
            elif room:
                self.take(consumer.consume(limit, timeout))
            else:
                time.sleep(timeout)
            deadline = time.monotonic()
        return []

    def _collect_intent(self, consumer: Consumer, intent: Ranges) -> list[Message]:
        """The announced batch once every intent partition reached its end, else ``[]``.

        Messages beyond a range, or from other partitions, are held (in arrival order) for
        the next batch. Partitions with nothing more to give this batch are paused so the
        held messages stay few; they resume when the batch is complete.
        """
        missing = sorted(set(intent) - self._assigned)
        if missing:
            self.pause([tp for tp in self._assigned if tp not in self._paused])
            now = time.monotonic()
            if now - self._intent_warned_at > 30.0:
                self._intent_warned_at = now
                log.warning(
                    "waiting for the partitions of the batch to replay",
                    extra=fields(
                        missing=[f"{t}:{p}" for t, p in missing],
                        action="run one instance for all partitions of the input topics; "
                        "stop any other member of this consumer group",
                    ),
                )
            msg = consumer.poll(0.2)  # serves the rebalance callbacks
            if msg is not None:
                self.take([msg])
            return []
        if not intent_reached(self.pending, intent):
            self.take(consumer.consume(self._batch.max_messages, 0.2))
            unpaused = [tp for tp in self._assigned if tp not in self._paused]
            self.pause(done_for_intent(self.pending, unpaused, intent))
            if not intent_reached(self.pending, intent):
                return []
        return self.take_announced()

    def pause(self, partitions: list[TpKey]) -> None:
        if partitions and self._consumer is not None:
            self._consumer.pause([TopicPartition(t, p) for t, p in partitions])
            self._paused.update(partitions)

    def resume_all(self) -> None:
        """Resume what :meth:`pause` paused (fetching restarts after the last message seen)."""
        if self._paused and self._consumer is not None:
            live = [TopicPartition(t, p) for t, p in self._paused if (t, p) in self._assigned]
            if live:
                self._consumer.resume(live)
        self._paused.clear()

    def take(self, msgs: list[Message]) -> None:
        """Keep consumed messages for the batch; log (or raise, if fatal) consumer errors
        (:func:`~stream_dedup.service.kafka.consumed_records`)."""
        received = time.perf_counter()
        for msg in consumed_records(msgs, self._errors, self.merge.at_end):
            self.merge.add(msg)
            self._received_at[id(msg)] = received
