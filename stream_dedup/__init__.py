"""stream-dedup: online near-duplicate detection for document streams.

The package's folders are its layers, each using only those below it:

- :mod:`stream_dedup.core`: text -> sketch -> match, pure (no RocksDB, no Kafka, no clock);
- :mod:`stream_dedup.index`: the persistent state (the contract and its backends: in
  memory, RocksDB, and Redis for an index shared by several instances);
- :mod:`stream_dedup.dedup`: where the core meets the index: a batch in, verdicts and one
  commit out; :mod:`stream_dedup.offline` and :mod:`stream_dedup.service` feed it;
- :mod:`stream_dedup.api` (:class:`Detector`), :mod:`stream_dedup.cli` and
  :mod:`stream_dedup.tools` on top.

The public names are those in ``__all__``: the :class:`Detector` API
(``docs/python-api.md``), its parameters, documents and verdicts, and the exception tree
of :mod:`stream_dedup.errors` (root :class:`StreamDedupError`). They are loaded on first
use, so that ``import stream_dedup.core`` loads neither RocksDB nor the Kafka client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stream_dedup.api import Detector, DetectorStats, QueryResult
    from stream_dedup.core.config import DedupConfig
    from stream_dedup.decode import DocumentFormat
    from stream_dedup.errors import (
        ConfigError,
        DecodeError,
        IndexCorruptError,
        IndexIOError,
        IndexLeaseLostError,
        IndexLockedError,
        IndexLostError,
        IndexMismatchError,
        IndexOffsetsGoneError,
        IndexStoreError,
        IndexUnreachableError,
        InputError,
        RecordRefusedError,
        RetentionWarning,
        StreamDedupError,
        TransactionError,
    )
    from stream_dedup.models import CheckMatch, Document, Relation, Verdict, VerdictKind

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "CheckMatch": "stream_dedup.models",
    "DedupConfig": "stream_dedup.core.config",
    "Detector": "stream_dedup.api",
    "DetectorStats": "stream_dedup.api",
    "Document": "stream_dedup.models",
    "DocumentFormat": "stream_dedup.decode",
    "QueryResult": "stream_dedup.api",
    "Relation": "stream_dedup.models",
    "Verdict": "stream_dedup.models",
    "VerdictKind": "stream_dedup.models",
    "ConfigError": "stream_dedup.errors",
    "DecodeError": "stream_dedup.errors",
    "IndexCorruptError": "stream_dedup.errors",
    "IndexIOError": "stream_dedup.errors",
    "IndexLeaseLostError": "stream_dedup.errors",
    "IndexLockedError": "stream_dedup.errors",
    "IndexLostError": "stream_dedup.errors",
    "IndexMismatchError": "stream_dedup.errors",
    "IndexOffsetsGoneError": "stream_dedup.errors",
    "IndexStoreError": "stream_dedup.errors",
    "IndexUnreachableError": "stream_dedup.errors",
    "InputError": "stream_dedup.errors",
    "RetentionWarning": "stream_dedup.errors",
    "StreamDedupError": "stream_dedup.errors",
    "RecordRefusedError": "stream_dedup.errors",
    "TransactionError": "stream_dedup.errors",
}

__all__ = [
    "CheckMatch",
    "ConfigError",
    "DecodeError",
    "DedupConfig",
    "Detector",
    "DetectorStats",
    "Document",
    "DocumentFormat",
    "IndexCorruptError",
    "IndexIOError",
    "IndexLeaseLostError",
    "IndexLockedError",
    "IndexLostError",
    "IndexMismatchError",
    "IndexOffsetsGoneError",
    "IndexStoreError",
    "IndexUnreachableError",
    "InputError",
    "QueryResult",
    "RecordRefusedError",
    "Relation",
    "RetentionWarning",
    "StreamDedupError",
    "TransactionError",
    "Verdict",
    "VerdictKind",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stream_dedup' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
