"""What a batch leaves for the batches after it (its sets kept in the cache, its texts for
the payload dictionary) runs after a shared index's lease, not inside it."""

from __future__ import annotations

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document

from .shared_instances import shared_instances
from .test_dedup import article


def _batch(first: int, n: int = 8) -> list[Document]:
    return [Document(f"d{i}", article(i)) for i in range(first, first + n)]


def test_a_shared_index_keeps_a_batchs_sets_once_the_lease_is_let_go(redis_url: str) -> None:
    with shared_instances(redis_url) as make:
        dedup = make()
        with dedup.index.exclusive():
            result = dedup.decide(_batch(0))
            assert len(dedup.set_cache) == 0  # nothing kept while the lease is held
            dedup.index.apply(dedup.prepare(result))
        dedup.after_lease()
        assert len(dedup.set_cache) == 8
        # Left for later and never run: the next batch runs it first, before deciding.
        with dedup.index.exclusive():
            dedup.index.apply(dedup.prepare(dedup.decide(_batch(8))))
        with dedup.index.exclusive():
            assert len(dedup.set_cache) == 8
            result = dedup.decide(_batch(16))
            assert len(dedup.set_cache) == 16
            dedup.index.apply(dedup.prepare(result))
        dedup.after_lease()
        assert len(dedup.set_cache) == 24


def test_an_index_of_one_writer_keeps_them_at_once() -> None:
    config = DedupConfig()
    dedup = Deduplicator(DedupIndex(MemoryBackend(), IndexParams.of(config)), config)
    dedup.decide(_batch(0))
    assert len(dedup.set_cache) == 8
