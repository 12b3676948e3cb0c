"""Several instances of one shared (Redis) index in one test process.

Each instance is its own connection and index object over one namespace, as separate
service processes would be; the tests of the lease, its change log and its redo records
share this setup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.models import Document
from tests.conftest import fresh_namespace


@contextmanager
def shared_instances(
    url: str, backend: type[RedisBackend] = RedisBackend
) -> Iterator[Callable[[], Deduplicator]]:
    """``make()``: one more instance on one fresh index (a ``backend`` subclass counts
    or breaks what a test needs); every backend made is closed on exit."""
    namespace = fresh_namespace()
    config = DedupConfig()
    opened: list[RedisBackend] = []

    def make() -> Deduplicator:
        instance = backend(url, namespace=namespace, lock_ttl_ms=2000)
        opened.append(instance)
        return Deduplicator(DedupIndex(instance, IndexParams.of(config)), config)

    try:
        yield make
    finally:
        for instance in opened:
            instance.close()


def decide_and_store(dedup: Deduplicator, docs: list[Document]) -> dict[str, str | None]:
    """What the service does with a batch of a shared index: decide and store in one lease."""
    with dedup.index.exclusive():
        result = dedup.decide(docs)
        dedup.index.apply(dedup.prepare(result))
    dedup.after_lease()
    return {v.id: v.duplicate_of for v in result.verdicts}
