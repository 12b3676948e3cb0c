"""The group's heads on real Redis servers (one node, and the 3-master cluster)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Message

from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_heads import AT_END, EMPTY, HEAD, GroupHeads
from stream_dedup.service.group_order import GroupOrder, own_heads
from stream_dedup.service.ordering import PartitionMerge, RecordTime, TickedTime
from tests.conftest import fresh_namespace

TIME = RecordTime()


@pytest.fixture
def members(shared_redis_url: str) -> Iterator[Callable[..., GroupHeads]]:
    """``make()``: one more instance's exchange (its own connection) for one group
    (``make(group)``: for another group on the same index)."""
    namespace = fresh_namespace()
    opened: list[RedisBackend] = []

    def make(group: str = "group-a") -> GroupHeads:
        backend = RedisBackend(shared_redis_url, namespace=namespace)
        opened.append(backend)
        return backend.group_heads(group)

    yield make
    for backend in opened:
        backend.close()


def test_each_member_writes_its_partitions_and_reads_everyone(
    members: Callable[[], GroupHeads],
) -> None:
    a, b = members(), members()
    topics = ["news", "wire"]
    first = a.exchange(topics, {("news", 0): (HEAD, 100), ("wire", 1): (AT_END, 0)})
    assert abs(first.now_ms - time.time() * 1000) < 5000  # the server's clock
    got = b.exchange(topics, {("news", 1): (EMPTY, 0)})
    assert got.heads[("news", 0)][:2] == (HEAD, 100)
    assert got.heads[("wire", 1)].kind == AT_END
    empty_since = got.heads[("news", 1)].since
    assert empty_since == got.now_ms == got.heads[("news", 1)].seen
    time.sleep(0.01)
    again = b.exchange(topics, {("news", 1): (EMPTY, 0)})
    assert again.heads[("news", 1)].since == empty_since  # still empty: since stays
    assert again.heads[("news", 1)].seen > empty_since  # but its owner is alive
    later = b.exchange(topics, {("news", 1): (HEAD, 120)})
    time.sleep(0.01)
    empty_again = b.exchange(topics, {("news", 1): (EMPTY, 0)}).heads[("news", 1)]
    assert empty_again.since > later.now_ms  # a new emptiness starts afresh
    assert set(a.exchange(topics, {}).heads) == {("news", 0), ("news", 1), ("wire", 1)}


def test_a_heartbeat_refreshes_only_the_fields_no_newer_owner_wrote(
    members: Callable[[], GroupHeads],
) -> None:
    old, new = members(), members()
    first = old.exchange(["news"], {("news", 0): (HEAD, 10), ("news", 1): (HEAD, 20)})
    moved = new.exchange(["news"], {("news", 1): (HEAD, 25)})  # partition 1 moved
    time.sleep(0.01)
    old.touch(["news"])
    heads = new.exchange(["news"], {}).heads
    assert heads[("news", 0)][:2] == (HEAD, 10)
    assert heads[("news", 0)].seen > first.now_ms  # still alive
    assert heads[("news", 1)][:2] == (HEAD, 25)
    assert heads[("news", 1)].seen == moved.now_ms  # the new owner's, untouched


def rec(partition: int, offset: int, ts: int) -> Message:
    return Message(topic="news", partition=partition, offset=offset, value=b"{}", timestamp=(1, ts))


def filled(
    stamps: dict[int, list[int]], partitions: set[int], time_of: Callable[[Message], int]
) -> PartitionMerge:
    """A merge holding records of ``partitions`` at ``stamps`` (times per partition), each
    partition at its end after them."""
    merge = PartitionMerge(0.5, time_of)
    for partition in sorted(partitions):
        for offset, ts in enumerate(stamps[partition]):
            merge.add(rec(partition, offset, ts))
        merge.at_end(("news", partition))
    return merge


def told(heads: GroupHeads, partitions: int, tick: int = 1) -> GroupOrder:
    """A member's order over topic ``news`` of ``partitions`` partitions, told their
    number instead of asking a broker."""
    order = GroupOrder(heads, ["news"], 5000, tick_ms=tick)
    order._partitions["news"] = partitions
    order._learn = False
    return order


def test_two_members_taking_turns_decide_in_the_groups_time_order(
    members: Callable[[], GroupHeads],
) -> None:
    """Two instances, one partition each, with interleaved times: whatever the turns,
    what they release joins into one time order (the service's batcher does the same
    with its consumer; the broker tests run it whole)."""
    times = {0: [10, 30, 31, 50, 70], 1: [20, 40, 60, 61, 62]}
    sides = []
    for partition in times:
        merge, order = filled(times, {partition}, TIME), told(members(), 2)
        sides.append((partition, merge, order))
    decided: list[int] = []
    turns = 0
    while any(len(merge) for _p, merge, _o in sides):
        turns += 1
        assert turns < 50, "no progress"
        for partition, merge, order in sides:
            mine = {("news", partition)}
            order.exchange(own_heads({}, merge.heads(), mine, merge.caught_up))
            out = merge.release(2, mine, order.watermark(mine).ceiling, order.token)
            decided += [TIME(m) for m in out]
            order.exchange(own_heads({}, merge.heads(), mine, merge.caught_up))
    for _p, _m, order in sides:
        order.close()
    assert decided == sorted(decided)
    assert len(decided) == 10


def take_turns(
    make: Callable[..., GroupHeads], stamps: dict[int, list[int]], owners: list[set[int]], tick: int
) -> tuple[list[tuple[int, int, int]], int, list[bool]]:
    """Members owning ``owners`` (partition sets) release ``stamps`` (times per
    partition) in turns, with the order's tick as the service sets it; the (time,
    owner's token, partition, offset) of what was released, in release order, how many
    releases it took (each a hand-over, a lease and a store in the service), and, per
    release that a member had guessed while held back (its first tick, as the service's
    Batcher guesses it to decide it meanwhile), whether the release was that guess."""
    order_time = TickedTime(TIME, tick)
    sides = []
    for own in owners:
        merge = filled(stamps, own, order_time)
        order = told(make(f"ticks-{tick}"), len(stamps), tick)
        sides.append(({("news", p) for p in own}, merge, order))
    released: list[tuple[int, str, int, int]] = []
    releases = rounds = 0
    guesses: dict[str, list[Message]] = {}
    right: list[bool] = []
    while any(len(merge) for _m, merge, _o in sides):
        rounds += 1
        moved = rounds == 1  # the first member exchanges before the others published
        for mine, merge, order in sides:  # a member held back guesses its next turn
            order.exchange(own_heads({}, merge.heads(), mine, merge.caught_up))
            ceiling = order.watermark(mine).ceiling
            held = ceiling is not None and not merge.peek(1, mine, ceiling, order.token)
            if held and not guesses.get(order.token):
                guesses[order.token] = merge.first_tick(100_000, mine, tick, order.token)
        for mine, merge, order in sides:
            order.exchange(own_heads({}, merge.heads(), mine, merge.caught_up))
            guess = guesses.pop(order.token, [])
            cap = len(guess) or 100_000
            out = merge.release(cap, mine, order.watermark(mine).ceiling, order.token)
            if guess and out:
                right.append(out == guess)
            elif guess:
                guesses[order.token] = guess
            if out:
                moved, releases = True, releases + 1
            released += [(TIME(m), order.token, m.partition() or 0, m.offset() or 0) for m in out]
            order.exchange(own_heads({}, merge.heads(), mine, merge.caught_up))
        assert moved, f"stuck: {[len(m) for _o, m, _g in sides]} records left"
    for _m, _merge, order in sides:
        order.close()
    return released, releases, right


def test_the_orders_tick_makes_turns_coarse_and_keeps_one_order(
    members: Callable[..., GroupHeads],
) -> None:
    """Records keyed over 4 partitions 1 ms apart, two members owning every other
    partition: with a 1 ms tick they hand over at nearly every record; with 100 ms, once
    per tick and member, and what they release is still one order, by (tick, member,
    partition, offset). Within a tick a member's own partitions may be out of time
    order, which must not stall the group (each publishes heads in the same ticks)."""
    rng = random.Random(5)
    stamps: dict[int, list[int]] = {p: [] for p in range(4)}
    for t in range(1000, 2000):
        stamps[rng.randrange(4)].append(t)
    owners = [{0, 2}, {1, 3}]
    fine, fine_turns, _ = take_turns(members, stamps, owners, 1)
    coarse, coarse_turns, guessed = take_turns(members, stamps, owners, 100)
    assert len(fine) == len(coarse) == 1000
    assert [(t, p) for t, _m, p, _o in fine] == sorted((t, p) for t, _m, p, _o in fine)
    by_tick = [(t // 100, m, p, o) for t, m, p, o in coarse]
    assert by_tick == sorted(by_tick)
    assert fine_turns > 300  # turn by turn, as finely as the partitions interleave
    assert coarse_turns <= 2 * 10 + 1  # 10 ticks, one turn per member in each
    # held back (here, the member whose turn comes second in each round), a member
    # knows its next turn: its records of the first tick it holds
    assert len(guessed) >= coarse_turns // 2 - 1 and all(guessed)


def test_a_member_held_back_is_woken_when_the_others_heads_move(
    members: Callable[[], GroupHeads],
) -> None:
    """The hand-over: a member waiting for the watermark returns as soon as the member
    holding it back publishes moved heads, not after its own timeout; one that moved
    nothing wakes nobody, and a wake-up pushed before the wait is not lost."""
    a, b = GroupOrder(members(), ["news"], 60000), GroupOrder(members(), ["news"], 60000)
    for order in (a, b):
        order._partitions["news"] = 2
        order._learn = False
    try:
        b.exchange({("news", 1): (HEAD, 50)})
        a.exchange({("news", 0): (HEAD, 10)})  # a knows b now: its moves wake b
        b.exchange({("news", 1): (HEAD, 50)})  # b knows a; same heads: wakes nobody
        assert b.watermark([("news", 1)]).ceiling == (10, a.token, ("news", 0))  # b is held back
        started = time.monotonic()
        b.wait(0.3)  # nothing moved since b last looked
        assert time.monotonic() - started >= 0.25

        def hand_over() -> None:
            time.sleep(0.05)
            a.exchange({("news", 0): (HEAD, 90)})  # a decided up to 90: b's turn

        mover = threading.Thread(target=hand_over)
        started = time.monotonic()
        mover.start()
        b.wait(2.0)
        woken_after = time.monotonic() - started
        mover.join()
        assert 0.04 <= woken_after < 1.0  # woken by the move, far before the timeout
        b.exchange({("news", 1): (HEAD, 50)})
        assert b.watermark([("news", 1)]).ceiling == (90, a.token, ("news", 0))

        a.exchange({("news", 0): (HEAD, 95)})  # moved while b was not waiting yet
        started = time.monotonic()
        b.wait(2.0)
        assert time.monotonic() - started < 1.0  # the wake-up was kept for it
    finally:
        a.close()
        b.close()


def test_a_member_with_another_tick_is_named_in_a_warning(
    members: Callable[..., GroupHeads], caplog: pytest.LogCaptureFixture
) -> None:
    """Members whose ticks differ could decide pairs closer than the larger tick in lease
    order: the service says so (a rolling change of the setting passes through it)."""
    fine = GroupOrder(members(), ["news"], 5000, tick_ms=100)
    coarse = GroupOrder(members(), ["news"], 5000, tick_ms=1000)
    same = GroupOrder(members(), ["news"], 5000, tick_ms=100)
    try:
        for order in (fine, coarse, same):
            order._partitions["news"] = 3
            order._learn = False
        fine.exchange({("news", 0): (HEAD, 1000)})
        same.exchange({("news", 2): (HEAD, 1000)})
        with caplog.at_level("WARNING", logger="stream_dedup.service"):
            same.watermark({("news", 2)})
        assert not [r for r in caplog.records if "order_tick_ms" in r.getMessage()]
        coarse.exchange({("news", 1): (HEAD, 1000)})
        fine.exchange({("news", 0): (HEAD, 1000)})
        with caplog.at_level("WARNING", logger="stream_dedup.service"):
            fine.watermark({("news", 0)})
        warned = [r for r in caplog.records if "order_tick_ms" in r.getMessage()]
        assert len(warned) == 1
        assert warned[0].fields["others"] == [1000]  # type: ignore[attr-defined]
    finally:
        for order in (fine, coarse, same):
            order.close()
