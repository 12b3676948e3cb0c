"""Fixtures shared by the whole suite: index factories over both backends, the real ads."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_dedup.index import Backend, DedupIndex, IndexParams, MemoryBackend, RocksBackend
from tests.corpus import kijiji_contents

BackendFactory = Callable[[], Backend]
IndexFactory = Callable[[IndexParams | None], DedupIndex]


@pytest.fixture(params=["memory", "rocks"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Which backend a parametrised test runs on."""
    kind: str = request.param
    return kind


@pytest.fixture
def backend_factory(backend_kind: str, tmp_path: Path) -> Iterator[BackendFactory]:
    """``make()`` opens a fresh, empty backend of ``backend_kind``; all are closed afterwards.

    RocksDB backends live in their own directory under ``tmp_path``.
    """
    opened: list[Backend] = []

    def make() -> Backend:
        backend: Backend
        if backend_kind == "memory":
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
