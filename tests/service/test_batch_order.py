"""The commit protocol's batch helpers: canonical order, ranges, and the announced batch."""

from __future__ import annotations

import random

from confluent_kafka import Message

from stream_dedup.service.ranges import (
    batch_ranges,
    canonical_order,
    intent_reached,
    position,
    split_intent,
)


def msg(topic: str, partition: int, offset: int) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"{}")


def arrival(per_partition: dict[tuple[str, int], range], seed: int) -> list[Message]:
    """Messages of several partitions, interleaved at random but in order per partition."""
    queues = {tp: [msg(*tp, o) for o in offs] for tp, offs in per_partition.items()}
    rng = random.Random(seed)
    out: list[Message] = []
    while any(queues.values()):
        tp = rng.choice([tp for tp, q in queues.items() if q])
        out.append(queues[tp].pop(0))
    return out


def test_canonical_order_ignores_how_partitions_were_interleaved() -> None:
    parts = {("news", 2): range(5, 9), ("news", 0): range(0, 3), ("alerts", 1): range(40, 42)}
    orders = {tuple(position(m) for m in canonical_order(arrival(parts, s))) for s in range(20)}
    assert len(orders) == 1
    (only,) = orders
    assert list(only) == sorted(only)
    assert only[0] == ("alerts", 1, 40) and only[-1] == ("news", 2, 8)


def test_batch_ranges_are_first_and_last_plus_one() -> None:
    batch = arrival({("news", 0): range(3, 7), ("news", 1): range(10, 11)}, 1)
    assert batch_ranges(batch) == {("news", 0): (3, 7), ("news", 1): (10, 11)}


def test_announced_batch_is_complete_only_when_every_partition_reached_its_end() -> None:
    intent = {("news", 0): (3, 7), ("news", 1): (10, 12)}
    got = [msg("news", 0, o) for o in range(3, 9)] + [msg("news", 1, 10)]
    assert not intent_reached(got, intent)
    got.append(msg("news", 1, 11))
    assert intent_reached(got, intent)


def test_split_intent_keeps_the_rest_in_arrival_order() -> None:
    intent = {("news", 0): (3, 5), ("news", 1): (10, 11)}
    got = [
        msg("news", 0, 3),
        msg("news", 2, 0),
        msg("news", 0, 4),
        msg("news", 0, 5),
        msg("news", 1, 10),
        msg("news", 2, 1),
        msg("news", 1, 11),
    ]
    inside, held = split_intent(got, intent)
    assert [position(m) for m in inside] == [("news", 0, 3), ("news", 0, 4), ("news", 1, 10)]
    assert [position(m) for m in held] == [
        ("news", 2, 0),
        ("news", 0, 5),
        ("news", 2, 1),
        ("news", 1, 11),
    ]
    assert batch_ranges(inside) == intent
