"""The shared index's strategy confirms a batch's delivery and stores its offsets when the
loop asks (:meth:`SharedIndex.deliver_pending`, after collecting the next batch), not
before returning from its commit; at the latest before the next batch is stored. In
exactly-once mode the transaction commits at once."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from stream_dedup.dedup import Deduplicator
from stream_dedup.index.params import IndexParams
from stream_dedup.service.broker_watch import BrokerWatch
from stream_dedup.service.checkpoint import open_strategy
from stream_dedup.service.commit_strategy import CommitStrategy
from stream_dedup.service.config import ServiceConfig
from stream_dedup.service.config_loading import build_config
from stream_dedup.service.decide import Decider
from stream_dedup.service.inputs import InputDecoder
from stream_dedup.service.kafka import build_consumer
from stream_dedup.service.metrics import Metrics
from stream_dedup.service.starting import open_configured_index
from stream_dedup.tools.broker import free_port
from tests.conftest import fresh_namespace
from tests.index.test_dedup import article

from .support import Topics, process_config, read_topic


def _config(
    bootstrap: str, topics: Topics, redis_url: str, tmp_path: Path, delivery: str = "at-least-once"
) -> ServiceConfig:
    settings = process_config(bootstrap, topics, tmp_path / "unused", free_port())
    settings["index"] = {
        "backend": "redis",
        "redis": {"url": redis_url, "namespace": fresh_namespace()},
    }
    settings["service"]["delivery"] = delivery
    if delivery == "exactly-once":
        settings["kafka"]["transactional.id"] = f"{topics.group}-one"
    return build_config([settings])


def _batch(topic: str, first: int, n: int) -> list[Message]:
    return [
        Message(
            topic=topic,
            partition=0,
            offset=i,
            value=json.dumps({"id": f"d{i}", "text": article(i % 4)}).encode(),
            timestamp=(1, 1000 + i),
        )
        for i in range(first, first + n)
    ]


class _Commits:
    """A strategy as the service opens it, committing batches of one input partition."""

    def __init__(self, config: ServiceConfig) -> None:
        self.index = open_configured_index(config.index, IndexParams.of(config.dedup))
        dedup = Deduplicator(self.index, config.dedup)
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry)
        self.consumer = build_consumer(config.client_settings(), BrokerWatch("consumer"), None)
        self.strategy: CommitStrategy = open_strategy(
            config, self.consumer, Decider(config, dedup, metrics), metrics, lambda: True
        )
        self.decoder = InputDecoder(config.input.message_format())
        self.topic = config.input.topics[0]

    def commit(self, first: int, n: int) -> None:
        msgs = _batch(self.topic, first, n)
        decoded = self.decoder.decode(self.decoder.read(msgs))
        self.strategy.commit(decoded, None, {(self.topic, 0): (first, first + n)}, replaying=False)

    @property
    def checkpoints(self) -> float:
        """Batches confirmed (the service's ``stream_dedup_commits_total``)."""
        return self.registry.get_sample_value("stream_dedup_commits_total") or 0.0

    def offsets(self) -> dict[tuple[str, int], int]:
        return self.index.offsets()

    def close(self) -> None:
        assert self.strategy.close(10) == 0
        self.consumer.close()
        self.index.close()


def test_a_batch_is_delivered_when_the_loop_asks_or_before_the_next_is_stored(
    bootstrap: str, topics: Topics, redis_url: str, tmp_path: Path
) -> None:
    commits = _Commits(_config(bootstrap, topics, redis_url, tmp_path))
    try:
        tp = (topics.input, 0)
        commits.commit(0, 6)
        # Stored and produced; its offsets wait for its delivery to be confirmed.
        assert commits.index.counter("documents") == 6
        assert commits.offsets() == {}
        assert commits.checkpoints == 0
        commits.strategy.deliver_pending()  # the loop, once it collected the next batch
        assert commits.offsets() == {tp: 6}
        assert commits.checkpoints == 1
        commits.strategy.deliver_pending()  # nothing left: nothing happens twice
        assert commits.checkpoints == 1

        commits.commit(6, 6)
        commits.commit(12, 6)  # delivers the batch before it first
        assert commits.offsets() == {tp: 12}
        assert commits.checkpoints == 2
        commits.strategy.drop_pending()  # a failure: the last batch is consumed again
        commits.strategy.deliver_pending()
        assert commits.offsets() == {tp: 12}
        assert commits.checkpoints == 2
        # Its events went out all the same (produced before the failure): a replay of its
        # stored verdicts adds copies, never different ones.
        out = read_topic(bootstrap, topics.unique, 1) + read_topic(bootstrap, topics.duplicates, 1)
        assert sorted(json.loads(m.value() or b"")["id"] for m in out) == sorted(
            f"d{i}" for i in range(18)
        )
    finally:
        commits.close()


def test_exactly_once_commits_the_transaction_before_returning(
    bootstrap: str, topics: Topics, redis_url: str, tmp_path: Path
) -> None:
    config = _config(bootstrap, topics, redis_url, tmp_path, delivery="exactly-once")
    commits = _Commits(config)
    try:
        commits.commit(0, 6)
        assert commits.offsets() == {(topics.input, 0): 6}
        assert commits.checkpoints == 1
    finally:
        commits.close()
