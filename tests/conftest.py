"""Fixtures shared by the whole suite: index factories over both backends, the real ads."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_dedup.index import Backend, DedupIndex, IndexParams, MemoryBackend, RocksBackend

#: The real rental ads every checkout has beside the project (see the shared README).
KIJIJI_TSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "kijiji_rent_rome.tsv"

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


def read_kijiji() -> list[tuple[str, str]]:
    """``(id, content)`` per ad: id is the 1-based row number, content Title + " " + Short
    Description. Read literally: split on tabs, no quote handling, mojibake kept."""
    lines = KIJIJI_TSV.read_bytes().decode("utf-8").split("\n")  # no newline translation
    header = lines[0].split("\t")
    title, desc = header.index("Title"), header.index("Short Description")
    ads = []
    for row, line in enumerate(lines[1:], start=1):
        if not line:
            continue
        fields = line.split("\t")
        ads.append((str(row), fields[title] + " " + fields[desc]))
    return ads


@pytest.fixture(scope="session")
def kijiji_ads() -> list[tuple[str, str]]:
    """The real Kijiji ads as ``(id, content)``, in file order."""
    ads = read_kijiji()
    assert len(ads) == 2627, "the shared data set changed"
    return ads


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
