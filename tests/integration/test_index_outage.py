"""The shared index's Redis goes away while the service runs, or is not up yet when it
starts: a short outage is ridden out, a long one stops the service.

The broker is real (Tansu) and so is Redis: a server that persists every command (AOF) is
stopped and started again on the same port, as a restart or failover does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from prometheus_client import CollectorRegistry

from stream_dedup.errors import IndexStoreError, IndexUnreachableError
from stream_dedup.index import DedupIndex
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.service.config import RedisConfig, ServiceConfig
from stream_dedup.service.loop import Service
from stream_dedup.tools import redis_local
from stream_dedup.tools.broker import free_port
from tests.conftest import fresh_namespace

from .support import (
    ServiceThread,
    Topics,
    events,
    http_get,
    kijiji_documents,
    make_config,
    offline_reference,
    produce,
    produce_json,
    read_topic,
    scrape,
)

pytestmark = pytest.mark.broker

HALF = 150


def shared_config(
    bootstrap: str, topics: Topics, tmp_path: Path, url: str, limit_s: float
) -> tuple[ServiceConfig, str]:
    namespace = fresh_namespace()
    config = make_config(bootstrap, topics, tmp_path / "unused", batch={"max_messages": 50})
    redis = RedisConfig(url, namespace=namespace, lock_ttl_ms=2000, outage_limit_s=limit_s)
    index = dataclasses.replace(config.index, backend="redis", redis=redis)
    return dataclasses.replace(config, index=index), namespace


def ready(svc: ServiceThread) -> tuple[int, dict[str, Any]]:
    assert svc.service.http is not None
    status, body = http_get(svc.service.http.port, "/readyz")
    return status, json.loads(body)


def wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_short_redis_outage_is_ridden_out_and_nothing_is_decided_twice(
    bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    node: redis_local.PersistentNode,
    package_logs: list[logging.LogRecord],
) -> None:
    docs = kijiji_documents(2 * HALF)
    reference = offline_reference(docs, tmp_path)
    config, namespace = shared_config(bootstrap, topics, tmp_path, node.url, 60.0)
    produce_json(bootstrap, topics.input, docs[:HALF])
    svc = ServiceThread(config).start()
    svc.wait_for("stream_dedup_messages_consumed_total", HALF)
    wait_until(lambda: ready(svc)[0] == 200, 20, "the service never became ready")

    node.stop()
    produce_json(bootstrap, topics.input, docs[HALF:])  # consumed, not storable meanwhile
    produce(bootstrap, topics.input, [(None, b'{"id": "bad", "title": ', None)])
    wait_until(lambda: svc.metric("stream_dedup_index_up") == 0, 20, "no outage noticed")
    status, body = ready(svc)
    assert status == 503 and body["index_reachable"] is False
    assert svc.service.http is not None  # /metrics still answers, without the index's gauges
    assert scrape(svc.service.http.port, "stream_dedup_index_up") == 0
    time.sleep(3)  # a few seconds of outage, retried
    retries = svc.metric("stream_dedup_index_retries_total")
    assert retries >= 3
    assert svc.error is None
    node.start()

    wait_until(lambda: svc.metric("stream_dedup_index_up") == 1, 30, "outage never ended")
    wait_until(lambda: ready(svc)[0] == 200, 20, "not ready after the outage")
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs) + 1, timeout_s=30)
    assert svc.stop() == 0
    index = DedupIndex(RedisBackend(node.url, namespace=namespace), None)
    try:
        assert index.counter("documents") == len(docs)  # each decided and stored once
    finally:
        index.close()

    got = events(read_topic(bootstrap, topics.unique, 1, timeout_s=10))
    got += events(read_topic(bootstrap, topics.duplicates, 0, timeout_s=10))
    first: dict[str, dict[str, Any]] = {}
    for ev in got:
        assert first.setdefault(ev["id"], ev) == ev, f"{ev['id']} emitted twice, differently"
    assert set(first) == {d["id"] for d in docs}
    for doc_id, ev in first.items():
        ref = reference[doc_id]
        fields = ("verdict", "duplicate_of", "similarity", "cluster_id")
        assert {k: ev[k] for k in fields} == {k: ref[k] for k in fields}, doc_id
    dead = read_topic(bootstrap, topics.dlq, 1, timeout_s=5, idle_s=1)
    assert [m.value() for m in dead] == [b'{"id": "bad", "title": ']
    assert svc.metric("stream_dedup_dead_letters_total", {"reason": "invalid_json"}) == 1
    said = [r.getMessage() for r in package_logs if r.name == "stream_dedup.service.index"]
    assert said == ["shared index unreachable; retrying", "shared index reachable again"]


def test_an_outage_during_a_rebalance_is_waited_out(
    bootstrap: str, topics: Topics, tmp_path: Path, node: redis_local.PersistentNode
) -> None:
    """A rebalance reads the partitions' offsets from the index: in an outage it waits."""
    docs = kijiji_documents(40)
    config, _namespace = shared_config(bootstrap, topics, tmp_path, node.url, 60.0)
    svc = ServiceThread(config).start()
    wait_until(lambda: ready(svc)[0] == 200, 30, "the service never became ready")
    node.stop()
    other = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group})
    other.subscribe([topics.input])  # joins the group: the service is assigned again
    try:
        deadline = time.monotonic() + 30
        while svc.metric("stream_dedup_index_up") == 1:
            assert time.monotonic() < deadline, "the rebalance did not wait for Redis"
            other.poll(0.1)
        assert svc.metric("stream_dedup_rebalances_total", {"kind": "assign"}) >= 1
    finally:
        other.close()  # leaves the group: the service gets every partition back
    node.start()
    produce_json(bootstrap, topics.input, docs)
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs))
    wait_until(lambda: ready(svc)[0] == 200, 30, "not ready after the outage")
    assert svc.stop() == 0
    assert svc.metric("stream_dedup_index_up") == 1


def test_an_outage_longer_than_the_limit_stops_the_service(
    bootstrap: str, topics: Topics, tmp_path: Path, node: redis_local.PersistentNode
) -> None:
    docs = kijiji_documents(60)
    config, _namespace = shared_config(bootstrap, topics, tmp_path, node.url, 1.5)
    svc = ServiceThread(config).start()
    wait_until(lambda: svc.metric("stream_dedup_assigned_partitions") >= 1, 30, "no partitions")
    node.stop()
    produce_json(bootstrap, topics.input, docs)
    started = time.monotonic()
    svc.join(30)
    assert time.monotonic() - started >= 1.5
    assert isinstance(svc.error, IndexUnreachableError)
    assert "over index.redis.outage_limit_s = 1.5 s" in str(svc.error)
    assert svc.metric("stream_dedup_index_up") == 0
    assert svc.metric("stream_dedup_index_retries_total") >= 2
    assert svc.metric("stream_dedup_commits_total") == 0


def test_redis_down_while_the_service_starts_is_waited_for(
    bootstrap: str,
    topics: Topics,
    tmp_path: Path,
    node: redis_local.PersistentNode,
    package_logs: list[logging.LogRecord],
) -> None:
    """Redis comes up a few seconds after the service: opening the index waits for it,
    healthy and not ready meanwhile, then the service runs as if it had been there."""
    docs = kijiji_documents(40)
    config, namespace = shared_config(bootstrap, topics, tmp_path, node.url, 60.0)
    port = free_port()
    config = dataclasses.replace(config, http=dataclasses.replace(config.http, port=port))
    node.stop()
    produce_json(bootstrap, topics.input, docs)
    built: list[ServiceThread] = []
    starting = threading.Thread(target=lambda: built.append(ServiceThread(config)), daemon=True)
    starting.start()
    wait_until(
        lambda: (scrape(port, "stream_dedup_index_retries_total") or 0) >= 2, 20, "no retries"
    )
    status, body = http_get(port, "/readyz")
    assert status == 503 and json.loads(body)["index_reachable"] is False
    assert http_get(port, "/healthz")[0] == 200  # waiting is not a stuck loop
    assert scrape(port, "stream_dedup_index_up") == 0
    time.sleep(2)
    assert starting.is_alive() and not built  # still waiting, not stopped
    node.start()

    starting.join(30)
    assert not starting.is_alive()
    svc = built[0].start()
    svc.wait_for("stream_dedup_messages_consumed_total", len(docs))
    wait_until(lambda: ready(svc)[0] == 200, 30, "not ready once Redis answered")
    assert svc.metric("stream_dedup_index_up") == 1
    assert svc.stop() == 0
    index = DedupIndex(RedisBackend(node.url, namespace=namespace), None)
    try:
        assert index.counter("documents") == len(docs)
    finally:
        index.close()
    said = [r.getMessage() for r in package_logs if r.name == "stream_dedup.service.index"]
    assert said == ["shared index unreachable; retrying", "shared index reachable again"]


def test_redis_down_at_start_longer_than_the_limit_stops_with_exit_code_3(
    bootstrap: str, topics: Topics, tmp_path: Path, node: redis_local.PersistentNode
) -> None:
    config, _namespace = shared_config(bootstrap, topics, tmp_path, node.url, 1.5)
    node.stop()
    started = time.monotonic()
    with pytest.raises(IndexUnreachableError, match=r"over index\.redis\.outage_limit_s = 1\.5 s"):
        Service(config, CollectorRegistry())
    assert time.monotonic() - started >= 1.5
    assert issubclass(IndexUnreachableError, IndexStoreError)  # `run` exits with 3 on it
