"""What ``stream-dedup stats`` prints about an index (:meth:`.store.DedupIndex.stats`)."""

from __future__ import annotations

from dataclasses import dataclass

from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import NO_RETENTION, Retention

__all__ = ["IndexStats"]


@dataclass(frozen=True, slots=True)
class IndexStats:
    """What ``stream-dedup stats`` prints."""

    location: str
    params: IndexParams
    documents: int
    indexed: int
    duplicates: int
    empty: int
    size_bytes: int
    #: Documents the index holds (indexed and not expired), and those expired so far.
    held: int = 0
    expired: int = 0
    #: Unix time (seconds) of the oldest document held, and of the stream's clock
    #: (``None``: no document time known).
    oldest_time: int | None = None
    clock: int | None = None
    #: Live epochs, and the retention in force.
    epochs: int = 1
    retention: Retention = NO_RETENTION
