"""Full sampled buckets left unread (``dedup/full_buckets.py``): the same decisions and
the same index as reading them, with and without retention."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.full_buckets import FullBuckets
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.models import Document
from tests.excerpts import excerpt_stream

DOCUMENTS = 2000
BATCH = 250


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    s = excerpt_stream(DOCUMENTS)
    return [Document(r["id"], c) for r, c in zip(s.records, s.contents, strict=True)]


def run(
    backend: Backend,
    docs: list[Document],
    remember: bool,
    retention: Retention | None = None,
    batch: int = BATCH,
) -> tuple[list[dict[str, object]], int, Deduplicator]:
    cfg = DedupConfig(containment=0.8)
    index = DedupIndex(backend, IndexParams.of(cfg), retention)
    dedup = Deduplicator(index, cfg)
    if not remember:
        dedup.full_buckets = None
    out: list[dict[str, object]] = []
    for at in range(0, len(docs), batch):
        out.extend(v.to_json() for v in dedup.process(docs[at : at + batch]).verdicts)
    return out, 0 if dedup.full_buckets is None else dedup.full_buckets.left_unread, dedup


def contents(backend: MemoryBackend) -> dict[int, dict[bytes, bytes]]:
    return {e: dict(data) for e, data in backend._epochs.items()}


@pytest.mark.parametrize(
    "retention",
    [None, Retention(max_documents=8000)],
    ids=["no retention", "max documents"],
)
def test_unread_full_buckets_decide_as_reading_them(
    docs: list[Document], retention: Retention | None
) -> None:
    read, unread = MemoryBackend(), MemoryBackend()
    # With retention: epochs of 1,000 documents, so the cache starts anew half-way.
    plain, _, _ = run(read, docs, remember=False, retention=retention)
    cached, unread_values, _ = run(unread, docs, remember=True, retention=retention)
    assert unread_values > 0  # the stream's common values fill buckets: some were left unread
    assert cached == plain
    assert sum(v.get("relation") == "excerpt" for v in plain) > 200
    assert contents(unread) == contents(read)


@pytest.fixture(params=["rocks", "redis"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def test_on_rocksdb_and_redis(backend_factory: Callable[[], Backend], docs: list[Document]) -> None:
    plain, _, _ = run(backend_factory(), docs[:1000], remember=False)
    cached, remembered, _ = run(backend_factory(), docs[:1000], remember=True)
    assert remembered > 0 and cached == plain


def members(buckets: dict[int, list[int]], n_keys: int) -> tuple[np.ndarray, ...]:
    length = np.array([len(buckets.get(k, [])) for k in range(n_keys)], dtype=np.int64)
    flat = [d for k in range(n_keys) for d in buckets.get(k, [])]
    return np.cumsum(length) - length, length, np.asarray(flat, dtype=np.uint64)


def test_what_is_remembered_and_when_it_is_forgotten() -> None:
    full = FullBuckets(cap=3)
    values = np.array([5, 9, 12], dtype=np.uint64)
    assert not full.known(values, epoch=1, cutoff=0).any()
    full.learn(values, members({0: [10, 11, 12], 1: [10, 11], 2: [20, 21, 22, 23]}, 3))  # type: ignore[arg-type]
    assert len(full) == 2
    asked = np.array([1, 5, 9, 12, 40], dtype=np.uint64)
    assert full.known(asked, epoch=1, cutoff=10).tolist() == [False, True, False, True, False]
    # The cutoff passing a remembered bucket's oldest member: it may vote again.
    assert not full.known(asked, epoch=1, cutoff=11).any()
    assert len(full) == 0
    full.learn(values, members({0: [10, 11, 12]}, 3))  # type: ignore[arg-type]
    assert full.known(asked, epoch=1, cutoff=0).sum() == 1
    # Another epoch: its buckets start empty.
    assert not full.known(asked, epoch=2, cutoff=0).any()
    # Past the bound nothing more is remembered.
    small = FullBuckets(cap=1, max_values=1)
    small.learn(values, members({0: [1], 1: [2]}, 3))  # type: ignore[arg-type]
    assert len(small) == 0
