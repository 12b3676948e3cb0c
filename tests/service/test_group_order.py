"""The group's low watermark: which published heads hold a release back, and for how long."""

from __future__ import annotations

from confluent_kafka import Message

from stream_dedup.index.redis_heads import AT_END, EMPTY, HEAD, Head, Published
from stream_dedup.service.group_order import (
    AT_END_FRESH_MS,
    BLOCKED,
    GroupOrder,
    Watermark,
    low_watermark,
    own_heads,
)
from stream_dedup.service.ordering import PartitionMerge, RecordTime, time_order

TIME = RecordTime()
IDLE = 500
NOW = 1_000_000


def rec(partition: int, offset: int, ts: int) -> Message:
    return Message(topic="news", partition=partition, offset=offset, value=b"{}", timestamp=(1, ts))


def mark(
    heads: dict[int, Head], mine: set[int], missing: dict[tuple[str, int], int] | None = None
) -> Watermark:
    published = Published(NOW, {("news", p): h for p, h in heads.items()})
    return low_watermark(
        published,
        {"news": 4},
        {("news", p) for p in mine},
        IDLE,
        {} if missing is None else missing,
    )


def fresh(kind: str, time: int = 0, since: int = NOW) -> Head:
    return Head(kind, time, since, NOW - 10)


def test_the_smallest_other_head_is_the_ceiling_and_own_partitions_do_not_count() -> None:
    heads = {0: fresh(HEAD, 50), 1: fresh(HEAD, 70), 2: fresh(HEAD, 60), 3: fresh(AT_END)}
    assert mark(heads, mine={0}) == Watermark((60, "", ("news", 2)))
    assert mark(heads, mine={2}) == Watermark((50, "", ("news", 0)))
    assert mark(heads, mine={0, 1, 2, 3}) == Watermark(None)  # one instance: no limit


def test_ties_of_time_go_by_topic_and_partition_as_time_order_decides() -> None:
    """Records of one millisecond on partitions 0 and 2: partition 0's comes first, in
    the group's order as in one batch's ``time_order``."""
    heads = {0: fresh(HEAD, 100), 1: fresh(AT_END), 3: fresh(AT_END)}
    ceiling = mark(heads, mine={2}).ceiling
    assert ceiling == (100, "", ("news", 0))
    merge = PartitionMerge(0.5, TIME)
    merge.add(rec(2, 7, 100))
    merge.at_end(("news", 2))
    assert merge.release(10, {("news", 2)}, ceiling) == []  # (100, p2) comes after (100, p0)
    heads = {2: fresh(HEAD, 100), 1: fresh(AT_END), 3: fresh(AT_END)}
    ceiling = mark(heads, mine={0}).ceiling
    merge = PartitionMerge(0.5, TIME)
    merge.add(rec(0, 3, 100))
    merge.at_end(("news", 0))
    out = merge.release(10, {("news", 0)}, ceiling)
    assert [m.offset() for m in out] == [3]
    both = [rec(2, 7, 100), rec(0, 3, 100)]
    assert [m.partition() for m in time_order(both, TIME)] == [0, 2]


def test_within_a_tick_the_group_goes_instance_by_instance() -> None:
    """Records of one tick on partitions of two instances: all of the instance whose token
    sorts first come first, whatever their partitions, so the group hands over once per
    tick and instance, not at every partition."""
    heads = {0: Head(HEAD, 100, NOW, NOW - 10, "b"), 1: fresh(AT_END), 3: fresh(AT_END)}
    ceiling = mark(heads, mine={2}).ceiling
    assert ceiling == (100, "b", ("news", 0))
    for token, released in (("a", [7]), ("c", [])):
        merge = PartitionMerge(0.5, TIME)
        merge.add(rec(2, 7, 100))
        merge.at_end(("news", 2))
        out = merge.release(10, {("news", 2)}, ceiling, token)
        assert [m.offset() for m in out] == released


def test_an_empty_partition_holds_everything_back_until_max_idle() -> None:
    heads = {0: fresh(HEAD, 50), 1: fresh(EMPTY, since=NOW - 200), 3: fresh(AT_END)}
    assert mark(heads, mine={2}) == Watermark(BLOCKED, IDLE - 200)
    heads[1] = fresh(EMPTY, since=NOW - IDLE - 1)  # empty too long: idle
    assert mark(heads, mine={2}) == Watermark((50, "", ("news", 0)))


def test_a_head_not_refreshed_for_max_idle_is_an_owner_gone() -> None:
    dead = Head(HEAD, 10, 0, NOW - IDLE - 1)
    heads = {0: dead, 1: fresh(HEAD, 90), 3: fresh(AT_END)}
    assert mark(heads, mine={2}) == Watermark((90, "", ("news", 1)))
    heads[0] = Head(HEAD, 10, 0, NOW - IDLE + 1)  # still alive: it holds
    assert mark(heads, mine={2}) == Watermark((10, "", ("news", 0)))


def test_at_its_end_holds_nothing_back_only_while_its_owner_is_heard_from() -> None:
    """A killed owner's last "at its end" says nothing about the records arriving on its
    partition since (nobody fetches them until the group moves it): once its owner has
    been silent past ``AT_END_FRESH_MS`` it holds everything back as an empty partition
    does, until ``max_idle_ms`` after the owner was last heard from."""
    idle = 15_000

    def at(heads: dict[int, Head]) -> Watermark:
        published = Published(NOW, {("news", p): h for p, h in heads.items()})
        return low_watermark(published, {"news": 4}, {("news", 2)}, idle, {})

    heads = {0: fresh(HEAD, 50), 1: fresh(AT_END), 3: fresh(AT_END)}
    assert at(heads) == Watermark((50, "", ("news", 0)))
    heads[1] = Head(AT_END, 0, NOW - 5000, NOW - AT_END_FRESH_MS)  # touched 1 s ago
    assert at(heads) == Watermark((50, "", ("news", 0)))
    heads[1] = Head(AT_END, 0, NOW - 5000, NOW - 3000)  # silent 3 s: maybe killed
    assert at(heads) == Watermark(BLOCKED, idle - 3000)
    heads[1] = Head(AT_END, 0, NOW - 20_000, NOW - idle - 1)  # gone past max_idle: idle
    assert at(heads) == Watermark((50, "", ("news", 0)))
    # with a short max_idle_ms (the default 500 ms) nothing changes: that is the bound
    published = Published(NOW, {("news", 1): Head(AT_END, 0, NOW, NOW - 400)})
    assert low_watermark(published, {"news": 2}, {("news", 0)}, 500, {}) == Watermark(None)


def test_at_its_end_below_the_brokers_end_holds_back_until_its_owner_publishes() -> None:
    """A burst reaches each member on its own fetches: an "at its end" published at an
    offset below the partition's end on the broker has records its owner has not taken
    yet. It holds everything back, as an empty partition does, from when it was first
    found so; at or above the broker's end it holds nothing back."""
    behind: dict[tuple[str, int], int] = {}

    def at(heads: dict[int, Head], ends: dict[int, int], now: int = NOW) -> Watermark:
        published = Published(now, {("news", p): h for p, h in heads.items()})
        own = {("news", 0), ("news", 2)}
        got = {("news", p): e for p, e in ends.items()}
        return low_watermark(published, {"news": 4}, own, IDLE, {}, got, behind)

    heads = {1: fresh(AT_END, 40), 3: fresh(HEAD, 70)}
    assert at(heads, {1: 40}) == Watermark((70, "", ("news", 3)))
    assert at(heads, {1: 38}) == Watermark((70, "", ("news", 3)))  # a batch's base + 1
    assert behind == {}
    assert at(heads, {1: 41}) == Watermark(BLOCKED, IDLE)
    assert behind == {("news", 1): NOW}
    assert at(heads, {1: 45}, now=NOW + 100) == Watermark(BLOCKED, IDLE - 100)
    # its owner took the records and published their head: the ceiling is that head,
    # and the wait is over (a later one starts afresh)
    heads[1] = Head(HEAD, 60, NOW + 150, NOW + 150)
    assert at(heads, {}, now=NOW + 150) == Watermark((60, "", ("news", 1)))
    assert behind == {}
    heads[1] = Head(AT_END, 41, NOW + 150, NOW + 160)
    assert at(heads, {1: 43}, now=NOW + 160) == Watermark(BLOCKED, IDLE)
    assert behind == {("news", 1): NOW + 160}
    # at its end again, at the broker's end: nothing held, and the wait forgotten
    heads[1] = Head(AT_END, 45, NOW + 150, NOW + 200)
    assert at(heads, {1: 45}, now=NOW + 200) == Watermark((70, "", ("news", 3)))
    assert behind == {}
    # not looked at, or an end offset its owner did not know: as published
    assert at(heads, {}) == Watermark((70, "", ("news", 3)))
    heads[1] = Head(AT_END, -1, NOW, NOW)
    assert at(heads, {1: 45}) == Watermark((70, "", ("news", 3)))
    # held back only while its owner is heard from: a silent owner's wait is the one above
    heads[1] = Head(AT_END, 40, NOW - 5000, NOW - IDLE - 1)
    assert at(heads, {1: 45}) == Watermark((70, "", ("news", 3)))


def test_a_partition_nobody_published_holds_back_from_when_it_was_first_missed() -> None:
    missing: dict[tuple[str, int], int] = {}
    heads = {0: fresh(HEAD, 50), 1: fresh(AT_END), 3: fresh(AT_END)}
    assert mark(heads, mine={0}, missing=missing) == Watermark(BLOCKED, IDLE)
    assert missing == {("news", 2): NOW}
    missing[("news", 2)] = NOW - IDLE  # first missed max_idle ago
    assert mark(heads, mine={0}, missing=missing) == Watermark(None)
    heads[2] = fresh(HEAD, 80)
    assert mark(heads, mine={0}, missing=missing) == Watermark((80, "", ("news", 2)))
    assert missing == {}


def test_the_ceiling_releases_a_prefix_per_partition_in_offset_order() -> None:
    merge = PartitionMerge(0.5, TIME)
    for offset, ts in enumerate([10, 20, 30, 40]):
        merge.add(rec(0, offset, ts))
    for offset, ts in enumerate([15, 35]):
        merge.add(rec(1, offset, ts))
    for p in (0, 1):
        merge.at_end(("news", p))
    watched = {("news", 0), ("news", 1)}
    out = merge.release(100, watched, (32, "", ("news", 3)))
    assert [(m.partition(), m.offset()) for m in out] == [(0, 0), (1, 0), (0, 1), (0, 2)]
    assert merge.heads() == {("news", 0): 40, ("news", 1): 35}
    assert [m.offset() for m in merge.release(100, watched, BLOCKED)] == []
    assert len(merge.release(100, watched)) == 2


def test_own_heads_say_the_first_undecided_record_else_end_or_empty() -> None:
    assigned = [("news", p) for p in range(4)]
    heads = own_heads(
        {("news", 0): 5}, {("news", 0): 9, ("news", 1): 7}, assigned, {("news", 2): 40}
    )
    assert heads == {
        ("news", 0): (HEAD, 5),  # released and not yet stored comes before buffered
        ("news", 1): (HEAD, 7),
        ("news", 2): (AT_END, 40),
        ("news", 3): (EMPTY, 0),
    }


def test_the_wait_for_the_watermark_backs_off_and_restarts_short() -> None:
    order = GroupOrder.__new__(GroupOrder)  # the backoff alone: no Redis, no heartbeat
    order._pause_s, order.waited_s = 0.001, 0.0
    pauses = [order.pause(None) for _ in range(7)]
    assert pauses == [0.001, 0.002, 0.004, 0.008, 0.016, 0.016, 0.016]
    assert order.pause(3) == 0.003  # never past the moment a holding partition stops
    order.released()
    assert order.pause(None) == 0.001
