"""The persistent state of the detector: band buckets, document records, offsets.

Layers: :mod:`.backend` is the key-value contract (RocksDB in :mod:`.rocks`, Redis for an
index shared by several instances in :mod:`.redis_backend`, a dict in :mod:`.memory`),
:mod:`.keys` the byte layout, :mod:`.records` the value encodings, :mod:`.store` the typed
index the deduplicator and the service use (its typed reads in :mod:`.reads`, a batch's
staged writes in :mod:`.staged` and :mod:`.bucket_records`: no module outside this package
reads or writes the index's bytes), and :mod:`.opener` the one door every caller opens an
index through. Nothing here knows about Kafka: input offsets are opaque (topic, partition)
-> next offset pairs.

The names below are loaded on first use, so that importing the opener loads neither the
RocksDB binding nor the Redis client until an index on that backend is opened.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stream_dedup.index.backend import Backend
    from stream_dedup.index.memory import MemoryBackend
    from stream_dedup.index.opener import RedisSettings, open_index
    from stream_dedup.index.params import IndexParams
    from stream_dedup.index.rocks import RocksBackend
    from stream_dedup.index.store import DedupIndex, IndexStats

#: Public name -> the module that defines it.
_EXPORTS = {
    "Backend": "stream_dedup.index.backend",
    "DedupIndex": "stream_dedup.index.store",
    "IndexParams": "stream_dedup.index.params",
    "IndexStats": "stream_dedup.index.store",
    "MemoryBackend": "stream_dedup.index.memory",
    "RedisSettings": "stream_dedup.index.opener",
    "RocksBackend": "stream_dedup.index.rocks",
    "open_index": "stream_dedup.index.opener",
}

__all__ = [
    "Backend",
    "DedupIndex",
    "IndexParams",
    "IndexStats",
    "MemoryBackend",
    "RedisSettings",
    "RocksBackend",
    "open_index",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stream_dedup.index' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
