"""The look at other members' ends when the broker does not answer."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer

from stream_dedup.index.redis_heads import AT_END, HEAD, Head, Published
from stream_dedup.service import group_ends
from stream_dedup.service.group_ends import OtherEnds
from stream_dedup.tools.broker import free_port

NOW = 1_000_000


def test_a_broker_that_does_not_answer_leaves_the_ends_as_published_until_more_is_taken(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(group_ends, "ENDS_TIMEOUT_S", 0.3)
    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{free_port()}", "group.id": "g", "log_level": 0}
    )
    published = Published(
        NOW, {("news", 0): Head(HEAD, 5, NOW, NOW), ("news", 1): Head(AT_END, 7, NOW, NOW)}
    )
    ends = OtherEnds()
    try:
        with caplog.at_level(logging.WARNING, logger="stream_dedup.service"):
            ends.look(consumer, published, {("news", 0)}, taken=1, fresh_ms=1000)
        assert ends.ends == {}
        assert ends.take_looks() == {"at_end": 0, "behind": 0}
        assert "cannot read the end offsets" in caplog.text
        started = time.monotonic()
        ends.look(consumer, published, {("news", 0)}, taken=1, fresh_ms=1000)
        assert time.monotonic() - started < 0.1  # not asked again for the same take
        started = time.monotonic()
        ends.look(consumer, published, {("news", 0)}, taken=2, fresh_ms=1000)
        assert time.monotonic() - started >= 0.25  # something new taken: asked again
    finally:
        consumer.close()
