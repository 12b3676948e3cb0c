"""stream-dedup: online near-duplicate detection for document streams.

The data flow, one module per step: message/line -> :mod:`.decode` (Document) ->
:mod:`.normalize` -> :mod:`.shingles` -> :mod:`.signature` -> :mod:`.bands` (band keys) ->
:mod:`.verdict` (verify, decide) -> :mod:`.dedup` (compose over :mod:`.index`) -> commit.
"""

from stream_dedup.config import DedupConfig, DocumentFormat
from stream_dedup.dedup import BatchResult, Deduplicator
from stream_dedup.index import DedupIndex, open_index
from stream_dedup.models import Document, Verdict, VerdictKind

__version__ = "0.1.0"

__all__ = [
    "BatchResult",
    "DedupConfig",
    "DedupIndex",
    "Deduplicator",
    "Document",
    "DocumentFormat",
    "Verdict",
    "VerdictKind",
    "__version__",
    "open_index",
]
