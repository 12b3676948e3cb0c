"""Fixtures shared by the whole suite: index factories over both backends, the real ads."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stream_dedup.index import Backend, DedupIndex, IndexParams, MemoryBackend, RocksBackend
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.tools import redis_local
from tests.corpus import kijiji_contents

BackendFactory = Callable[[], Backend]
IndexFactory = Callable[[IndexParams | None], DedupIndex]


@pytest.fixture(params=["memory", "rocks", "redis", "redis-cluster"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Which backend a parametrised test runs on."""
    kind: str = request.param
    return kind


def _redis(
    tmp_path_factory: pytest.TempPathFactory, env: str, start: Callable[[Path], Any]
) -> Iterator[str]:
    given = os.environ.get(env)
    if given:
        yield given
        return
    if redis_local.redis_server_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with start(tmp_path_factory.mktemp(env.lower())) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real single-node Redis on loopback (or ``REDIS_URL``)."""
    yield from _redis(tmp_path_factory, "REDIS_URL", redis_local.single_node)


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real three-master Redis Cluster on loopback (or ``REDIS_CLUSTER_URL``)."""
    yield from _redis(tmp_path_factory, "REDIS_CLUSTER_URL", redis_local.cluster)


_namespaces = itertools.count()


def fresh_namespace() -> str:
    """A namespace no test used before: each test's index starts empty on a shared server."""
    return f"test-{os.getpid()}-{next(_namespaces)}"


@pytest.fixture
def redis_backend_url(backend_kind: str, request: pytest.FixtureRequest) -> str | None:
    """The Redis URL for the redis kinds of ``backend_kind``, else ``None``."""
    if backend_kind == "redis":
        url: str = request.getfixturevalue("redis_url")
        return url
    if backend_kind == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
        return url
    return None


@pytest.fixture
def backend_factory(
    backend_kind: str, tmp_path: Path, redis_backend_url: str | None
) -> Iterator[BackendFactory]:
    """``make()`` opens a fresh, empty backend of ``backend_kind``; all are closed afterwards.

    RocksDB backends live in their own directory under ``tmp_path``, Redis ones in a
    namespace of their own.
    """
    opened: list[Backend] = []

    def make() -> Backend:
        backend: Backend
        if redis_backend_url is not None:
            backend = RedisBackend(redis_backend_url, namespace=fresh_namespace())
        elif backend_kind == "memory":
            backend = MemoryBackend()
        else:
            backend = RocksBackend(tmp_path / f"rocks-{len(opened)}")
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        with contextlib.suppress(Exception):  # already closed by the test
            backend.close()


@pytest.fixture
def index_factory(backend_factory: BackendFactory) -> IndexFactory:
    """``make(params)`` opens a :class:`DedupIndex` on a fresh backend of ``backend_kind``."""

    def make(params: IndexParams | None) -> DedupIndex:
        return DedupIndex(backend_factory(), params)

    return make


@pytest.fixture(scope="session")
def kijiji_ads() -> list[tuple[str, str]]:
    """The real Kijiji ads (``tests/data``) as ``(id, content)``, in file order.

    id is the 1-based row number, content Title + " " + Short Description.
    """
    return [(str(row), content) for row, content in enumerate(kijiji_contents(), start=1)]


@pytest.fixture
def package_logs() -> Iterator[list[logging.LogRecord]]:
    """Every record the package logs at INFO or above during the test.

    Kept by a handler on the package's logger itself, so it holds each record once,
    whatever an earlier test (``setup_logging``: its own handler, no propagation) or
    pytest's ``caplog`` did to that logger.
    """
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("stream_dedup")
    handler, level = Keep(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests marked ``slow`` first.

    Under pytest-xdist a worker takes tests in collection order, so a minute-long kill
    loop collected late starts when the others are done and runs alone at the end. Started
    first, the long tests overlap the many short ones and the suite ends sooner. The sort
    is stable: the order within each group stays the collection order. ``make test`` hands
    the workers one test at a time (``--maxschedchunk 1``): in xdist's default chunks of
    ~100 consecutive tests, every slow test went to the first worker.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
