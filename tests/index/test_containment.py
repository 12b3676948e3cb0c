"""Containment: excerpts of earlier documents found, named and verified, on every backend.

The stream and its truth are ``tests/excerpts.py``'s (news stories, re-runs and excerpts
under their own header and footer; containment and Jaccard of every pair by brute force
over string shingles, independent of the package's hashing). The targets are issue 31's:
excerpt recall >= 0.95 at containment 0.8, false alarms on at most 0.5 % of the documents
whose containment and Jaccard are both below 0.7, the containing document named for at
least 95 % of the flagged excerpts, and near-duplicates found as without containment.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stream_dedup.api import Detector
from stream_dedup.cli.app import main
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import IndexMismatchError
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.models import Document, Verdict
from tests.excerpts import ContainmentTruth, containment_truth, excerpt_stream

DOCUMENTS = 2500
BATCH = 500
C = 0.8


@dataclass(frozen=True)
class Stream:
    docs: list[Document]
    truth: ContainmentTruth


@pytest.fixture(scope="module")
def stream() -> Stream:
    s = excerpt_stream(DOCUMENTS)
    docs = [Document(r["id"], c) for r, c in zip(s.records, s.contents, strict=True)]
    return Stream(docs, containment_truth(s.contents))


def run(backend: Backend, docs: list[Document], **config: object) -> list[Verdict]:
    cfg = DedupConfig(**config)  # type: ignore[arg-type]
    dedup = Deduplicator(DedupIndex(backend, IndexParams.of(cfg)), cfg)
    out: list[Verdict] = []
    for at in range(0, len(docs), BATCH):
        out.extend(dedup.process(docs[at : at + BATCH]).verdicts)
    return out


def flagged(verdicts: list[Verdict]) -> npt.NDArray[np.bool_]:
    return np.array([v.is_duplicate for v in verdicts])


@pytest.fixture(params=["memory", "rocks", "redis", "redis-cluster"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Every backend: the sampled buckets are band buckets to each (the whole stream runs
    on one Redis node, not again on the cluster)."""
    kind: str = request.param
    return kind


def test_excerpts_are_found_and_named(
    backend_factory: Callable[[], Backend], stream: Stream, backend_kind: str
) -> None:
    if backend_kind == "redis-cluster":
        pytest.skip("the whole stream runs on one Redis node")
    truth, docs = stream.truth, stream.docs
    verdicts = run(backend_factory(), docs, containment=C)
    dup = flagged(verdicts)
    best, jac, source = truth.best, truth.best_jaccard, truth.source
    excerpts = (best >= C) & (jac < C)
    assert excerpts.sum() > 300  # the stream holds what it is meant to
    recall = (dup & excerpts).sum() / excerpts.sum()
    assert recall >= 0.95, recall
    low = (best < 0.7) & (jac < 0.7)
    assert (dup & low).sum() <= 0.005 * low.sum(), (dup & low).sum()
    position = {d.id: n for n, d in enumerate(docs)}
    named = [
        position[v.duplicate_of] == source[n]
        for n, v in enumerate(verdicts)
        if v.relation == "excerpt" and v.duplicate_of is not None
    ]
    assert len(named) >= 0.9 * excerpts.sum()
    assert np.mean(named) >= 0.95
    # Near-duplicates (Jaccard >= T) are all still found, and called so.
    near = jac >= 0.8
    assert dup[near].all()
    assert all(verdicts[n].relation == "near-duplicate" for n in np.flatnonzero(near))
    # The containment a verdict reports is the exact one (32-bit shingle hashes: equal
    # to the strings' up to a rare collision).
    for n, v in enumerate(verdicts):
        if v.relation == "near-duplicate" and v.similarity != 1.0:
            of = position[v.duplicate_of]
            assert v.containment == pytest.approx(truth.containment[n, of], abs=0.005)
        if v.relation == "excerpt":
            of = position[v.duplicate_of]
            assert v.containment == pytest.approx(truth.containment[n, of], abs=0.005)
            assert v.containment is not None and v.containment >= C
            assert v.similarity == pytest.approx(truth.jaccard[n, of], abs=0.005)


def test_containment_off_decides_as_before(
    backend_factory: Callable[[], Backend], stream: Stream, backend_kind: str
) -> None:
    if backend_kind == "redis-cluster":
        pytest.skip("the whole stream runs on one Redis node")
    off = run(backend_factory(), stream.docs)
    assert all(v.relation is None and v.contains is None for v in off)
    on = run(backend_factory(), stream.docs, containment=C)
    # Every duplicate without containment is one with it, of the same document.
    for a, b in zip(off, on, strict=True):
        if a.is_duplicate:
            assert (b.duplicate_of, b.similarity, b.relation) == (
                a.duplicate_of,
                a.similarity,
                "near-duplicate",
            )


def words(seed: int, count: int) -> str:
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(count)
    )


def test_a_document_that_contains_an_earlier_one_says_so() -> None:
    from stream_dedup.index.memory import MemoryBackend

    short, added = words(1, 60), words(2, 200)
    verdicts = run(
        MemoryBackend(),
        [Document("a", short), Document("b", words(3, 150)), Document("c", short + " " + added)],
        containment=C,
    )
    c = verdicts[2]
    assert not c.is_duplicate  # it adds text of its own: not a duplicate
    assert c.contains is not None and c.contains[0] == "a" and c.contains[1] >= 0.99
    assert c.to_json()["contains"] == {"id": "a", "containment": c.contains[1]}
    assert verdicts[1].contains is None


def test_within_a_batch_and_across_batches(backend_factory: Callable[[], Backend]) -> None:
    story = [words(10 + i, 40) for i in range(6)]
    full = "\n\n".join(story)
    excerpt = "Harbour Post\n\n" + "\n\n".join(story[:3])
    cfg = DedupConfig(containment=C)
    dedup = Deduplicator(DedupIndex(backend_factory(), IndexParams.of(cfg)), cfg)
    first = dedup.process([Document("s", full), Document("x1", excerpt)]).verdicts
    later = dedup.process([Document("x2", "Valley Tribune\n\n" + "\n\n".join(story[2:5]))])
    for v in (first[1], later.verdicts[0]):
        assert (v.is_duplicate, v.duplicate_of, v.relation) == (True, "s", "excerpt")
        assert v.cluster_id == "s"
    assert later.stats.excerpts == 1
    # A replay repeats the stored verdict, containment fields included.
    again = dedup.process([Document("x1", excerpt)]).verdicts[0]
    assert again.replayed and (again.relation, again.containment) == (
        first[1].relation,
        first[1].containment,
    )
    # A new revision of an id is decided like any document: as an excerpt here.
    revised = dedup.process([Document("x1", "Metro Wire\n\n" + "\n\n".join(story[3:6]))])
    v = revised.verdicts[0]
    assert (v.revision, v.relation, v.duplicate_of) == (2, "excerpt", "s")


def test_an_expired_document_is_no_source(backend_factory: Callable[[], Backend]) -> None:
    story = "\n\n".join(words(40 + i, 40) for i in range(6))
    cfg = DedupConfig(containment=C)
    index = DedupIndex(backend_factory(), IndexParams.of(cfg), Retention(max_documents=3))
    dedup = Deduplicator(index, cfg)
    dedup.process([Document("s", story)])
    dedup.process([Document(f"f{i}", words(100 + i, 150)) for i in range(4)])
    late = dedup.process([Document("x", story[: len(story) // 2])]).verdicts[0]
    assert not late.is_duplicate and late.contains is None


def test_containment_settings_are_stored(backend_factory: Callable[[], Backend]) -> None:
    backend = backend_factory()
    DedupIndex(backend, IndexParams.of(DedupConfig()))
    with pytest.raises(IndexMismatchError, match="containment"):
        DedupIndex(backend, IndexParams.of(DedupConfig(containment=C)))


def test_check_and_the_command_line_report_excerpts(tmp_path: Path) -> None:
    story = "\n\n".join(words(60 + i, 40) for i in range(6))
    excerpt = "Harbour Post\n\n" + story[: len(story) // 2]
    with Detector(containment=C) as det:
        det.add("s", story)
        det.add("other", words(7, 200))
        first = det.check(excerpt, k=2)[0]
        assert (first.id, first.relation) == ("s", "excerpt")
        assert first.containment is not None and first.containment >= C
        assert det.stats.documents == 2  # a check adds nothing
    source = tmp_path / "in.jsonl"
    source.write_text(
        json.dumps({"id": "s", "text": story})
        + "\n"
        + json.dumps({"id": "x", "text": excerpt})
        + "\n",
        encoding="utf-8",
    )
    target = tmp_path / "out.jsonl"
    argv = ["dedup", str(source), "--output", str(target), "-q", "--containment", "0.8"]
    assert main([*argv, "--index", str(tmp_path / "idx")]) == 0
    lines = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert lines[1]["relation"] == "excerpt" and lines[1]["duplicate_of"] == "s"
    assert list(lines[1])[:6] == [
        "id", "verdict", "duplicate_of", "similarity", "relation", "containment"
    ]  # fmt: skip
    # The index remembers it was built with containment: another setting is refused.
    assert main([*argv[:-2], "--containment", "0.9", "--index", str(tmp_path / "idx")]) != 0
