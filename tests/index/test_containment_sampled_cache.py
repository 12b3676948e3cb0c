"""Sampled buckets answered from memory (``index/sampled_cache.py``): the same decisions
and the same index as reading them, on every single-writer backend, with retention's
epochs, a small bound and a failed write; never on a shared index."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.index.sampled_cache import (
    SAMPLED_PREFIX,
    SampledCache,
    sampled_elsewhere,
    sampled_puts,
)
from stream_dedup.models import Document
from tests.excerpts import excerpt_stream

DOCUMENTS = 2000
BATCH = 250
CONFIG = DedupConfig(containment=0.8)


@pytest.fixture(scope="module")
def docs() -> list[Document]:
    s = excerpt_stream(DOCUMENTS)
    return [Document(r["id"], c) for r, c in zip(s.records, s.contents, strict=True)]


def opened(
    backend: Backend, cache: SampledCache | None, retention: Retention | None = None
) -> tuple[DedupIndex, Deduplicator]:
    """An index on ``backend`` with ``cache`` for its sampled buckets (``None``: its own)."""
    index = DedupIndex(backend, IndexParams.of(CONFIG), retention)
    if cache is not None:
        index._sampled = cache
    return index, Deduplicator(index, CONFIG)


def run(
    backend: Backend,
    docs: list[Document],
    cache: SampledCache | None,
    retention: Retention | None = None,
) -> tuple[list[dict[str, object]], DedupIndex]:
    index, dedup = opened(backend, cache, retention)
    out: list[dict[str, object]] = []
    for at in range(0, len(docs), BATCH):
        out.extend(v.to_json() for v in dedup.process(docs[at : at + BATCH]).verdicts)
    return out, index


def contents(backend: MemoryBackend) -> dict[int, dict[bytes, bytes]]:
    return {e: dict(data) for e, data in backend._epochs.items()}


@pytest.mark.parametrize(
    ("retention", "max_bytes"),
    [(None, 64 << 20), (None, 40_000), (Retention(max_documents=8000), 64 << 20)],
    ids=["no retention", "small bound", "max documents"],
)
def test_answered_buckets_decide_as_reading_them(
    docs: list[Document], retention: Retention | None, max_bytes: int
) -> None:
    read, cached = MemoryBackend(), MemoryBackend()
    plain, _ = run(read, docs, SampledCache(False), retention)
    cache = SampledCache(True, max_bytes)
    answered, _ = run(cached, docs, cache, retention)
    # Most sampled keys asked for were this index's own writes: answered from memory.
    assert cache.answered > 0.5 * DOCUMENTS, (cache.answered, cache.asked)
    assert answered == plain
    assert sum(v.get("relation") == "excerpt" for v in plain) > 200
    assert contents(cached) == contents(read)


@pytest.mark.parametrize("backend_kind", ["rocks"])
def test_every_answer_is_what_rocksdb_holds(
    backend_factory: Callable[[], Backend], docs: list[Document]
) -> None:
    plain, _ = run(MemoryBackend(), docs[:1000], SampledCache(False))
    backend = backend_factory()
    answered, index = run(backend, docs[:1000], None)
    cache = index._sampled
    assert cache.enabled and cache.answered > 0
    assert answered == plain
    held = {**cache._old, **cache._new}
    keys = sorted(held)
    assert len(keys) > 500
    stored = backend.get_many(keys, index.batch_epoch())
    assert stored == [held[k] for k in keys]


def test_a_failed_write_empties_it(docs: list[Document], monkeypatch: pytest.MonkeyPatch) -> None:
    plain, _ = run(MemoryBackend(), docs[:1000], SampledCache(False))
    backend = MemoryBackend()
    index, dedup = opened(backend, None)
    out: list[dict[str, object]] = []
    for at in range(0, 500, BATCH):
        out.extend(v.to_json() for v in dedup.process(docs[at : at + BATCH]).verdicts)
    assert len(index._sampled) > 0
    write = backend.apply

    def fails(*args: object) -> None:
        raise OSError("the disk is full")

    monkeypatch.setattr(backend, "apply", fails)
    with pytest.raises(OSError):
        dedup.process(docs[500 : 500 + BATCH])
    assert len(index._sampled) == 0
    monkeypatch.setattr(backend, "apply", write)
    # The batch decided again, as the service does after a failed commit, and the rest.
    for at in range(500, 1000, BATCH):
        out.extend(v.to_json() for v in dedup.process(docs[at : at + BATCH]).verdicts)
    assert out == plain
    cache = index._sampled
    assert cache.answered > 0
    held = {**cache._old, **cache._new}
    keys = sorted(held)
    assert backend.get_many(keys, index.batch_epoch()) == [held[k] for k in keys]


def test_a_sampled_bucket_written_unordered_empties_it(docs: list[Document]) -> None:
    index, dedup = opened(MemoryBackend(), None)
    dedup.process(docs[:BATCH])
    assert len(index._sampled) > 0
    index.commit({SAMPLED_PREFIX + bytes(8): bytes(8)}, {})
    assert len(index._sampled) == 0


@pytest.mark.parametrize("backend_kind", ["redis", "redis-cluster"])
def test_never_on_a_shared_index(
    backend_factory: Callable[[], Backend], docs: list[Document]
) -> None:
    plain, _ = run(MemoryBackend(), docs[:500], SampledCache(False))
    shared, index = run(backend_factory(), docs[:500], None)
    assert not index._sampled.enabled and index._sampled.asked == 0
    assert shared == plain


def test_the_sampled_puts_are_found_among_ordered_ones() -> None:
    keys = [b"b\x00\x01" + bytes(8), b"b\xff\xfe" + bytes(8), SAMPLED_PREFIX + b"\x01" * 8]
    keys += [SAMPLED_PREFIX + b"\xff" * 8]
    values = [bytes([i]) * 8 for i in range(len(keys))]
    found = sampled_puts(keys, values)
    assert list(found[0]) == keys[2:] and list(found[1]) == values[2:]
    assert sampled_elsewhere({keys[3]: b""}) and not sampled_elsewhere({keys[1]: b""})


def test_the_newer_generation_is_asked_first() -> None:
    cache = SampledCache(True, max_bytes=2 * (120 + 8) * 3)
    keys = [bytes([i]) for i in range(4)]
    cache.committed(1, keys[:3], [b"a" * 8] * 3)  # fills the newer half: it becomes the older
    cache.committed(1, keys[:1], [b"b" * 8])
    at, values = cache.get(keys)
    assert at == [0, 1, 2] and values == [b"b" * 8, b"a" * 8, b"a" * 8]
    cache.committed(2, keys[3:], [b"c" * 8])  # another epoch: the first one's are gone
    assert cache.get(keys) == ([3], [b"c" * 8])
    assert not cache.answers(1) and cache.answers(2)
    np.testing.assert_equal(len(cache), 1)
