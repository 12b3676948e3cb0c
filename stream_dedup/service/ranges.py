"""Where a batch's messages lie in their partitions: positions, ranges and the batch intent.

A batch is a set of input ranges, ``(topic, partition) -> (first offset, last offset + 1)``
(see ``docs/commit-protocol.md``). These pure helpers turn consumed messages into ranges
and tell which messages belong to an announced batch (its *intent*, stored in the index
before anything of the batch leaves the process); they hold no state and touch no client.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Message

TpKey = tuple[str, int]
#: (topic, partition) -> (first offset, last offset + 1).
Ranges = Mapping[TpKey, tuple[int, int]]


def position(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed, error-free message."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def canonical_order(msgs: list[Message]) -> list[Message]:
    """The batch sorted by (topic, partition, offset): the tie-break of time order.

    Batches are decided in :func:`stream_dedup.service.ordering.time_order`; this order
    (a function of the batch alone, like that one) is what ties of time fall back to.
    """
    return sorted(msgs, key=position)


def batch_ranges(msgs: list[Message]) -> dict[TpKey, tuple[int, int]]:
    """(topic, partition) -> (first offset, last offset + 1) of a non-empty batch."""
    ranges: dict[TpKey, tuple[int, int]] = {}
    for msg in msgs:
        topic, partition, offset = position(msg)
        start, end = ranges.get((topic, partition), (offset, offset + 1))
        ranges[(topic, partition)] = (min(start, offset), max(end, offset + 1))
    return ranges


def next_offsets(ranges: Ranges) -> dict[TpKey, int]:
    """The offset to resume each partition at once the batch of ``ranges`` is stored."""
    return {tp: end for tp, (_start, end) in ranges.items()}


def intent_reached(msgs: list[Message], intent: Ranges) -> bool:
    """Whether ``msgs`` reach the end of every range of ``intent`` (the batch is complete)."""
    last: dict[TpKey, int] = {}
    for msg in msgs:
        topic, partition, offset = position(msg)
        if (topic, partition) in intent:
            last[(topic, partition)] = max(last.get((topic, partition), -1), offset)
    return all(last.get(tp, -1) >= end - 1 for tp, (_start, end) in intent.items())


def split_intent(msgs: list[Message], intent: Ranges) -> tuple[list[Message], list[Message]]:
    """The messages inside ``intent``'s ranges, and the rest (held, in arrival order)."""
    inside: list[Message] = []
    held: list[Message] = []
    for msg in msgs:
        topic, partition, offset = position(msg)
        span = intent.get((topic, partition))
        in_range = span is not None and span[0] <= offset < span[1]
        (inside if in_range else held).append(msg)
    return inside, held
