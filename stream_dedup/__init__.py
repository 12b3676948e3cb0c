"""stream-dedup: online near-duplicate detection for document streams.

The package's folders are its layers, each using only those below it:

- :mod:`stream_dedup.core`: text -> sketch -> match, pure (no RocksDB, no Kafka, no clock);
- :mod:`stream_dedup.index`: the persistent state (the contract, RocksDB and in-memory);
- :mod:`stream_dedup.dedup`: where the core meets the index: a batch in, verdicts and one
  commit out; :mod:`stream_dedup.offline` and :mod:`stream_dedup.service` feed it;
- :mod:`stream_dedup.api` (:class:`Detector`), :mod:`stream_dedup.cli` and
  :mod:`stream_dedup.tools` on top.

The names below are loaded on first use, so that ``import stream_dedup.core`` loads
neither RocksDB nor the Kafka client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stream_dedup.api import Detector, DetectorStats, QueryResult
    from stream_dedup.core.config import DedupConfig
    from stream_dedup.decode import DocumentFormat
    from stream_dedup.dedup import BatchResult, Deduplicator
    from stream_dedup.index import DedupIndex, open_index
    from stream_dedup.models import Document, Verdict, VerdictKind

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "BatchResult": "stream_dedup.dedup",
    "DedupConfig": "stream_dedup.core.config",
    "DedupIndex": "stream_dedup.index",
    "Deduplicator": "stream_dedup.dedup",
    "Detector": "stream_dedup.api",
    "DetectorStats": "stream_dedup.api",
    "Document": "stream_dedup.models",
    "DocumentFormat": "stream_dedup.decode",
    "QueryResult": "stream_dedup.api",
    "Verdict": "stream_dedup.models",
    "VerdictKind": "stream_dedup.models",
    "open_index": "stream_dedup.index",
}

__all__ = [
    "BatchResult",
    "DedupConfig",
    "DedupIndex",
    "Deduplicator",
    "Detector",
    "DetectorStats",
    "Document",
    "DocumentFormat",
    "QueryResult",
    "Verdict",
    "VerdictKind",
    "__version__",
    "open_index",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stream_dedup' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
