"""This instance's turns in the group's time order on a shared index, for the batcher.

:mod:`.group_order` says below what time the group lets this instance decide; this is
what the :class:`~stream_dedup.service.batches.Batcher` keeps to take part in it: the
heads it publishes (per partition, the first batch released and not stored yet, else
what comes next), the release cut below the group's watermark, and its *next turn*
(its records of the first tick buffered), which is handed over while the order holds
this instance back (``on_held``, to decide it meanwhile) and given to the sketch worker
early. The sizes of the releases expected so are kept here, so that a release is cut to
the batch worked on ahead and, where the guess was right, is that very batch.

Without the group's order (a RocksDB index, or ``index.redis.group_order = false``) it
keeps nothing and releases what the partition merge releases.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from confluent_kafka import Consumer, Message

from stream_dedup.service.group_order import GroupOrder, Watermark, own_heads
from stream_dedup.service.ordering import PartitionMerge
from stream_dedup.service.ranges import Ranges, TpKey, batch_ranges, position

__all__ = ["GroupTurns"]


class GroupTurns:
    """The heads, releases and next turns of this instance in the group's order."""

    def __init__(
        self,
        merge: PartitionMerge,
        time_of: Callable[[Message], int],
        group: GroupOrder | None = None,
        on_held: Callable[[list[Message]], None] | None = None,
    ) -> None:
        """``merge`` holds the records not in a batch yet; ``group`` is the consumer
        group's time order (None: none); ``on_held`` is given the batch the order will
        release next while it holds this instance back (:meth:`guessed`)."""
        self._merge = merge
        self._time_of = time_of
        self.group = group
        self._on_held = on_held
        #: Per partition, the batches released but not yet stored: (end offset, time of
        #: the batch's first record there), oldest first. Their first is the partition's
        #: head for the group (:mod:`.group_order`).
        self._inflight: dict[TpKey, deque[tuple[int, int]]] = {}
        #: The sizes of the next releases as this instance expects them (the batch
        #: handed to ``on_held``, the turn after it: :meth:`expect`): a release is cut to
        #: the first, so that where the guess was right it is that very batch.
        self._cuts: deque[int] = deque()
        #: Whether ``on_held`` was given the batch the next release is expected to be.
        self._guessed_next = False

    def heads(self, assigned: set[TpKey]) -> dict[TpKey, tuple[str, int]]:
        """What comes next on each assigned partition, as the group's heads say it."""
        inflight = {tp: runs[0][1] for tp, runs in self._inflight.items() if runs}
        return own_heads(inflight, self._merge.heads(), assigned, self._merge.caught_up)

    def decided(self, ranges: Ranges, assigned: set[TpKey]) -> None:
        """The batch of ``ranges`` is stored: its heads move on, told to the group at once."""
        for tp, (_start, end) in ranges.items():
            runs = self._inflight.get(tp)
            while runs and runs[0][0] <= end:
                runs.popleft()
        if self.group is not None:
            self.group.exchange(self.heads(assigned))

    def release(
        self,
        limit: int,
        watched: set[TpKey],
        assigned: set[TpKey],
        consumer: Consumer | None,
    ) -> tuple[list[Message], Watermark | None]:
        """The merge's next batch, below the group's watermark on a shared index; and the
        watermark when it alone held the batch back."""
        group = self.group
        if group is None:
            return self._merge.release(limit, watched), None
        if consumer is not None:
            group.learn_partitions(consumer)
        group.exchange(self.heads(assigned))
        mark = group.watermark(assigned)
        if consumer is not None and self._may_release(mark, watched, group.token):
            # only a release that would go ahead asks the broker for the others' ends: a
            # look can hold it back, never let more through
            mark = group.watermark(assigned, consumer, self._merge.taken)
        cap = min(limit, self._cuts[0]) if self._cuts else limit
        batch = self._merge.release(cap, watched, mark.ceiling, group.token)
        if batch:
            if self._cuts:
                self._cuts.popleft()
            self._guessed_next = False
            group.released()
            self._track(batch)
            return batch, None
        if not self._merge or self._merge.blocking(watched) is not None:
            return [], None  # held back by a partition of this instance
        return [], mark

    def _may_release(self, mark: Watermark, watched: set[TpKey], token: str) -> bool:
        """Whether the merge would release a record below ``mark`` now."""
        merge = self._merge
        if mark.hold_ms is not None or not merge or merge.blocking(watched) is not None:
            return False
        ceiling = mark.ceiling
        return ceiling is None or any((t, token, tp) < ceiling for tp, t in merge.heads().items())

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

    def next_turn(
        self, limit: int, watched: set[TpKey], skip: int = 0, *, whole: bool = False
    ) -> list[Message]:
        """This instance's next turn in the group's order as buffered now: its records of
        the first tick (after the first ``skip``: the turn after a batch expected but
        not released yet; ``whole``: only once no record fetched later can join it).
        Empty without the group's order."""
        group = self.group
        if group is None:
            return []
        return self._merge.first_tick(limit, watched, group.tick_ms, group.token, skip, whole=whole)

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

    def forget(self, partitions: set[TpKey]) -> None:
        """The partitions went: nothing of them is in flight, and no release expected."""
        self.forget_expected()
        for tp in partitions:
            self._inflight.pop(tp, None)

    def clear_inflight(self) -> None:
        """No batch released is in flight any more (put back or abandoned)."""
        self._inflight.clear()

    def guessed(self, limit: int, watched: set[TpKey]) -> bool:
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
        guess = self.next_turn(limit, watched)[: self._cuts[0] if self._cuts else limit]
        if not guess:
            return False
        if not self._cuts:
            self._cuts.append(len(guess))
        self._guessed_next = True
        self._on_held(guess)
        return True
