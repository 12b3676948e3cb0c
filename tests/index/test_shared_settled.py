"""A batch decided before a shared index's lease: the write built there and given its
docnums in the lease (``dedup/settled.py``) is, byte for byte, the write deciding the
batch inside the lease builds: the same redo record, change log entry and counters."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.core.match import Matches
from stream_dedup.core.sketch import sketch
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.predecide import Predecided, _runs, _written
from stream_dedup.index.batch_records import BatchRecords, doc_records, exact_values
from stream_dedup.index.bucket_records import bucket_puts, moved_bucket_puts
from stream_dedup.models import Document

from .shared_instances import decide_and_store
from .test_dedup import article, edit
from .test_shared_predecide import stories


def both_ways(dedup: Deduplicator, docs: list[Document], pre: Predecided) -> int:
    """Inside one lease: the batch settled from ``pre`` and decided anew; their writes
    compared byte for byte, then the settled one stored. Answers the number of documents
    the settling decided again."""
    before = dedup.predecided.redecided_docs
    with dedup.index.exclusive():
        settled = dedup.settle(pre)
        assert settled is not None and settled.records is not None
        decided = dedup.decide(docs)
        assert settled.verdicts == decided.verdicts
        assert settled.counter_deltas == decided.counter_deltas
        ours, theirs = dedup.prepare(settled), dedup.prepare(decided)
        assert ours.write.redo == theirs.write.redo
        assert ours.write.entry == theirs.write.entry
        assert np.array_equal(ours.fingerprints, theirs.fingerprints)
        dedup.index.apply(ours)
    dedup.after_lease()
    return dedup.predecided.redecided_docs - before


def test_a_batch_kept_with_its_docnums_moved_writes_the_same_bytes(
    shared: Callable[[], Deduplicator],
) -> None:
    """Another instance indexed unrelated documents meanwhile: only the docnums move (the
    documents' keys, the exact texts' values, the buckets' members, a bucket of an older
    document included), with an empty document in the batch."""
    first, second = shared(), shared()
    decide_and_store(first, stories(0, 20))
    pending = [
        *stories(100, 30),
        Document("c100", edit(article(100), 3, 1)),  # joins o100's buckets
        Document("c3", edit(article(3), 2, 4)),  # joins a stored document's buckets
        Document("empty", "   "),
        Document("x104", article(104)),  # an exact repeat within the batch
    ]
    pre = first.predecide(pending)
    assert pre is not None
    decide_and_store(second, stories(200, 25))
    assert both_ways(first, pending, pre) == 0
    assert first.predecided.moved == 1


def test_a_batch_decided_again_in_part_writes_the_same_bytes(
    shared: Callable[[], Deduplicator],
) -> None:
    """Another instance stored a near-duplicate of a pending document and an exact repeat
    of another: their parts are decided again (records, verdicts, exact texts and the
    buckets of their documents built anew), the rest moved."""
    first, second = shared(), shared()
    decide_and_store(first, stories(0, 10))
    pending = [*stories(100, 40), Document("p107", edit(article(107), 2, 9))]
    pre = first.predecide(pending)
    assert pre is not None
    other = [
        Document("near", edit(article(107), 3, 7)),
        Document("same", article(121)),
        *stories(300, 10),
    ]
    decide_and_store(second, other)
    assert both_ways(first, pending, pre) == 3
    assert first.predecided.partly == 1


def test_a_batch_nobody_wrote_near_keeps_its_write(shared: Callable[[], Deduplicator]) -> None:
    """Nothing written between the pre-decide and the lease: the write built before it is
    the write, docnums unchanged."""
    first = shared()
    decide_and_store(first, stories(0, 10))
    pending = [*stories(0, 3, "again"), *stories(50, 20)]
    pre = first.predecide(pending)
    assert pre is not None
    assert both_ways(first, pending, pre) == 0
    assert first.predecided.kept == 1


@pytest.mark.parametrize("by", [0, 7, 1 << 20])
def test_moved_buckets_are_the_buckets_of_the_moved_batch(by: int) -> None:
    """:func:`moved_bucket_puts` of a batch's bucket puts against :func:`bucket_puts` of
    the batch numbered ``by`` further: the same keys, members and values; a bucket that
    held a document the batch read (docnum 5) keeps it."""
    config = DedupConfig()
    plan = config.band_plan()
    texts = [article(i) for i in range(12)]
    sk = sketch(texts, config, plan)
    bands, n, first = plan.bands, len(sk.live), 40
    slot = np.arange(n * bands, dtype=np.intp)
    ordered, _ = bucket_puts(
        sk.bucket_keys, sk.bucket_order, slot, _indexed(first, n, bands), bands
    )
    moved = _indexed(first + by, n, bands)
    want, _ = bucket_puts(sk.bucket_keys, sk.bucket_order, slot, moved, bands)
    got = moved_bucket_puts(ordered, first, by)
    assert got.arrays is not None and want.arrays is not None
    assert got.arrays.keys == want.arrays.keys
    assert np.array_equal(got.arrays.members, want.arrays.members)
    assert list(got.values) == list(want.values)
    assert int(got.arrays.counts.max()) == 2 and 5 in got.arrays.members.tolist()


def _indexed(first: int, n: int, bands: int) -> Matches:
    """A matching pass that indexed every document from docnum ``first``, the first
    band bucket of document 0 holding docnum 5 before it."""
    zeros = np.zeros(n, dtype=np.int64)
    content_at = np.zeros(n * bands, dtype=np.int64)
    content_len = np.zeros(n * bands, dtype=np.int64)
    content_len[0] = 2
    return Matches(
        match=np.full(n, -1, dtype=np.int64),
        similarity=np.zeros(n),
        candidates=zeros,
        verifications=zeros,
        docnum=np.arange(first, first + n, dtype=np.int64),
        new_text=np.ones(n, dtype=bool),
        exact_hits=0,
        truncated=0,
        evictions=0,
        contents=np.array([5, first], dtype=np.int64),
        content_at=content_at,
        content_len=content_len,
        points_doc=np.empty(0, dtype=np.int64),
        points_clock=np.empty(0, dtype=np.int64),
    )


def test_batch_records_puts_are_the_staged_order() -> None:
    """:meth:`BatchRecords.puts`: verdicts, documents, exact texts, empty verdicts."""
    keys, values = doc_records([3, 4], ["a", "b"], ["a", "a"], [b"p", b"q"], False)
    records = BatchRecords(
        [b"va", b"vb"],
        [b"1", b"2"],
        np.array([3, 4]),
        values,
        [b"x" + bytes(16)],
        np.array([3]),
        [b"ve"],
        [b"3"],
        np.empty(0, dtype=np.uint64),
    )
    puts = records.puts()
    assert list(puts) == [b"va", b"vb", *keys, b"x" + bytes(16), b"ve"]
    assert puts[keys[1]] == values[1] and puts[b"x" + bytes(16)] == exact_values([3])[0]


def test_written_fingerprints_are_found_by_their_runs() -> None:
    """:func:`~stream_dedup.dedup.predecide._written` marks exactly the batch's look-up
    fingerprints the log holds, those in the first and last runs and in crowded runs
    included."""
    rng = np.random.default_rng(7)
    edges = np.array(
        [0, 1, 2**64 - 1, 2**64 - 2, 5 << 48, (5 << 48) + 1, (5 << 48) + 9], dtype=np.uint64
    )
    lookups = np.unique(np.concatenate([rng.integers(0, 2**63, 3000).astype(np.uint64) * 2, edges]))
    keys = np.concatenate(
        [
            rng.choice(lookups, 300),
            edges,
            rng.integers(0, 2**63, 500).astype(np.uint64),
        ]
    )
    got = _written(lookups, _runs(lookups), keys)
    assert np.array_equal(got, np.isin(lookups, keys))
    assert got[[0, 1, -1, -2]].all() and not _written(lookups, _runs(lookups), keys[:0]).any()
