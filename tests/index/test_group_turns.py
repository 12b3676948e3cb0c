"""An instance's turns in the group's order (``service/group_turns.py``), on real Redis.

What must hold: two members releasing through their turns decide one time order; a
member held back hands over its next turn once per release, and its release is cut to
that guess, so that a batch decided meanwhile is the batch released; a batch released
and not stored yet is the head its partition publishes, until it is stored.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Message

from stream_dedup.index.redis_heads import HEAD, GroupHeads
from stream_dedup.service.group_turns import GroupTurns
from stream_dedup.service.ordering import TickedTime
from stream_dedup.service.ranges import batch_ranges

from .test_group_heads import TIME, filled, members, told

__all__ = ["members"]  # the fixture: one more member's exchange for one group


def test_members_take_turns_in_one_order_and_a_guess_is_the_release(
    members: Callable[[], GroupHeads],
) -> None:
    tick = 10
    order_time = TickedTime(TIME, tick)
    # two partitions, records 3 ms apart alternating between them: ticks of ~3 records
    stamps = {0: list(range(0, 120, 6)), 1: list(range(3, 120, 6))}
    sides = []
    for partition in stamps:
        merge, order = filled(stamps, {partition}, order_time), told(members(), 2, tick)
        guesses: list[list[Message]] = []
        turns = GroupTurns(merge, order_time, order, guesses.append)
        sides.append(({("news", partition)}, turns, guesses))
    released: list[tuple[int, str, int]] = []
    right = rounds = 0
    while any(len(t._merge) for _m, t, _g in sides):
        rounds += 1
        assert rounds < 100, "no progress"
        taken = []  # every member tries before any stores: the later one is held back
        for mine, turns, guesses in sides:
            guessed = guesses[-1] if turns.expecting else None
            batch, held = turns.release(1000, mine, mine, None)
            if batch:
                right += batch == guessed
                (tp,) = mine
                # released, not stored: its first record is still the partition's head
                assert turns.heads(mine)[tp] == (HEAD, order_time(batch[0]))
                taken.append((mine, turns, batch))
            elif held is not None and turns.guessed(1000, mine):
                assert guesses[-1] and turns.expecting
                assert not turns.guessed(1000, mine)  # once per release
        for mine, turns, batch in taken:
            turns.decided(batch_ranges(batch), mine)
            (tp,) = mine
            assert turns.heads(mine)[tp] != (HEAD, order_time(batch[0]))
            assert turns.group is not None
            released += [(order_time(m), turns.group.token, TIME(m)) for m in batch]
    for _m, turns, _g in sides:
        assert turns.group is not None
        turns.group.close()
    assert len(released) == sum(map(len, stamps.values()))
    # one order: by tick, then member within the tick
    assert [r[:2] for r in released] == sorted(r[:2] for r in released)
    assert right >= 10  # the guesses handed over were the batches released
