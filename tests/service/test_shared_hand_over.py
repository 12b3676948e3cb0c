"""The shared index's strategy hands the group's turn over at the commit point: the
heads move (``on_stored``) before the work a batch leaves for this instance's later
batches runs, so the other members do not wait that work out."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from stream_dedup.decode import MessageFormat
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.decide import Decider
from stream_dedup.service.inputs import InputDecoder
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.shared_commit import SharedIndex
from tests.conftest import fresh_namespace
from tests.index.test_dedup import article


def test_the_turn_is_handed_over_before_the_work_a_batch_leaves_for_later(
    redis_url: str,
) -> None:
    config = ServiceConfig()
    backend = RedisBackend(redis_url, namespace=fresh_namespace())
    try:
        dedup = Deduplicator(DedupIndex(backend, IndexParams.of(config.dedup)), config.dedup)
        events: list[Any] = []
        # Only the store is exercised: no producer or consumer is reached before delivery.
        strategy = SharedIndex(
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            Decider(config, dedup, Metrics(CollectorRegistry())),
            Metrics(CollectorRegistry()),
            config,
            lambda: True,
        )
        # What the batch leaves for later keeps its sets in the cache: none are there yet
        # when the heads move.
        strategy.on_stored = lambda ranges: events.append((dict(ranges), len(dedup.set_cache)))
        msgs = [
            Message(
                topic="news",
                partition=0,
                offset=i,
                value=json.dumps({"id": f"d{i}", "text": article(i)}).encode(),
                timestamp=(1, 1000 + i),
            )
            for i in range(6)
        ]
        decoder = InputDecoder(MessageFormat())
        out = strategy._store(decoder.decode(decoder.read(msgs)), None, {("news", 0): (0, 6)})
        assert len(out.result.verdicts) == 6
        assert events == [({("news", 0): (0, 6)}, 0)]  # the heads moved before the work
        assert len(dedup.set_cache) == 6  # which ran, after the hand-over
        assert dedup.index.offsets() == {}  # stored at the commit point; offsets come later
    finally:
        backend.close()
