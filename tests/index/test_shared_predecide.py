"""Deciding a shared index's batch before the lease: the verdicts are those of deciding
it inside, whatever the other instances wrote in between.

Each test compares with an index one instance owns (RocksDB) deciding the same batches
in the order the instances took the lease.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import BatchResult, Deduplicator
from stream_dedup.dedup.predecide import Predecided
from stream_dedup.index import DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.redis_backend import RedisBackend
from stream_dedup.index.rocks import RocksBackend
from stream_dedup.models import Document

from .shared_instances import decide_and_store, shared_instances
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
    return reference_with_buckets(path, batches, [])[0]


def reference_with_buckets(
    path: Path, batches: list[list[Document]], docs: list[Document]
) -> tuple[list[Verdicts], list[bytes | None]]:
    """:func:`reference`, and then the contents of the band buckets of ``docs``."""
    dedup = owned(path)
    try:
        got = [verdicts(dedup.process(batch)) for batch in batches]
        return got, buckets(dedup, docs)
    finally:
        dedup.index.close()


def buckets(dedup: Deduplicator, docs: list[Document]) -> list[bytes | None]:
    """The stored contents of every band bucket of ``docs``."""
    return dedup.index.read_buckets(dedup.sketch(docs).bucket_keys)


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
    want, stored = reference_with_buckets(
        tmp_path / "rocks", [start, other, pending, later], pending
    )
    assert got == want[2:]
    with first.index.exclusive():
        assert buckets(first, pending) == stored
    assert dict((v[0], v[2]) for v in got[1]) == {
        "late0": "o0", "late5": "o5", "late100": "o100", "late110": "o110",
        "late129": "o129", "late210": "o210",
    }  # fmt: skip
    with first.index.exclusive():
        assert first.index.counter("indexed") == 20 + 25 + 31 + 6
        # The pending batch's documents hold the docnums after the other instance's.
        records = first.index.read_records(list(range(45, 76)))
    assert [r.doc_id for r in records.values()] == [d.id for d in pending]


def test_the_parts_another_instance_wrote_near_are_decided_again_inside_the_lease(
    shared: Callable[[], Deduplicator], tmp_path: Path
) -> None:
    """Between the pre-decide and the lease another instance stores a near-duplicate of a
    pending document and an exact repeat of another: those documents are touched, and
    they and the later documents of the batch linked to them (a copy of one) are decided
    again, the rest kept; the verdicts follow the other's write."""
    first, second = shared(), shared()
    start = stories(0, 10)
    pending = [*stories(100, 40), Document("p107", edit(article(107), 2, 9))]
    other = [
        Document("near", edit(article(107), 3, 7)),  # now the original of o107 and p107
        Document("same", article(121)),  # o121 is now its exact repeat
        *stories(300, 10),
    ]
    decide_and_store(first, start)
    pre = first.predecide(pending)
    assert pre is not None
    before = {v.id: (v.duplicate_of, v.cluster_id) for v in first.result_of(pre.parts).verdicts}
    assert (before["o107"], before["p107"]) == ((None, "o107"), ("o107", "o107"))
    decide_and_store(second, other)
    got = verdicts(settled(first, pending, pre))
    counts = first.predecided
    assert (counts.partly, counts.redecided, counts.touched_docs) == (1, 0, 3)
    assert counts.redecided_docs == 3  # o107 and p107 (one part), o121
    want, stored = reference_with_buckets(tmp_path / "rocks", [start, other, pending], pending)
    assert got == want[2]
    with first.index.exclusive():  # the buckets written: the other's members kept too
        assert buckets(first, pending) == stored
    after = {v[0]: (v[2], v[3]) for v in got}
    assert after["o107"] == ("near", "near")
    assert after["p107"][1] == "near"
    assert after["o121"] == ("same", "same")


def test_a_replay_written_meanwhile_makes_the_whole_batch_decided_again(
    shared: Callable[[], Deduplicator], tmp_path: Path
) -> None:
    """Another instance stores one of the pending ids: that document is now a replay, a
    repeat the parts cannot take, and the batch is decided again whole."""
    first, second = shared(), shared()
    pending = stories(100, 20)
    other = [Document("o104", article(104)), *stories(300, 5)]
    pre = first.predecide(pending)
    assert pre is not None
    decide_and_store(second, other)
    got = verdicts(settled(first, pending, pre))
    counts = first.predecided
    assert (counts.partly, counts.redecided, counts.redecided_docs) == (0, 1, 20)
    assert got == reference(tmp_path / "rocks", [other, pending])[1]


def test_two_instances_racing_decide_as_one_instance_in_their_lease_order(
    shared: Callable[[], Deduplicator], tmp_path: Path
) -> None:
    """Two instances each decide a batch before the lease, then take the lease in an
    order drawn at random, on one stream of stories and their copies (a copy often lands
    in the batch after its original's, at the other instance): every batch's verdicts
    equal those of one instance on RocksDB deciding the batches in the lease's order.

    Both decide before either stores, as two instances racing for the lease do: the one
    that comes second settles against what the first stored meanwhile. (Left to threads,
    one instance could take several turns in a row and the parts decided again, which
    this test is about, not come up at all.)"""
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
    taken: list[tuple[int, Verdicts]] = []
    for first in range(0, len(batches), 2):
        turns = list(zip(instances, range(first, min(first + 2, len(batches))), strict=False))
        pres = [(dedup, b, dedup.predecide(batches[b])) for dedup, b in turns]
        rng.shuffle(pres)  # the lease's order
        for dedup, b, pre in pres:
            with dedup.index.exclusive():
                result = dedup.settle(pre) if pre is not None else None
                if result is None:
                    result = dedup.decide(batches[b])
                taken.append((b, verdicts(result)))
                dedup.index.apply(dedup.prepare(result))
            dedup.after_lease()
    assert sorted(b for b, _ in taken) == list(range(len(batches)))
    want = reference(tmp_path / "rocks", [batches[b] for b, _ in taken])
    assert [v for _, v in taken] == want
    counts = [d.predecided for d in instances]
    assert sum(c.batches for c in counts) == len(batches)
    assert sum(c.kept + c.moved + c.partly + c.redecided for c in counts) == len(batches)
    assert sum(c.partly for c in counts) > 0  # copies across batches: parts decided again


def copies_stream(seed: int, n: int, share: float) -> list[Document]:
    """Stories, and copies (exact or edited) of a recent one after ``share`` of them."""
    rng = random.Random(seed)
    docs: list[Document] = []
    for i in range(n):
        docs.append(Document(f"s{i}", article(1000 + i)))
        if rng.random() < share:
            source = rng.randrange(max(0, i - 12), i + 1)
            text = article(1000 + source)
            docs.append(Document(f"c{i}", text if rng.random() < 0.3 else edit(text, 3, i)))
    return docs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_batches_decided_a_turn_ahead_settle_to_the_order_of_the_turns(
    shared: Callable[[], Deduplicator], tmp_path: Path, seed: int
) -> None:
    """The group's order with ``decide_ahead``: two instances take strict turns, and
    each decides its next batch while the other stores its turn, so every batch is
    settled after exactly one write it did not see (most of its documents' docnums
    moved, the copies of the other's stories touched): the verdicts are those of one
    instance deciding the batches in turn order."""
    docs = copies_stream(seed, 200, 0.4)
    batches = [docs[i : i + 10] for i in range(0, len(docs), 10)]
    instances = [shared(), shared()]
    pres = [instances[0].predecide(batches[0]), instances[1].predecide(batches[1])]
    got = []
    for b, batch in enumerate(batches):
        dedup = instances[b % 2]
        got.append(verdicts(settled(dedup, batch, pres[b % 2])))
        if b + 2 < len(batches):  # its next turn, decided while the other stores
            pres[b % 2] = dedup.predecide(batches[b + 2])
    assert got == reference(tmp_path / "rocks", batches)
    counts = [d.predecided for d in instances]
    assert sum(c.moved + c.partly for c in counts) >= len(batches) - 2
    assert sum(c.partly for c in counts) > 0


class Interleaved(RedisBackend):
    """Runs ``meanwhile`` once, inside the next :meth:`as_of`: as it starts (``at =
    "version"``, before the counters are read) or at its first read after the counters
    (``at = "reads"``), as another instance's write applied while this one decides."""

    meanwhile: Callable[[], object] | None = None
    at = "version"
    _reads = 0

    @contextlib.contextmanager
    def as_of(self) -> Iterator[int]:
        with super().as_of() as version:
            self._reads = 1 if self.at == "reads" else 0
            if self.at == "version":
                self._run()
            yield version
        self._reads = 0

    def get_many(self, keys: Sequence[bytes], epoch: int = 0) -> list[bytes | None]:
        if self._reads:  # the first read is the counters'; then the batch's reads
            self._reads += 1
            if self._reads == 3:
                self._run()
        return super().get_many(keys, epoch)

    def _run(self) -> None:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()


@pytest.mark.parametrize("at", ["version", "reads"])
def test_a_write_applied_while_the_batch_is_decided_before_the_lease(
    shared_redis_url: str, tmp_path: Path, at: str
) -> None:
    """Another instance's write lands after the version the batch is decided as of,
    while it is being decided: before the counters are read (its documents look
    committed) or after (its documents are numbered past the counters: left out). Its
    near-duplicates of pending documents are read in part; the batch settles to the
    verdicts of deciding it inside the lease."""
    with shared_instances(shared_redis_url, Interleaved) as make:
        first, second = make(), make()
        start = stories(0, 10)
        # q3 and n3 share buckets that o3 holds already: q3 reads n3 in them. p100's
        # match is the batch's first document, numbered as n3 is (both past the
        # counters read at "reads"): n3's record must not be taken for it.
        pending = [
            *stories(100, 30),
            Document("p105", edit(article(105), 2, 5)),
            Document("q3", edit(article(3), 2, 3)),
            Document("p100", edit(article(100), 2, 10)),
        ]
        other = [Document(f"n{i}", edit(article(i), 3, i)) for i in (3, 103, 105, 117)]
        decide_and_store(first, start)
        backend = first.index._backend
        assert isinstance(backend, Interleaved)
        backend.at = at
        backend.meanwhile = lambda: decide_and_store(second, other)
        pre = first.predecide(pending)
        assert backend.meanwhile is None  # it ran
        got = verdicts(settled(first, pending, pre))
    assert got == reference(tmp_path / "rocks", [start, other, pending])[2]
    assert first.predecided.touched_docs >= 4
    of = {v[0]: v[2] for v in got}
    assert (of["o105"], of["p100"]) == ("n105", "o100")


def test_an_instance_decides_before_the_lease_only_while_another_writes(
    shared: Callable[[], Deduplicator],
) -> None:
    """Alone, deciding before the lease gains nothing: an instance does so until a lease
    shows no other instance wrote since its last read of the log, then decides inside,
    and before it again once a lease finds another instance's write."""
    first, second = shared(), shared()
    assert first.index.others_writing  # nothing known yet: as if others wrote
    decide_and_store(first, stories(0, 10))
    decide_and_store(first, stories(10, 10))
    assert not first.index.others_writing  # its own write is not another's
    decide_and_store(second, stories(20, 10))
    decide_and_store(first, stories(30, 10))
    assert first.index.others_writing
    decide_and_store(first, stories(40, 10))
    assert not first.index.others_writing


def test_another_instances_write_seen_before_the_lease_still_counts_as_writing(
    shared: Callable[[], Deduplicator],
) -> None:
    """A batch decided before the lease takes the other instances' writes off the log;
    the lease after it must still know they wrote, or the next batch would be decided
    inside the lease and one decided ahead thrown away."""
    first, second = shared(), shared()
    decide_and_store(first, stories(0, 10))
    decide_and_store(first, stories(10, 10))
    assert not first.index.others_writing
    decide_and_store(second, stories(20, 10))
    batch = stories(30, 10)
    pre = first.predecide(batch)  # reads the second's write, as of its version
    assert pre is not None
    settled(first, batch, pre)  # the log has nothing new for the lease itself
    assert first.index.others_writing
    assert first.predecided.kept + first.predecided.moved == 1


def test_storing_offsets_leaves_a_batch_decided_before_the_lease_settled(
    shared: Callable[[], Deduplicator],
) -> None:
    """The last batch's offsets are stored after the next batch was decided before the
    lease (the delivery is confirmed beside it); offsets are no part of what a batch is
    decided against, so the batch is settled, not decided again whole."""
    first, second = shared(), shared()
    decide_and_store(first, stories(0, 10))
    decide_and_store(second, stories(10, 10))
    batch = stories(20, 10)
    pre = first.predecide(batch)
    assert pre is not None
    first.index.write_offsets({("news", 0): 10})
    settled(first, batch, pre)
    assert first.predecided.redecided == 0
    assert first.predecided.kept + first.predecided.moved == 1
    assert first.index.offsets() == {("news", 0): 10}
