"""Fixtures of the shared-index tests: a real Redis of each kind, instances on one index.

The lease, change-log, redo and group-heads tests run on a single Redis node and on the
3-master cluster alike (the cluster spreads an index's keys over slots, the node does
not); they share these fixtures instead of each parametrising ``backend_kind`` anew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from stream_dedup.dedup import Deduplicator

from .shared_instances import shared_instances


@pytest.fixture(params=["redis", "redis-cluster"])
def shared_redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of a real Redis a shared index lives on: a single node, then a cluster."""
    url: str = request.getfixturevalue(
        "redis_url" if request.param == "redis" else "redis_cluster_url"
    )
    return url


@pytest.fixture
def shared(shared_redis_url: str) -> Iterator[Callable[[], Deduplicator]]:
    """``make()``: one more instance (its own connection and index object) on one index."""
    with shared_instances(shared_redis_url) as make:
        yield make
