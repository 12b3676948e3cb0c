"""A batch's input ranges, and the batch a crash left announced (its intent).

A batch is a set of input ranges, ``(topic, partition) -> (first offset, last offset + 1)``
(:func:`batch_ranges`); a crash replays the ranges stored as the batch's *intent*
(``docs/commit-protocol.md``), collected by the
:class:`~stream_dedup.service.batches.Batcher` until complete.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Message

__all__ = [
    "Ranges",
    "TpKey",
    "batch_ranges",
    "canonical_order",
    "done_for_intent",
    "intent_reached",
    "position",
    "split_intent",
]

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


def done_for_intent(pending: list[Message], partitions: list[TpKey], intent: Ranges) -> list[TpKey]:
    """Those of ``partitions`` that cannot add to the announced batch: outside it, or
    with its last message among ``pending`` already."""
    last: dict[TpKey, int] = {}
    for msg in pending:
        topic, partition, offset = position(msg)
        last[(topic, partition)] = max(last.get((topic, partition), -1), offset)
    return [tp for tp in partitions if tp not in intent or last.get(tp, -1) >= intent[tp][1] - 1]
