"""A batch whose ids are all new is built list by list (:mod:`stream_dedup.dedup.batch_writes`):
its verdicts, records and counters are those of the document-at-a-time path, byte for byte."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import BatchResult, Deduplicator, writes
from stream_dedup.dedup.batch import BatchStats
from stream_dedup.index import DedupIndex
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.models import Document, VerdictKind

from .test_dedup import article, edit

#: Ids a record must escape or encode: quotes, a backslash, a control character, non-ASCII.
ODD_IDS = ['q"uote', "back\\slash", "tab\there", "naïve-ü", "emoji-\U0001f600", "plain"]


def _stream() -> list[list[Document]]:
    """Three batches: uniques, near-duplicates of earlier batches and of documents earlier
    in the same batch (a chain), exact copies within a batch, and empty content."""
    base = [article(s) for s in range(6)]
    first = [Document(ODD_IDS[i], base[i]) for i in range(4)]
    first += [Document("copy-0", base[0]), Document("empty-1", ""), Document("n4", base[4])]
    second = [
        Document("near-0", edit(base[0], 3, 1)),
        Document("new-5", base[5]),
        Document("near-5", edit(base[5], 2, 2)),
        Document("near-near-5", edit(edit(base[5], 2, 2), 2, 3)),
        Document("  ", "   "),
        Document(ODD_IDS[4], edit(base[1], 4, 4)),
        Document("copy-5", base[5]),
    ]
    third = [Document(f"u{i}", article(100 + i)) for i in range(5)]
    third += [Document(ODD_IDS[5], edit(base[3], 1, 5)), Document("e", "")]
    return [first, second, third]


def _run(config: DedupConfig, one_at_a_time: bool, mp: pytest.MonkeyPatch) -> list[BatchResult]:
    """The stream decided; ``one_at_a_time``: through the document-at-a-time path."""
    calls: list[int] = []
    if one_at_a_time:

        def slow(docs: Sequence[Document], *rest: object, written: object = None) -> object:
            calls.append(len(docs))  # ``written``: verdicts built before, none here
            return writes.one_by_one(docs, *rest, BatchStats())  # type: ignore[call-arg, arg-type]

        mp.setattr(writes, "decided_once", slow)
    dedup = Deduplicator(DedupIndex(MemoryBackend(), IndexParams.of(config)), config)
    try:
        out = [dedup.process(batch) for batch in _stream()]
    finally:
        mp.undo()
    assert calls == ([7, 7, 7] if one_at_a_time else [])
    return out


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"verify": "signature"},
        {"index_policy": "all"},
        {"index_policy": "all", "verify": "signature"},
    ],
)
def test_the_batch_built_list_by_list_equals_one_at_a_time(
    overrides: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = DedupConfig(**overrides)  # type: ignore[arg-type]
    fast = _run(config, False, monkeypatch)
    slow = _run(config, True, monkeypatch)
    kinds = [[v.verdict for v in r.verdicts] for r in fast]
    # the stream does what it says: duplicates across and within batches, empties
    assert kinds[0].count(VerdictKind.DUPLICATE) == 1 and kinds[1].count(VerdictKind.DUPLICATE) >= 4
    assert sum(v.empty for r in fast for v in r.verdicts) == 3
    chained = {v.id: v for v in fast[1].verdicts}
    assert chained["near-near-5"].cluster_id == "new-5"  # through a match in its own batch
    for f, s in zip(fast, slow, strict=True):
        assert [v.to_json() for v in f.verdicts] == [v.to_json() for v in s.verdicts]
        assert f.puts == s.puts
        assert list(f.puts) != [] and f.counter_deltas == s.counter_deltas
        assert f.bucket_puts[:2] == s.bucket_puts[:2]


def test_a_containment_batch_built_list_by_list_equals_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With containment on, the batch is built list by list and its relations added to
    the verdicts they name: the verdicts and every staged byte are those of the
    document-at-a-time path given the same relations."""
    from stream_dedup.dedup import deduplicator
    from tests.excerpts import excerpt_stream

    stream = excerpt_stream(600)
    docs = [Document(r["id"], c) for r, c in zip(stream.records, stream.contents, strict=True)]
    config = DedupConfig(containment=0.8)

    def run() -> list[BatchResult]:
        dedup = Deduplicator(DedupIndex(MemoryBackend(), IndexParams.of(config)), config)
        return [dedup.process(docs[at : at + 200]) for at in range(0, len(docs), 200)]

    fast = run()
    calls: list[int] = []

    def slow(docs: Sequence[Document], *rest: object, built: object = None) -> object:
        calls.append(len(docs))
        *head, stats, relations = rest
        return writes.one_by_one(docs, *head, stats, relations)  # type: ignore[arg-type]

    monkeypatch.setattr(deduplicator, "verdicts_and_writes", slow)
    slow_results = run()
    assert calls == [200, 200, 200]
    verdicts = [v for r in fast for v in r.verdicts]
    assert sum(v.relation == "excerpt" for v in verdicts) >= 20  # the relations are there
    assert sum(v.relation == "near-duplicate" for v in verdicts) >= 20
    assert sum(v.contains is not None for v in verdicts) >= 1
    for f, s in zip(fast, slow_results, strict=True):
        assert [v.to_json() for v in f.verdicts] == [v.to_json() for v in s.verdicts]
        assert f.puts == s.puts
        assert f.counter_deltas == s.counter_deltas
        assert f.bucket_puts[:2] == s.bucket_puts[:2]
