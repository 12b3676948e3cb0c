"""The time-ordered merge of partitions, and the order a batch is decided in."""

from __future__ import annotations

import json
import random
import threading

from confluent_kafka import Consumer, KafkaError, Message

from stream_dedup.decode import parse_time
from stream_dedup.service.batches import Batcher
from stream_dedup.service.config import BatchConfig
from stream_dedup.service.ordering import PartitionMerge, RecordTime, TickedTime, time_order
from stream_dedup.service.ranges import batch_ranges, split_intent

TIME = RecordTime()


def rec(partition: int, offset: int, ts: int, value: bytes = b"{}") -> Message:
    return Message(topic="news", partition=partition, offset=offset, value=value, timestamp=(1, ts))


def where(msgs: list[Message]) -> list[tuple[int | None, int | None]]:
    return [(m.partition(), m.offset()) for m in msgs]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def three_partitions() -> list[Message]:
    """Times 0..29 dealt over 3 partitions at random, in offset order per partition."""
    rng = random.Random(7)
    offsets = [0, 0, 0]
    out = []
    for t in range(30):
        p = rng.randrange(3)
        out.append(rec(p, offsets[p], 1000 + t))
        offsets[p] += 1
    return out


def test_interleaved_partitions_come_out_in_time_order() -> None:
    msgs = three_partitions()
    merge = PartitionMerge(0.5, TIME)
    for p in (2, 0, 1):  # fetched partition by partition, as a backlog is
        for m in msgs:
            if m.partition() == p:
                merge.add(m)
    watched = {("news", p) for p in range(3)}
    for p in range(3):
        merge.at_end(("news", p))
    out = merge.release(100, watched)
    assert [TIME(m) for m in out] == sorted(TIME(m) for m in msgs)
    assert len(merge) == 0


def test_an_empty_partition_holds_release_until_caught_up() -> None:
    clock = Clock()
    merge = PartitionMerge(0.5, TIME, clock)
    watched = {("news", 0), ("news", 1)}
    merge.add(rec(0, 0, 10))
    merge.add(rec(0, 1, 30))
    assert merge.release(100, watched) == []  # partition 1: nothing yet, not at its end
    assert merge.blocking(watched) == 0.5
    merge.add(rec(1, 0, 20))
    out = merge.release(100, watched)
    # 10 and 20 go; then partition 1 is empty again, so 30 waits for its next record
    assert where(out) == [(0, 0), (1, 0)]
    merge.at_end(("news", 1))
    assert where(merge.release(100, watched)) == [(0, 1)]


def test_an_empty_partition_holds_release_only_for_the_idle_bound() -> None:
    clock = Clock()
    merge = PartitionMerge(0.5, TIME, clock)
    watched = {("news", 0), ("news", 1)}
    merge.add(rec(0, 0, 10))
    assert merge.release(100, watched) == []
    clock.now += 0.3
    assert merge.release(100, watched) == []
    clock.now += 0.25
    assert where(merge.release(100, watched)) == [(0, 0)]


def test_release_stops_at_the_limit_and_a_new_record_clears_the_end() -> None:
    merge = PartitionMerge(0.5, TIME)
    watched = {("news", 0)}
    for o in range(5):
        merge.add(rec(0, o, o))
    assert where(merge.release(3, watched)) == [(0, 0), (0, 1), (0, 2)]
    merge.at_end(("news", 1))
    merge.add(rec(1, 0, 100))
    assert ("news", 1) not in merge.caught_up


def test_time_order_is_a_function_of_the_records_alone() -> None:
    msgs = three_partitions()
    orders = set()
    for seed in range(20):
        shuffled = list(msgs)
        random.Random(seed).shuffle(shuffled)
        orders.add(tuple(where(time_order(shuffled, TIME))))
    assert len(orders) == 1
    assert [TIME(m) for m in time_order(msgs, TIME)] == list(range(1000, 1030))


def test_a_replayed_intent_is_decided_in_the_first_order() -> None:
    msgs = three_partitions()
    first = time_order(msgs[:20], TIME)
    intent = batch_ranges(first)
    arrived = list(msgs)
    random.Random(3).shuffle(arrived)
    inside, _held = split_intent(arrived, intent)
    assert where(time_order(inside, TIME)) == where(first)


def test_ties_break_by_partition_and_a_partition_is_never_reordered() -> None:
    msgs = [rec(1, 0, 5), rec(0, 0, 5), rec(0, 1, 9), rec(0, 2, 1), rec(1, 1, 6)]
    # partition 0's offset 2 has an earlier time than offset 1: it still comes after it
    assert where(time_order(msgs, TIME)) == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2)]
    prefix = time_order(msgs, TIME)[:3]
    assert batch_ranges(prefix) == {("news", 0): (0, 1), ("news", 1): (0, 2)}


def test_the_orders_tick_puts_one_ticks_records_in_partition_order() -> None:
    """With a tick, records of one tick go by partition (then offset) in a batch and in
    the merge alike; across ticks, by time; a partition is never reordered."""
    msgs = [rec(1, 0, 1005), rec(0, 0, 1050), rec(1, 1, 1099), rec(0, 1, 1100), rec(1, 2, 1101)]
    ticked = TickedTime(RecordTime(), 100)
    assert [ticked(m) for m in msgs] == [1000, 1000, 1000, 1100, 1100]
    expected = [(0, 0), (1, 0), (1, 1), (0, 1), (1, 2)]
    assert where(time_order(msgs, ticked)) == expected
    assert where(time_order(msgs, RecordTime())) == [(1, 0), (0, 0), (1, 1), (0, 1), (1, 2)]
    merge = PartitionMerge(0.0, ticked)
    for m in msgs:
        merge.add(m)
    assert where(merge.release(10, [])) == expected


def test_time_field_epoch_ms_iso_and_fallback() -> None:
    by_field = RecordTime("published_at")
    assert by_field(rec(0, 0, 5, json.dumps({"published_at": 1234}).encode())) == 1234
    iso = json.dumps({"published_at": "1970-01-01T00:00:02Z"}).encode()
    assert by_field(rec(0, 0, 5, iso)) == 2000
    naive = json.dumps({"published_at": "1970-01-01T00:00:03"}).encode()
    assert by_field(rec(0, 0, 5, naive)) == 3000
    for bad in (b"{}", b"not json", json.dumps({"published_at": "soon"}).encode(), b"[1]"):
        assert by_field(rec(0, 0, 5, bad)) == 5  # falls back to the message timestamp
    assert parse_time(True) is None
    assert parse_time(float("nan")) is None


def test_the_batcher_takes_end_of_partition_events() -> None:
    batcher = Batcher(BatchConfig(), None, threading.Event())
    eof = Message(topic="news", partition=1, error=KafkaError(KafkaError._PARTITION_EOF))
    batcher.take([rec(0, 0, 1), eof])
    assert ("news", 1) in batcher.merge.caught_up
    assert len(batcher.merge) == 1


class Queue:
    """The part of a Consumer the batcher uses: messages already fetched, in fetch order."""

    def __init__(self, queued: list[Message]) -> None:
        self.queued = queued

    def poll(self, timeout: float) -> Message | None:
        return self.queued.pop(0) if self.queued else None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out


def test_records_queued_behind_a_full_buffer_are_reached() -> None:
    """Partition 0 fills the buffer; partition 1's earlier records wait behind more of
    partition 0's in the consumer's queue: the batcher takes on until it reaches them."""
    queue = Queue([rec(0, o, 1000 + 2 * o) for o in range(50, 80)])
    queue.queued += [rec(1, o, 1001 + 2 * o) for o in range(80)]
    fake: Consumer = queue  # type: ignore[assignment]
    config = BatchConfig(max_messages=10, max_idle_ms=60_000)
    batcher = Batcher(config, None, threading.Event(), consumer=fake)
    batcher.assign({("news", 0), ("news", 1)})
    batcher.put_back([rec(0, o, 1000 + 2 * o) for o in range(50)])
    batch = batcher.collect()
    assert where(batch) == [(p, o // 2) for o in range(10) for p in (o % 2,)]
    assert [TIME(m) for m in batch] == list(range(1000, 1010))


def test_peek_is_the_release_leaving_everything_buffered() -> None:
    """At every limit and ceiling, with a partition that empties (held by the idle
    bound) and without, ``peek`` names the records ``release`` takes, and takes none."""
    msgs = three_partitions()
    watched = {("news", p) for p in range(3)}
    for caught_up in (True, False):
        for limit in (1, 7, 100):
            for ceiling_time in (1000, 1012, 1029, 2000):
                merge = PartitionMerge(0.5, TIME, clock=Clock())
                for m in msgs:
                    merge.add(m)
                if caught_up:
                    for p in range(3):
                        merge.at_end(("news", p))
                ceiling = (ceiling_time, "b", ("news", 1))
                seen = merge.peek(limit, watched, ceiling, "a")
                assert len(merge) == len(msgs)
                assert merge.peek(limit, watched, ceiling, "a") == seen
                assert merge.release(limit, watched, ceiling, "a") == seen
                assert len(merge) == len(msgs) - len(seen)


def test_the_first_tick_is_what_the_group_releases_next() -> None:
    """The records of the first tick buffered (to its end, or ``limit``), in the order
    the merge releases them."""
    order_time = TickedTime(TIME, 10)
    merge = PartitionMerge(0.5, order_time, clock=Clock())
    for m in three_partitions():
        merge.add(m)
    for p in range(3):
        merge.at_end(("news", p))
    watched = {("news", p) for p in range(3)}
    first = merge.first_tick(100, watched, 10, "a")
    assert sorted(TIME(m) for m in first) == list(range(1000, 1010))
    assert merge.first_tick(4, watched, 10, "a") == first[:4]
    assert merge.release(100, watched, (1010, "", ("", -1)), "a") == first
    assert sorted(TIME(m) for m in merge.first_tick(100, watched, 10, "a")) == list(
        range(1010, 1020)
    )


def test_a_whole_tick_is_one_no_record_fetched_later_can_join() -> None:
    """``whole``: the first tick is given only once every watched partition has a
    record past it buffered; and ``skip`` gives the tick after the records skipped."""
    merge = PartitionMerge(0.5, TickedTime(TIME, 10), clock=Clock())
    watched = {("news", 0), ("news", 1)}
    for p, ts in ((0, 1000), (0, 1004), (1, 1003), (0, 1012), (0, 1025)):
        merge.add(rec(p, len([m for m in merge.messages() if m.partition() == p]), ts))
    assert merge.first_tick(100, watched, 10, "a", whole=True) == []  # partition 1 may add
    first = merge.first_tick(100, watched, 10, "a")
    assert sorted(TIME(m) for m in first) == [1000, 1003, 1004]
    merge.add(rec(1, 1, 1011))
    assert merge.first_tick(100, watched, 10, "a", whole=True) == first
    after = merge.first_tick(100, watched, 10, "a", skip=3)
    assert [TIME(m) for m in after] == [1012, 1011]  # within a tick: by partition


def test_a_partition_at_its_end_leaves_the_tick_whole() -> None:
    """A watched partition that reached its end after its last record holds the tick
    back no more (a backlog's last turn is known whole); a record after the end makes
    it wait again for one past the tick."""
    merge = PartitionMerge(0.5, TickedTime(TIME, 10), clock=Clock())
    watched = {("news", 0), ("news", 1)}
    for p, ts in ((0, 1000), (1, 1003), (0, 1012)):
        merge.add(rec(p, len([m for m in merge.messages() if m.partition() == p]), ts))
    assert merge.first_tick(100, watched, 10, "a", whole=True) == []
    merge.at_end(("news", 1))
    assert [TIME(m) for m in merge.first_tick(100, watched, 10, "a", whole=True)] == [1000, 1003]
    merge.add(rec(1, 1, 1005))
    assert merge.first_tick(100, watched, 10, "a", whole=True) == []
