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

The :class:`Batcher` collects; :class:`~stream_dedup.service.lifecycle.BatchLife` alone calls
its verbs, so its state changes in this file only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition

from stream_dedup.logs import LogThrottle, fields
from stream_dedup.service.config import BatchConfig
from stream_dedup.service.group_order import GroupOrder, Watermark, own_heads
from stream_dedup.service.kafka import consumed_records
from stream_dedup.service.ordering import PartitionMerge, RecordTime
from stream_dedup.service.ranges import (
    Ranges,
    TpKey,
    batch_ranges,
    done_for_intent,
    intent_reached,
    position,
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
        self._group = group
        #: Per partition, the batches released but not yet stored: (end offset, time of
        #: the batch's first record there), oldest first. Their first is the partition's
        #: head for the group (:mod:`.group_order`).
        self._inflight: dict[TpKey, deque[tuple[int, int]]] = {}
        self._on_held = on_held
        #: The sizes of the next releases as this instance expects them (the batch
        #: handed to ``on_held``, the turn after it: :meth:`expect`): a release is cut to
        #: the first, so that where the guess was right it is that very batch.
        self._cuts: deque[int] = deque()
        #: Whether ``on_held`` was given the batch the next release is expected to be.
        self._guessed_next = False

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

    def heads(self) -> dict[TpKey, tuple[str, int]]:
        """What comes next on each assigned partition, as the group's heads say it."""
        inflight = {tp: runs[0][1] for tp, runs in self._inflight.items() if runs}
        return own_heads(inflight, self.merge.heads(), self._assigned, self.merge.caught_up)

    def decided(self, ranges: Ranges) -> None:
        """The batch of ``ranges`` is stored: its heads move on, told to the group at once."""
        for tp, (_start, end) in ranges.items():
            runs = self._inflight.get(tp)
            while runs and runs[0][0] <= end:
                runs.popleft()
        if self._group is not None:
            self._group.exchange(self.heads())

    def _track(self, batch: list[Message]) -> None:
        """A released batch's first time and end per partition (:meth:`decided`)."""
        firsts: dict[TpKey, tuple[int, int]] = {}
        for msg in batch:
            topic, partition, offset = position(msg)
            tp = (topic, partition)
            first = firsts.get(tp)
            if first is None or offset < first[0]:
                firsts[tp] = (offset, self._time_of(msg))
        for tp, (_start, end) in batch_ranges(batch).items():
            self._inflight.setdefault(tp, deque()).append((end, firsts[tp][1]))

    def assign(self, partitions: set[TpKey]) -> None:
        """The partitions are this consumer's now (fetching, not paused)."""
        self._assigned |= partitions
        self._paused -= partitions

    def forget(self, partitions: set[TpKey]) -> None:
        """The partitions are no longer this consumer's: their pending messages go too."""
        self._assigned -= partitions
        self._paused -= partitions
        self.merge.drop(partitions)
        self.forget_expected()
        for tp in partitions:
            self._inflight.pop(tp, None)

    def put_back(self, msgs: list[Message]) -> None:
        """The one batch released and not stored comes back, before everything pending."""
        self._inflight.clear()
        self._refill(msgs + self.pending)

    def abandon(self) -> None:
        """Forget every pending message (consumed again from the stored offsets)."""
        self._refill([])
        self._received_at.clear()
        self._inflight.clear()

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
        self.forget_expected()
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
        merge = self.merge
        if not merge:
            if self._group is not None:
                self._group.keep_alive(self.heads())
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
            batch, held = self._release(limit)
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
            if held is not None and self._group is not None:
                if room:
                    self.take(consumer.consume(limit, 0))
                if not self._guessed(limit):
                    self._group.wait(self._group.pause(held.hold_ms))
            elif room:
                self.take(consumer.consume(limit, timeout))
            else:
                time.sleep(timeout)
            deadline = time.monotonic()
        return []

    def _release(self, limit: int) -> tuple[list[Message], Watermark | None]:
        """The merge's next batch, below the group's watermark on a shared index; and the
        watermark when it alone held the batch back."""
        group = self._group
        if group is None:
            return self.merge.release(limit, self.watched()), None
        if self._consumer is not None:
            group.learn_partitions(self._consumer)
        group.exchange(self.heads())
        mark = group.watermark(self._assigned)
        cap = min(limit, self._cuts[0]) if self._cuts else limit
        batch = self.merge.release(cap, self.watched(), mark.ceiling, group.token)
        if batch:
            if self._cuts:
                self._cuts.popleft()
            self._guessed_next = False
            group.released()
            self._track(batch)
            return batch, None
        if not self.merge or self.merge.blocking(self.watched()) is not None:
            return [], None  # held back by a partition of this instance
        return [], mark

    def next_turn(self, skip: int = 0, *, whole: bool = False) -> list[Message]:
        """This instance's next turn in the group's order as buffered now: its records of
        the first tick (after the first ``skip``: the turn after a batch expected but
        not released yet; ``whole``: only once no record fetched later can join it).
        Empty without the group's order."""
        group = self._group
        if group is None:
            return []
        limit, watched = self._batch.max_messages, self.watched()
        merge = self.merge
        return merge.first_tick(limit, watched, group.tick_ms, group.token, skip, whole=whole)

    def expect(self, size: int) -> None:
        """Cut the release after those expected already at ``size`` (sketched for it)."""
        self._cuts.append(size)

    @property
    def expecting(self) -> bool:
        """Whether a release is expected already (its records are being worked on)."""
        return bool(self._cuts)

    def forget_expected(self) -> None:
        """Expect nothing: releases go uncut."""
        self._cuts.clear()
        self._guessed_next = False

    def _guessed(self, limit: int) -> bool:
        """While the group's order holds this instance back: hand ``on_held`` the batch
        it will be given once the others have passed its first tick (its records of that
        tick, :meth:`next_turn`, cut to an expected release), once per release; True if it
        was handed over now (the work took a while: the watermark is looked at again).

        The group's order goes tick by tick and, within a tick, member by member, so the
        records of the first tick are what the next release holds (or its start, cut to
        them, when the others pass more than one tick at once); where others' heads or
        new records change that, the release differs and is decided as usual."""
        if self._on_held is None or self._guessed_next:
            return False
        guess = self.next_turn()[: self._cuts[0] if self._cuts else limit]
        if not guess:
            return False
        if not self._cuts:
            self._cuts.append(len(guess))
        self._guessed_next = True
        self._on_held(guess)
        return True

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
