"""A member "at its end" on the group's heads, against the broker's end offsets.

With a real broker and a real Redis node: what the group's order makes of a partition
whose owner published "at its end" while the broker already holds records there
(``docs/group-order.md``, "Partitions at their end").
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer

from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.redis_heads import AT_END, HEAD
from stream_dedup.service.group_order import BLOCKED, GroupOrder
from stream_dedup.tools.broker import create_topics
from tests.conftest import fresh_namespace

pytestmark = [pytest.mark.broker]


def test_a_member_at_its_end_with_records_on_the_broker_holds_the_others_back(
    bootstrap: str, redis_url: str
) -> None:
    """Member B publishes "at its end" at the offset its consumer reached; records are
    produced there before B takes them. Member A, looking at the broker's end offsets
    after taking records of its own, is held back until B publishes their head; the
    look is made again only when A took something new or the heads moved."""
    namespace = fresh_namespace()
    topic = f"heads-{namespace}"
    backends = [RedisBackend(redis_url, namespace=namespace) for _ in range(2)]
    create_topics(bootstrap, [topic], partitions=2)
    a, b = (GroupOrder(x.group_heads("g"), [topic], max_idle_ms=5000) for x in backends)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    producer = Producer({"bootstrap.servers": bootstrap})
    try:
        mine = {(topic, 0)}
        b.exchange({(topic, 1): (AT_END, 0)})
        a.exchange({(topic, 0): (HEAD, 100)})
        a.learn_partitions(consumer)  # the topic's 2 partitions, from the broker
        assert a.watermark(mine, consumer, taken=1).ceiling is None
        for n in range(3):
            producer.produce(topic, value=b"{}", partition=1, timestamp=50 + n)
        assert producer.flush(10) == 0
        assert a.ends.take_looks() == {"at_end": 1, "behind": 0}
        assert a.watermark(mine, consumer, taken=1).ceiling is None  # nothing new taken
        assert a.ends.take_looks() == {"at_end": 0, "behind": 0}
        held = a.watermark(mine, consumer, taken=2)
        assert held.ceiling == BLOCKED and held.hold_ms is not None and held.hold_ms > 4000
        assert a.ends.take_looks() == {"at_end": 0, "behind": 1}
        b.exchange({(topic, 1): (HEAD, 50)})  # B took them
        a.exchange({(topic, 0): (HEAD, 100)})
        assert a.watermark(mine, consumer, taken=2).ceiling == (50, b.token, (topic, 1))
        b.exchange({(topic, 1): (AT_END, 3)})  # and decided them: at its end again
        a.exchange({(topic, 0): (HEAD, 100)})
        assert a.watermark(mine, consumer, taken=2).ceiling is None
    finally:
        a.close()
        b.close()
        consumer.close()
        for backend in backends:
            backend.close()
