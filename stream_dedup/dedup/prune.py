"""Which held records' verification sets a batch can need: those whose text is long enough.

A record storing compressed text (:mod:`stream_dedup.core.payload`) has its verification
set rebuilt when it is a candidate (~20 µs). On an index that keeps every document, a
document's candidates grow with the index (~6 per document at a million documents), most
of them strangers sharing one band, and their rebuilds become most of the deciding
thread's work (docs/benchmarks.md). Many can be ruled out without rebuilding: Jaccard is
``|A ∩ B| / |A ∪ B| <= |B| / |A|``, and ``|B|``, the number of distinct shingles of a
stored text, is at most its number of shingles, which the zstd frame's header gives
(:func:`~stream_dedup.core.payload.set_size_bounds`). So a record whose bound, divided by
the size of the smallest set among the batch's documents that share a bucket with it,
is below the threshold cannot verify against any of them.

The rule is exact, never a heuristic: rounding is monotonic, so the matching pass's
``fl(I / U)`` is at most ``fl(bound / |A|)``, and a record left out has a similarity below
the threshold with every document it could be compared with. Its set is handed to the
matching pass empty, which the pass rules out as it rules out any pair whose sizes cannot
reach the threshold; it still counts as a candidate, so the ranking and truncation of
candidate lists are unchanged, and so are the verdicts (``tests/dedup/test_prune.py``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload import set_size_bounds
from stream_dedup.core.shingles import I64
from stream_dedup.dedup.reads import Held
from stream_dedup.index.bucket_records import Members

#: Stands for "no document of the batch can be compared with this record".
_NONE = np.iinfo(np.int64).max


def needed_records(
    held: Held, set_len: I64, fresh: npt.NDArray[np.bool_], bands: int, config: DedupConfig
) -> npt.NDArray[np.bool_] | None:
    """Per record of ``held.records`` (docnums ascending): whether its verification set
    can reach the threshold with a document of the batch (``set_len``: each live
    document's set size; ``fresh``: those decided now). ``None``: every one is needed
    (signature verification, a threshold of 0, or no record stores text)."""
    records = held.records
    if config.verify != "exact" or config.threshold <= 0.0 or not records:
        return None
    texts = [r.payload for r in records.values() if r.text]
    if not texts:
        return None
    docnums = np.fromiter(records, dtype=np.int64, count=len(records))
    is_text = np.fromiter((r.text for r in records.values()), dtype=bool, count=len(records))
    # A document with an empty set verifies nothing; one not decided now verifies nothing.
    query = np.where(fresh & (set_len > 0), set_len, _NONE)
    smallest = np.full(docnums.size, _NONE, dtype=np.int64)
    position_doc = np.arange(held.slot.size, dtype=np.int64) // bands
    for members in (held.committed, held.older):
        if members is not None:
            _fold_smallest(smallest, docnums, members, held.slot, query[position_doc])
    bound = np.full(docnums.size, _NONE, dtype=np.int64)
    bound[is_text] = set_size_bounds(texts, config.shingle)
    # A text record no fresh document meets has a quotient near 0: not needed.
    ratio = bound.astype(np.float64) / smallest.astype(np.float64)
    return ~is_text | (ratio >= config.threshold)


def _fold_smallest(
    smallest: I64, docnums: I64, members: Members, slot: npt.NDArray[np.intp], query: I64
) -> None:
    """Lower ``smallest[r]`` to the size of every query set in a bucket with record ``r``
    (``members``: per bucket key, read at each position's ``slot``; ``query``: the query
    set size at each bucket position)."""
    m_at, m_len, m_docnums = members
    lengths = m_len[slot]
    total = int(lengths.sum())
    if not total:
        return
    starts = m_at[slot]
    # Member i of position b sits at starts[b] + i: one ragged range per position.
    offsets = np.cumsum(lengths) - lengths
    flat = np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)
    found = m_docnums[flat].astype(np.int64)
    where = np.searchsorted(docnums, found).clip(max=docnums.size - 1)
    held = docnums[where] == found
    np.minimum.at(smallest, where[held], np.repeat(query, lengths)[held])
