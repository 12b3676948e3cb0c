"""Deciding in document time across partitions: each record's time, and the partition merge.

Kafka orders records within a partition only, so deciding a multi-partition topic in
(topic, partition, offset) order would decide a later copy on partition 0 before its
original on partition 1, and call the original the duplicate of its copy. Two parts fix
that, the way Kafka Streams' partition group does:

* :class:`PartitionMerge` buffers consumed records per partition and releases them one at
  a time, always the head with the smallest time across partitions, but only while every
  partition it watches has a buffered record, is known to be at its end (a
  ``_PARTITION_EOF`` event since its last record), or has been empty longer than
  ``batch.max_idle_ms``. A partition is always released from its head, in offset order,
  so what one batch takes is a contiguous offset range per partition and the batch
  intent keeps working.
* :func:`time_order` is the order a batch is decided in: the merge of the batch's
  per-partition runs by (time, topic, partition) of their heads. It depends only on the
  records in the batch (their times), never on fetch timing, so a batch replayed from its
  intent is decided exactly as the first time. When each partition's times do not
  decrease with offset it equals sorting by (time, topic, partition, offset); a record
  whose time is earlier than its predecessor's on the same partition is decided after
  it (a partition is never reordered internally, or a batch's prefix would not be an
  offset range).

A record's time (:class:`RecordTime`) is the Kafka message timestamp, or a JSON field of
the value (``input.time_field``: epoch milliseconds, or ISO-8601, naive meaning UTC). A
document whose field is missing or unparseable falls back to the message timestamp: it is
still decided (a dead letter would drop a good document for a metadata problem), and the
fallback is a function of the record, so a replay orders it the same way.
"""

from __future__ import annotations

import heapq
import json
import time
from collections import deque
from collections.abc import Callable, Iterable

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from stream_dedup.decode import parse_time

TpKey = tuple[str, int]


def _tp(msg: Message) -> TpKey:
    topic, partition = msg.topic(), msg.partition()
    assert topic is not None and partition is not None
    return topic, partition


def _offset(msg: Message) -> int:
    offset = msg.offset()
    assert offset is not None
    return offset


class RecordTime:
    """The time (epoch milliseconds) a record is ordered by."""

    def __init__(self, field: str = "") -> None:
        """``field`` empty: the message timestamp; else that JSON field of the value."""
        self.field = field

    def __call__(self, msg: Message) -> int:
        ts_type, ts = msg.timestamp()
        return self.at(msg.value(), ts if ts_type != TIMESTAMP_NOT_AVAILABLE else None)

    def at(self, value: bytes | str | None, timestamp: int | None) -> int:
        """The time of a record with this value and message timestamp (0: none known)."""
        return self.found(value, timestamp)[0]

    def found(self, value: bytes | str | None, timestamp: int | None) -> tuple[int, bool]:
        """:meth:`at`, and whether ``field`` was missing or unreadable in ``value`` (so
        the time is the message timestamp's); always False when no field is named."""
        if self.field:
            parsed = self._from_field(value)
            if parsed is not None:
                return parsed, False
            return (timestamp if timestamp is not None else 0), True
        return (timestamp if timestamp is not None else 0), False

    def _from_field(self, value: bytes | str | None) -> int | None:
        """The field's time, or None when it is missing or cannot be read."""
        if value is None:
            return None
        try:
            obj = json.loads(value)
        except (ValueError, UnicodeDecodeError):
            return None
        raw = obj.get(self.field) if isinstance(obj, dict) else None
        return parse_time(raw)


class TickedTime:
    """A record's time for the order, cut down to a multiple of ``tick_ms``.

    The consumer group's order on a shared index (``index.redis.order_tick_ms``,
    ``docs/group-order.md``) counts time in ticks, so that records of one tick go by
    (topic, partition), then offset, in the merge, in a batch and across instances
    alike: one order, whose hand-overs between instances come about once per tick and
    owner instead of at every record where keyed partitions interleave. Only the order
    uses it; a document's own time (retention, metrics) stays exact.
    """

    def __init__(self, time_of: Callable[[Message], int], tick_ms: int) -> None:
        self.time_of = time_of
        self.tick_ms = tick_ms

    def __call__(self, msg: Message) -> int:
        return self.time_of(msg) // self.tick_ms * self.tick_ms


def time_order(msgs: Iterable[Message], time_of: Callable[[Message], int]) -> list[Message]:
    """The batch in the order it is decided: see the module docstring.

    Each partition's records in offset order, merged by their heads' (time, topic,
    partition). A function of the records alone, so a replay gets the same order.
    """
    runs: dict[TpKey, list[tuple[int, int, Message]]] = {}
    for msg in msgs:
        runs.setdefault(_tp(msg), []).append((_offset(msg), time_of(msg), msg))
    queues: dict[TpKey, deque[tuple[int, Message]]] = {}
    for tp, run in runs.items():
        run.sort(key=lambda r: r[0])
        queues[tp] = deque((t, m) for _o, t, m in run)
    heap = [(q[0][0], tp) for tp, q in queues.items()]
    heapq.heapify(heap)
    out: list[Message] = []
    while heap:
        _t, tp = heapq.heappop(heap)
        q = queues[tp]
        out.append(q.popleft()[1])
        if q:
            heapq.heappush(heap, (q[0][0], tp))
    return out


class PartitionMerge:
    """Per-partition buffers of consumed records, released in time order (module docstring)."""

    def __init__(
        self,
        max_idle_s: float,
        time_of: Callable[[Message], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_idle_s = max_idle_s
        self.time_of = time_of
        self._clock = clock
        self._buffers: dict[TpKey, deque[tuple[int, Message]]] = {}
        self._size = 0
        #: Partitions whose end was reported (``_PARTITION_EOF``) after their last record,
        #: with the end offset it was reported at (-1: not known).
        self.caught_up: dict[TpKey, int] = {}
        #: Records added since the start: a count that moves whenever something new was
        #: taken from the consumer (what a look at other partitions' ends is valid for).
        self.taken = 0
        #: When each watched partition was last found, or left, empty.
        self._empty_since: dict[TpKey, float] = {}

    def __len__(self) -> int:
        return self._size

    def add(self, msg: Message) -> None:
        """Buffer a consumed record (records of a partition arrive in offset order)."""
        tp = _tp(msg)
        self._buffers.setdefault(tp, deque()).append((self.time_of(msg), msg))
        self._size += 1
        self.taken += 1
        self.caught_up.pop(tp, None)
        self._empty_since.pop(tp, None)

    def at_end(self, tp: TpKey, offset: int = -1) -> None:
        """The consumer reached the end of ``tp`` (at ``offset``, the next record's offset
        there): an empty buffer there holds nothing back."""
        self.caught_up[tp] = offset

    def partitions(self) -> set[TpKey]:
        """Partitions with buffered records."""
        return {tp for tp, buf in self._buffers.items() if buf}

    def messages(self) -> list[Message]:
        """Every buffered record, partition by partition in offset order."""
        return [m for buf in self._buffers.values() for _t, m in buf]

    def clear(self) -> list[Message]:
        """Take every buffered record out (see :meth:`messages`)."""
        out = self.messages()
        self._buffers.clear()
        self._size = 0
        return out

    def drop(self, partitions: set[TpKey]) -> None:
        """Forget the records and state of ``partitions`` (they are no longer consumed)."""
        for tp in partitions:
            buf = self._buffers.pop(tp, None)
            if buf is not None:
                self._size -= len(buf)
            self.caught_up.pop(tp, None)
            self._empty_since.pop(tp, None)

    def blocking(self, watched: Iterable[TpKey], now: float | None = None) -> float | None:
        """Seconds until the first empty watched partition stops holding the merge back;
        None when none holds it back (0.0 never: an expired one no longer holds)."""
        now = self._clock() if now is None else now
        wait: float | None = None
        for tp in watched:
            if self._buffers.get(tp) or tp in self.caught_up:
                continue
            since = self._empty_since.setdefault(tp, now)
            left = since + self.max_idle_s - now
            if left > 0:
                wait = left if wait is None else min(wait, left)
        return wait

    def heads(self) -> dict[TpKey, int]:
        """The time of each partition's first buffered record."""
        return {tp: buf[0][0] for tp, buf in self._buffers.items() if buf}

    def release(
        self,
        limit: int,
        watched: Iterable[TpKey],
        ceiling: tuple[int, str, TpKey] | None = None,
        owner: str = "",
    ) -> list[Message]:
        """Up to ``limit`` records, smallest (time, topic, partition) head first, while no
        watched partition holds the merge back (see the module docstring), and each below
        ``ceiling`` when one is given (the consumer group's low watermark on a shared
        index, :mod:`.group_order`: other instances' partitions hold the merge back too),
        a record's place there being (time, ``owner``, (topic, partition)): ``owner`` is
        this instance's token in the group's order."""
        watch = set(watched)
        now = self._clock()
        if not self._size or self.blocking(watch, now) is not None:
            return []
        heap = [(buf[0][0], tp) for tp, buf in self._buffers.items() if buf]
        heapq.heapify(heap)
        out: list[Message] = []
        while heap and len(out) < limit:
            if ceiling is not None and (heap[0][0], owner, heap[0][1]) >= ceiling:
                break
            _t, tp = heapq.heappop(heap)
            buf = self._buffers[tp]
            out.append(buf.popleft()[1])
            if buf:
                heapq.heappush(heap, (buf[0][0], tp))
                continue
            if tp in watch and tp not in self.caught_up:
                self._empty_since[tp] = now  # emptied now: wait for its next record
                if self.max_idle_s > 0:
                    break
        self._size -= len(out)
        return out

    def peek(
        self,
        limit: int,
        watched: Iterable[TpKey],
        ceiling: tuple[int, str, TpKey],
        owner: str = "",
    ) -> list[Message]:
        """What :meth:`release` would give with these arguments, everything left buffered.

        See :meth:`first_tick`."""
        watch = set(watched)
        if not self._size or self.blocking(watch) is not None:
            return []
        runs = {tp: iter(buf) for tp, buf in self._buffers.items() if buf}
        heads = {tp: next(run) for tp, run in runs.items()}
        heap = [(head[0], tp) for tp, head in heads.items()]
        heapq.heapify(heap)
        out: list[Message] = []
        while heap and len(out) < limit:
            if (heap[0][0], owner, heap[0][1]) >= ceiling:
                break
            _t, tp = heapq.heappop(heap)
            out.append(heads[tp][1])
            head = next(runs[tp], None)
            if head is not None:
                heads[tp] = head
                heapq.heappush(heap, (head[0], tp))
            elif tp in watch and tp not in self.caught_up and self.max_idle_s > 0:
                break
        return out

    def first_tick(
        self,
        limit: int,
        watched: Iterable[TpKey],
        tick_ms: int,
        owner: str,
        skip: int = 0,
        *,
        whole: bool = False,
    ) -> list[Message]:
        """:meth:`peek` up to the end of the first tick buffered: what the group's order
        releases to this instance once the others have passed that tick (or the start
        of it, when they pass more at once): its next turn (``docs/group-order.md``).
        ``skip``: as if the first ``skip`` records released were gone (the turn after).
        ``whole``: only a tick every watched partition has buffered a record past, or
        reached its end after (else nothing): no record fetched later can join it (times
        not decreasing; a record produced after the end is a guess's risk: the release
        then differs, and is decided as usual)."""
        watch = set(watched)
        lead = self.peek(skip + 1, watch, (2**63, "", ("", -1)), owner)[skip:]
        if not lead:
            return []
        first = self.time_of(lead[0])
        end = first - first % tick_ms + tick_ms
        caught_up = self.caught_up
        if whole and not all(
            tp in caught_up or ((buf := self._buffers.get(tp)) and buf[-1][0] >= end)
            for tp in watch
        ):
            return []
        # Merged up to the tick's end only (a ceiling below every key of time ``end``):
        # called several times a turn, a merge of ``limit`` records stepped a heap in
        # Python for records past the tick, thrown away.
        return self.peek(skip + limit, watch, (end, "", ("", -1)), owner)[skip:]
