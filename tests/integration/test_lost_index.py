"""A lost index is loud: an empty index while the group has committed offsets stops the
service (``index.on_lost = "fail"``), or is rebuilt from the earliest retained messages
(``"rebuild"``), or is carried on with (``"continue"``) with a warning. Real broker, a real
RocksDB directory deleted, a real Redis whose keys were dropped. (Index offsets below what
the broker retains: ``tests/service/test_lost_index.py``.)"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from stream_dedup.errors import IndexLostError
from stream_dedup.service.config import RedisConfig, ServiceConfig

from .support import ServiceThread, Topics, kijiji_documents, make_config, produce_json

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
