"""The persistent state of the detector: band buckets, document records, offsets.

Layers: :mod:`.backend` is the key-value contract (RocksDB in :mod:`.rocks`, Redis for an
index shared by several instances in :mod:`.redis_backend`, a dict in :mod:`.memory`),
:mod:`.keys` the byte layout, :mod:`.records` the value encodings and
:mod:`.store` the typed index the deduplicator and the service use. Nothing here knows
about Kafka: input offsets are opaque (topic, partition) -> next offset pairs.
"""

from stream_dedup.index.backend import Backend
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.rocks import RocksBackend
from stream_dedup.index.store import DedupIndex, IndexStats, open_index

__all__ = [
    "Backend",
    "DedupIndex",
    "IndexParams",
    "IndexStats",
    "MemoryBackend",
    "RocksBackend",
    "open_index",
]
