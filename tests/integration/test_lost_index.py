"""A lost index is loud: an empty index while the group has committed offsets stops the
service (``index.on_lost = "fail"``), or is rebuilt from the earliest retained messages
(``"rebuild"``), or is carried on with (``"continue"``) with a warning. Real broker, a real
RocksDB directory deleted, a real Redis whose keys were dropped. (Index offsets below what
the broker retains: ``tests/service/test_lost_index.py``.) And a shared index that is whole
is never called lost, by an instance that opened it before another one filled it."""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from stream_dedup.errors import IndexLostError
from stream_dedup.service.config import RedisConfig, ServiceConfig

from .committed_reader import read_committed
from .support import (
    ServiceThread,
    Topics,
    kijiji_documents,
    make_config,
    produce,
    produce_json,
)
from .test_process import wait_until

pytestmark = pytest.mark.broker

DOCUMENTS = 300


def _decide_all(config: ServiceConfig) -> None:
    """Run the service until every document is committed, then stop it."""
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_index_documents", DOCUMENTS)
    svc.wait_for("stream_dedup_commits_total", 1)
    assert svc.stop() == 0


def _config(
    bootstrap: str, topics: Topics, tmp_path: Path, backend: str = "rocksdb", **index: Any
) -> ServiceConfig:
    """The tests' service settings, with ``index`` settings over them (``redis_url``: the
    shared index on that Redis, in a namespace of its own)."""
    config = make_config(bootstrap, topics, tmp_path / "index")
    if backend == "redis":
        redis_config = RedisConfig(url=index.pop("redis_url"), namespace=uuid.uuid4().hex[:8])
        index.update(backend="redis", redis=redis_config)
    return replace(config, index=replace(config.index, **index))


def _lose(config: ServiceConfig) -> None:
    """The index is gone: its directory deleted, or its Redis keys dropped."""
    if config.index.backend == "rocksdb":
        shutil.rmtree(config.index.path)
        return
    client = redis.Redis.from_url(config.index.redis.url)
    keys = list(client.scan_iter(match=f"*{config.index.redis.namespace}*"))
    assert keys
    client.delete(*keys)
    client.close()


@pytest.mark.parametrize("backend", ["rocksdb", "redis"])
def test_an_empty_index_with_committed_group_offsets_stops_the_service(
    bootstrap: str, topics: Topics, tmp_path: Path, redis_url: str, backend: str
) -> None:
    produce_json(bootstrap, topics.input, kijiji_documents(DOCUMENTS))
    extra = {"redis_url": redis_url} if backend == "redis" else {}
    config = _config(bootstrap, topics, tmp_path, backend, **extra)
    _decide_all(config)
    _lose(config)

    svc = ServiceThread(config).start()
    svc.join(60)
    assert isinstance(svc.error, IndexLostError), svc.error
    assert f"{topics.input}:0" in svc.error.committed
    assert svc.error.committed[f"{topics.input}:0"] == DOCUMENTS
    assert 'index.on_lost = "rebuild"' in str(svc.error)
    assert svc.metric("stream_dedup_messages_consumed_total") == 0  # nothing decided


def test_on_lost_rebuild_decides_again_from_the_earliest_message(
    bootstrap: str, topics: Topics, tmp_path: Path, package_logs: list[logging.LogRecord]
) -> None:
    produce_json(bootstrap, topics.input, kijiji_documents(DOCUMENTS))
    config = _config(bootstrap, topics, tmp_path)
    _decide_all(config)
    _lose(config)

    rebuilt = _config(bootstrap, topics, tmp_path, on_lost="rebuild")
    svc = ServiceThread(rebuilt).start()
    svc.wait_for("stream_dedup_index_documents", DOCUMENTS)
    assert svc.stop() == 0
    assert svc.metric("stream_dedup_messages_consumed_total") == DOCUMENTS
    warned = [r for r in package_logs if "consumer group has committed offsets" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING


def test_on_lost_continue_resumes_from_the_group_offsets(
    bootstrap: str, topics: Topics, tmp_path: Path, package_logs: list[logging.LogRecord]
) -> None:
    produce_json(bootstrap, topics.input, kijiji_documents(DOCUMENTS))
    config = _config(bootstrap, topics, tmp_path)
    _decide_all(config)
    _lose(config)

    carried_on = _config(bootstrap, topics, tmp_path, on_lost="continue")
    svc = ServiceThread(carried_on).start()
    svc.wait_for("stream_dedup_assigned_partitions", 1)
    produce_json(bootstrap, topics.input, [{"id": "late", "text": "one more story"}])
    svc.wait_for("stream_dedup_index_documents", 1)
    assert svc.stop() == 0
    assert svc.metric("stream_dedup_messages_consumed_total") == 1  # only what came after
    assert any("consumer group has committed offsets" in r.getMessage() for r in package_logs)


def _records(docs: list[dict[str, str]]) -> Iterator[tuple[None, bytes, None]]:
    return ((None, json.dumps(d).encode(), None) for d in docs)


def _group_at(bootstrap: str, topics: Topics, offsets: list[int]) -> bool:
    """Whether the group's committed offsets of the input's partitions are ``offsets``."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group})
    try:
        asked = [TopicPartition(topics.input, p) for p in range(len(offsets))]
        return [tp.offset for tp in reader.committed(asked, 10)] == offsets
    finally:
        reader.close()


@pytest.mark.parametrize("redis_fixture", ["redis_url", "redis_cluster_url"])
def test_a_shared_index_filled_after_an_instance_opened_it_is_not_lost(
    bootstrap: str, tmp_path: Path, redis_fixture: str, request: pytest.FixtureRequest
) -> None:
    """An instance opens the shared index while it is empty and joins the group only
    after another instance has decided and committed batches (a slow start beside a
    running instance). The partitions it is given have committed offsets, and in
    exactly-once mode the index stores no offset ahead of them: whether the index is
    empty must be read from Redis then, not taken from what it held at opening (it
    stopped with ``IndexLostError``: the two-instance kill loop's flake under load)."""
    url: str = request.getfixturevalue(redis_fixture)
    topics = Topics.fresh()
    topics.create(bootstrap, partitions=2)
    redis_config = RedisConfig(url=url, namespace=uuid.uuid4().hex[:8], group_order=False)

    def instance(n: int) -> ServiceThread:
        config = make_config(
            bootstrap,
            topics,
            tmp_path / f"unused-{n}",
            service={"delivery": "exactly-once"},
            kafka={
                "transactional.id": f"{topics.group}-{n}",
                "partition.assignment.strategy": "cooperative-sticky",
            },
        )
        index = replace(config.index, backend="redis", redis=redis_config)
        return ServiceThread(replace(config, index=index))

    docs = kijiji_documents(4 * 30)
    parts = [docs[0:30], docs[30:60], docs[60:90], docs[90:120]]
    late = instance(1)  # opens the index now, empty
    first = instance(0).start()
    try:
        for p in (0, 1):
            produce(bootstrap, topics.input, _records(parts[p]), p)
        first.wait_for("stream_dedup_index_documents", 60)
        wait_until(lambda: _group_at(bootstrap, topics, [30, 30]), 60, "both partitions committed")
        late.start()
        late.wait_for("stream_dedup_assigned_partitions", 1)  # an IndexLostError is raised here
        for p in (0, 1):
            produce(bootstrap, topics.input, _records(parts[2 + p]), p)
        late.wait_for("stream_dedup_messages_consumed_total", 30)  # its partition's half
        # (the output, not the group's offsets: the test broker may leave those pending
        # while two producers' transactions overlap on an output partition)
        wait_until(lambda: sum(_committed(bootstrap, topics).values()) >= 120, 60, "all out")
    finally:
        first_code = first.stop()
    assert [first_code, late.stop()] == [0, 0]
    assert _committed(bootstrap, topics) == Counter(d["id"] for d in docs)  # each once


def _committed(bootstrap: str, topics: Topics) -> Counter[str]:
    """The ids of the events a ``read_committed`` reader sees."""
    logs = [read_committed(bootstrap, t) for t in (topics.unique, topics.duplicates)]
    return Counter(json.loads(v or b"null")["id"] for log_ in logs for _k, v in log_.committed)
