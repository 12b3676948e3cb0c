"""The core composed over an index: a batch of documents in, verdicts out, one commit.

``decide(docs)`` reads the committed index (batched reads, through the index's key filter,
for replayed ids, exact-text digests and band buckets; one for candidate records) and
decides the documents in order against everything before them *including earlier
documents of the same batch*: the compiled matching pass
(:mod:`stream_dedup.core.match`) keeps the batch's own bucket appends and exact texts
beside what the index holds, so later documents of the batch see them. Nothing is
written until ``commit(result, offsets)``, which hands all of the batch's records,
counters and the input offsets to one atomic index write. Deciding the same batch again
over the same committed index gives identical verdicts, which is what makes a replay
after a crash emit identical events.

Per document: a replayed id (the same normalised text again) returns its stored verdict;
an id with another text is a new revision, decided like any document (under
``revisions = "replay"`` it gets the id's latest verdict, counted in
``BatchStats.mismatched_repeats``; see :mod:`.revisions`);
empty normalised content is ``unique`` with ``empty=True`` and never indexed; identical
normalised text (exact digest) is a duplicate with similarity 1.0 of the first document
with that text; otherwise the band buckets give candidates, ranked by shared bands, the
first ``max_candidates`` are verified, and the best verified match at or above the
threshold decides. With containment on, a document still without a match that has most
of its shingles in one earlier document is that document's excerpt (:mod:`.excerpts`).

The index is asked typed questions and handed typed writes: no module here reads or
writes the index's key and record encodings. Modules: :mod:`.deduplicator` (the steps of
a batch), :mod:`.reads` (what a batch reads), :mod:`.writes` (verdicts and the batch's
index writes), :mod:`.revisions` (which repeats of an id replay and which are new
revisions), :mod:`.batch` (what a batch gives), :mod:`.excerpts` (containment),
:mod:`.predecide` and :mod:`.redecide` (a shared index's batch decided before its lease,
settled inside it), :mod:`.queries` (texts asked about, decided against the index
alone), :mod:`.check` (the indexed documents most similar to texts, scored, nothing
written), :mod:`.kernels` (whether the compiled kernels are cached, asked only before a
batch that runs them).
"""

from stream_dedup.dedup.batch import BatchResult, BatchStats
from stream_dedup.dedup.deduplicator import Deduplicator
from stream_dedup.dedup.kernels import COMPILING_NOTICE, compiling_notice, kernels_cached

__all__ = [
    "COMPILING_NOTICE",
    "BatchResult",
    "BatchStats",
    "Deduplicator",
    "compiling_notice",
    "kernels_cached",
]
