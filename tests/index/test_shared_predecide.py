"""Deciding a shared index's batch before the lease: the verdicts are those of deciding
it inside, whatever the other instances wrote in between.

Each test compares with an index one instance owns (RocksDB) deciding the same batches
in the order the instances took the lease.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import BatchResult, Deduplicator
from stream_dedup.dedup.predecide import Predecided
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.rocks import RocksBackend
from stream_dedup.models import Document

from .shared_instances import decide_and_store
from .test_dedup import article, edit

Verdicts = list[tuple[str, str, str | None, str]]


def settled(dedup: Deduplicator, docs: list[Document], pre: Predecided | None) -> BatchResult:
    """What the shared strategy does with a batch decided before the lease: settle it
    inside (or decide it again there), store it, then run what it left for later."""
    with dedup.index.exclusive():
        result = None if pre is None else dedup.settle(pre)
        if result is None:
            result = dedup.decide(docs)
        dedup.index.apply(dedup.prepare(result))
    dedup.after_lease()
    return result


def verdicts(result: BatchResult) -> Verdicts:
    return [(v.id, v.verdict.value, v.duplicate_of, v.cluster_id) for v in result.verdicts]


def owned(path: Path) -> Deduplicator:
    config = DedupConfig()
    return Deduplicator(DedupIndex(RocksBackend(path), IndexParams.of(config)), config)


def reference(path: Path, batches: list[list[Document]]) -> list[Verdicts]:
    """The verdicts of ``batches`` decided in this order by one instance on RocksDB."""
    dedup = owned(path)
    try:
        return [verdicts(dedup.process(batch)) for batch in batches]
    finally:
        dedup.index.close()


def stories(first: int, n: int, prefix: str = "o") -> list[Document]:
    return [Document(f"{prefix}{i}", article(i)) for i in range(first, first + n)]


def test_a_batch_no_other_write_touched_keeps_its_verdicts_with_its_docnums_moved(
    shared: Callable[[], Deduplicator], tmp_path: Path
) -> None:
    """Another instance indexes unrelated documents between the pre-decide and the lease:
    the batch is not decided again, its docnums move past the other's, and a later batch
    finds its documents by those docnums (their records and buckets were written moved)."""
    first, second = shared(), shared()
    start = stories(0, 20)
    pending = [*stories(100, 30), Document("c100", edit(article(100), 3, 1))]
    other = stories(200, 25)
    later = [Document(f"late{i}", edit(article(i), 4, i)) for i in (0, 5, 100, 110, 129, 210)]
    decide_and_store(first, start)
    pre = first.predecide(pending)
    assert pre is not None
    decide_and_store(second, other)  # 25 documents indexed past the pre-decided version
    got = [verdicts(settled(first, pending, pre))]
    assert (first.predecided.moved, first.predecided.redecided) == (1, 0)
    got.append(verdicts(settled(second, later, second.predecide(later))))
    want = reference(tmp_path / "rocks", [start, other, pending, later])
    assert got == want[2:]
    assert dict((v[0], v[2]) for v in got[1]) == {
        "late0": "o0", "late5": "o5", "late100": "o100", "late110": "o110",
        "late129": "o129", "late210": "o210",
    }  # fmt: skip
    with first.index.exclusive():
        assert first.index.counter("indexed") == 20 + 25 + 31 + 6
        # The pending batch's documents hold the docnums after the other instance's.
        records = first.index.read_records(list(range(45, 76)))
    assert [r.doc_id for r in records.values()] == [d.id for d in pending]


def test_a_batch_another_instance_wrote_near_is_decided_again_inside_the_lease(
    shared: Callable[[], Deduplicator], tmp_path: Path
) -> None:
    """Between the pre-decide and the lease another instance stores a near-duplicate of
    a pending document, an exact repeat of another and one of its ids: those documents
    are touched, the batch is decided again, and its verdicts follow the other's write."""
    first, second = shared(), shared()
    start = stories(0, 10)
    pending = stories(100, 40)
    other = [
        Document("near", edit(article(107), 3, 7)),  # now the original of o107
        Document("same", article(121)),  # o121 is now its exact repeat
        Document("o133", article(133)),  # o133 is now a replay
        *stories(300, 10),
    ]
    decide_and_store(first, start)
    pre = first.predecide(pending)
    assert pre is not None
    assert {v.id: v.duplicate_of for v in pre.result.verdicts}["o107"] is None
    decide_and_store(second, other)
    got = verdicts(settled(first, pending, pre))
    counts = first.predecided
    assert (counts.redecided, counts.redecided_docs, counts.touched_docs) == (1, 40, 3)
    want = reference(tmp_path / "rocks", [start, other, pending])
    assert got == want[2]
    of = {v[0]: v[2] for v in got}
    assert (of["o107"], of["o121"]) == ("near", "same")


def test_two_instances_racing_decide_as_one_instance_in_their_lease_order(
    shared: Callable[[], Deduplicator], tmp_path: Path
) -> None:
    """Two instances take turns at random on one stream of stories and their copies (a
    copy often lands in the batch after its original's, at the other instance), each
    batch decided before the lease: every batch's verdicts equal those of one instance
    on RocksDB deciding the batches in the order the lease took them."""
    rng = random.Random(30)
    docs: list[Document] = []
    for i in range(240):
        docs.append(Document(f"s{i}", article(1000 + i)))
        if rng.random() < 0.3:  # a copy a few documents later: often in the next batch
            source = rng.randrange(max(0, i - 12), i + 1)
            text = article(1000 + source)
            copy = text if rng.random() < 0.3 else edit(text, 3, i)
            docs.append(Document(f"c{i}", copy))
    batches = [docs[i : i + 12] for i in range(0, len(docs), 12)]
    instances = [shared(), shared()]
    lock = threading.Lock()
    taken: list[tuple[int, Verdicts]] = []
    turn = iter(range(len(batches)))

    def run(dedup: Deduplicator) -> None:
        while True:
            with lock:
                b = next(turn, None)
            if b is None:
                return
            pre = dedup.predecide(batches[b])
            with dedup.index.exclusive():
                result = dedup.settle(pre) if pre is not None else None
                if result is None:
                    result = dedup.decide(batches[b])
                dedup.index.apply(dedup.prepare(result))
                taken.append((b, verdicts(result)))  # in lease order: appended inside it
            dedup.after_lease()

    threads = [threading.Thread(target=run, args=(d,)) for d in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(b for b, _ in taken) == list(range(len(batches)))
    want = reference(tmp_path / "rocks", [batches[b] for b, _ in taken])
    assert [v for _, v in taken] == want
    counts = [d.predecided for d in instances]
    assert sum(c.batches for c in counts) == len(batches)
    assert sum(c.kept + c.moved + c.redecided for c in counts) == len(batches)
