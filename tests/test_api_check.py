"""``Detector.check``: the top-k earlier documents with their scores, nothing written, on
RocksDB on disk and in memory (every backend: ``tests/index/test_check.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stream_dedup
from stream_dedup import CheckMatch, Detector, Document, Relation
from stream_dedup.errors import ConfigError, DecodeError, IndexStoreError
from tests.test_api import STORIES, everything, jaccard


@pytest.fixture(params=["memory", "rocks"])
def detector(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Detector]:
    with Detector(None if request.param == "memory" else tmp_path / "index") as d:
        d.add_many(STORIES[:300])
        yield d


def test_check_names_what_add_would_with_the_same_similarity(detector: Detector) -> None:
    asked = [t for _, t in STORIES[300:]]
    answers = detector.check_many(asked, k=3)
    assert answers == [detector.check(t, k=3) for t in asked]
    assert sum(bool(a) for a in answers) > 20
    queried = detector.query_many(asked)
    for answer, query in zip(answers, queried, strict=True):
        near = [m for m in answer if m.relation is Relation.NEAR_DUPLICATE]
        if query.is_duplicate:
            assert (near[0].id, near[0].similarity) == (query.duplicate_of, query.similarity)
            assert near[0] == answer[0]
        else:
            assert not near
        sims = [m.similarity for m in answer]
        assert sims == sorted(sims, reverse=True) and len(answer) <= 3
    texts = dict(STORIES)
    for answer, text in list(zip(answers, asked, strict=True))[:30]:
        for m in answer:  # exact Jaccard, against a brute-force count of the 5-grams
            assert m.similarity == pytest.approx(jaccard(text, texts[m.id]), abs=0.01)


def test_check_of_a_new_text_is_empty_and_of_a_document_reads_its_content(
    detector: Detector,
) -> None:
    assert detector.check("A garage to let in Ostia, 90 euro a month") == []
    assert detector.check("") == []
    doc_id, text = STORIES[0]
    top = detector.check(Document("whatever", text), k=1)
    assert [(m.id, m.similarity, m.containment) for m in top] == [(doc_id, 1.0, 1.0)]
    assert isinstance(top[0], CheckMatch) and stream_dedup.CheckMatch is CheckMatch


def test_check_leaves_the_index_byte_for_byte_unchanged(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    with Detector(index_dir) as detector:
        detector.add_many(STORIES[:250])
    before = everything(index_dir)
    with Detector(index_dir) as detector:
        stats, sequence = detector.stats, detector.index._backend.sequence()
        detector.check_many([t for _, t in STORIES], k=10)
        assert detector.stats == stats
        assert detector.index._backend.sequence() == sequence  # not one write
        assert everything(index_dir) == before
        later = detector.add_many(STORIES[250:])
    with Detector() as plain:
        plain.add_many(STORIES[:250])
        assert plain.add_many(STORIES[250:]) == later  # later verdicts as without checks


@pytest.mark.parametrize("k", [0, -2, 2.0, None])
def test_bad_k_is_a_config_error(detector: Detector, k: Any) -> None:
    with pytest.raises(ConfigError, match="k"):
        detector.check("text", k=k)


def test_bad_arguments(detector: Detector) -> None:
    with pytest.raises(TypeError, match="check_many"):
        detector.check_many("one text")
    with pytest.raises(DecodeError, match="str"):
        detector.check(42)  # type: ignore[arg-type]
    detector.close()
    with pytest.raises(IndexStoreError, match="closed"):
        detector.check("text")
