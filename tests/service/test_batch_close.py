"""When the service closes a batch: at once when nothing more has been fetched.

A fake consumer stands in for librdkafka's local queue, so these run without a broker.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Message

from stream_dedup.service.batches import Batcher
from stream_dedup.service.config import BatchConfig, ServiceConfig


class FetchedQueue:
    """The part of a Consumer that ``Batcher.collect`` uses: messages already fetched."""

    def __init__(self, arrivals: list[list[Message]]) -> None:
        self.arrivals = arrivals  # each consume() or poll() sees the next group arrive
        self.queue: list[Message] = []
        self.timeouts: list[float] = []

    def _arrive(self) -> None:
        if self.arrivals:
            self.queue.extend(self.arrivals.pop(0))

    def poll(self, timeout: float) -> Message | None:
        self._arrive()
        return self.queue.pop(0) if self.queue else None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        self.timeouts.append(timeout)
        self._arrive()
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out


def msgs(start: int, count: int) -> list[Message]:
    return [
        Message(topic="news", partition=0, offset=o, value=b"{}")
        for o in range(start, start + count)
    ]


def batcher(queue: FetchedQueue, max_messages: int = 100, max_wait_ms: int = 5000) -> Batcher:
    """The service's batcher, with its settings given as a user would, on ``queue``."""
    config = ServiceConfig(batch=BatchConfig(max_messages=max_messages, max_wait_ms=max_wait_ms))
    fake: Consumer = queue  # type: ignore[assignment]
    return Batcher(config.batch, None, threading.Event(), consumer=fake)


def collect(b: Batcher) -> list[int]:
    return [m.offset() or 0 for m in b.collect()]


def test_a_batch_closes_when_nothing_more_is_fetched_not_after_the_window() -> None:
    queue = FetchedQueue([msgs(0, 3), msgs(3, 2), []])
    b = batcher(queue, max_wait_ms=5000)
    started = time.monotonic()
    assert collect(b) == [0, 1, 2, 3, 4]
    assert time.monotonic() - started < 1.0  # the 5 s window was not waited out
    assert all(t == 0 for t in queue.timeouts)


def test_a_batch_stops_at_max_messages_and_keeps_the_rest_for_the_next() -> None:
    queue = FetchedQueue([msgs(0, 10)])
    b = batcher(queue, max_messages=4)
    assert collect(b) == [0, 1, 2, 3]
    assert collect(b) == [4, 5, 6, 7]


def test_a_batch_closes_after_max_wait_while_messages_keep_coming() -> None:
    queue = FetchedQueue([msgs(0, 1), msgs(1, 1), msgs(2, 1), msgs(3, 1)])
    b = batcher(queue, max_wait_ms=0)
    assert collect(b) == [0, 1]  # one look after the first message, then closed
