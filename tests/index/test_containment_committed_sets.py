"""Candidates' sets served from the cache without their records (``SetCache.committed_spans``):
the same decisions and the same index as reading every candidate's record, fewer records
read, and nothing served from a batch that was never committed."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.hashing import U32
from stream_dedup.core.shingles import I64
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.store import DocRecord
from stream_dedup.models import Document
from tests.excerpts import excerpt_stream

BATCH = 250


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    s = excerpt_stream(1500)
    return [Document(r["id"], c) for r, c in zip(s.records, s.contents, strict=True)]


def deduplicator(backend: Backend, served: bool) -> tuple[Deduplicator, list[int]]:
    """A deduplicator with containment on, and the list of record counts it reads.
    ``served=False``: every candidate's record is read, as before sets were served."""
    cfg = DedupConfig(containment=0.8)
    index = DedupIndex(backend, IndexParams.of(cfg))
    dedup = Deduplicator(index, cfg)
    if not served:

        def none_held(docnums: Sequence[int]) -> tuple[I64, list[U32], I64, I64]:
            n = len(docnums)
            return np.full(n, -1, dtype=np.int64), [], np.zeros(n, np.int64), np.zeros(n, np.int64)

        dedup.set_cache.committed_spans = none_held  # type: ignore[method-assign]
    reads: list[int] = []
    read_records = index.read_records

    def counted(docnums: Sequence[int]) -> dict[int, DocRecord]:
        reads.append(len(docnums))
        return read_records(docnums)

    index.read_records = counted  # type: ignore[method-assign]
    return dedup, reads


def decide_all(dedup: Deduplicator, docs: list[Document]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for at in range(0, len(docs), BATCH):
        out.extend(v.to_json() for v in dedup.process(docs[at : at + BATCH]).verdicts)
    return out


@pytest.fixture(params=["memory", "rocks"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


def test_served_sets_decide_as_reading_every_record(
    backend_factory: Callable[[], Backend], docs: list[Document]
) -> None:
    read, served = backend_factory(), backend_factory()
    dedup_read, reads_all = deduplicator(read, served=False)
    dedup_served, reads_fewer = deduplicator(served, served=True)
    plain = decide_all(dedup_read, docs)
    assert decide_all(dedup_served, docs) == plain
    assert sum(v.get("relation") == "excerpt" for v in plain) > 100
    assert sum(reads_fewer) < 0.7 * sum(reads_all)  # most failed candidates were not read
    if isinstance(read, MemoryBackend) and isinstance(served, MemoryBackend):
        assert dict(served._epochs[0]) == dict(read._epochs[0])


def test_a_batch_never_committed_serves_no_set(docs: list[Document]) -> None:
    """A batch decided and not committed keeps its sets under docnums that the next batch
    gives to other texts: those later texts' excerpts are decided as if it never ran."""
    clean, _ = deduplicator(MemoryBackend(), served=True)
    failed, _ = deduplicator(MemoryBackend(), served=True)
    first, later = docs[:BATCH], docs[BATCH : 4 * BATCH]
    decide_all(clean, first)
    decide_all(failed, first)
    failed.decide(docs[4 * BATCH : 5 * BATCH])  # never committed: its docnums come again
    failed.decide(docs[5 * BATCH : 5 * BATCH + 50])  # nor this one
    assert decide_all(failed, later) == decide_all(clean, later)
    assert failed.index.counter("indexed") == clean.index.counter("indexed")
