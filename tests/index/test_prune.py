"""Candidates whose stored text is too short to reach the threshold are not rebuilt, and
the verdicts stay those of verifying every candidate (:mod:`stream_dedup.dedup.prune`)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup import deduplicator as deciding
from stream_dedup.index.memory import MemoryBackend
from stream_dedup.index.params import IndexParams
from stream_dedup.index.store import DedupIndex
from stream_dedup.models import Document, Verdict
from stream_dedup.tools.generate import StreamSpec, generate
from tests.conftest import BackendFactory

CONFIG = DedupConfig()


def distinct_grams(n: int, seed: int) -> str:
    """A text of ``n`` characters whose 5-grams are all distinct (checked by the tests)."""
    rng = random.Random(seed)
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=n))


def decide_all(dedup: Deduplicator, batches: Sequence[Sequence[Document]]) -> list[Verdict]:
    out: list[Verdict] = []
    for batch in batches:
        result = dedup.decide(batch)
        dedup.commit(result)
        out += result.verdicts
    return out


def test_a_pair_exactly_at_the_threshold_is_verified_and_a_shorter_one_skipped(
    backend_factory: BackendFactory,
) -> None:
    """|B| / |A| = 0.8 exactly: the bound allows the threshold, so B is rebuilt and is A's
    match at 0.8; C (79 of A's 100 grams) cannot reach it and is never rebuilt."""
    a = distinct_grams(104, 3)  # 100 distinct 5-grams
    b, c = a[:84], a[21:]  # 84 and 83 characters: 80 and 79 of A's grams
    dedup = Deduplicator(DedupIndex(backend_factory(), IndexParams.of(CONFIG)), CONFIG)
    sk = dedup.sketch([Document("a", a), Document("b", b), Document("c", c)])
    assert sk.set_len.tolist() == [100, 80, 79]
    dedup.set_cache.max_bytes = 0  # every candidate's set is rebuilt or skipped
    decide_all(dedup, [[Document("b", b), Document("c", c)]])
    result = dedup.decide([Document("a", a)])
    assert result.stats.candidates == [2]
    (verdict,) = result.verdicts
    assert (verdict.is_duplicate, verdict.duplicate_of, verdict.similarity) == (True, "b", 0.8)
    assert (dedup.set_cache.rebuilt, dedup.set_cache.skipped) == (1, 1)


def stream_with_prefixes() -> list[list[Document]]:
    """News articles' prefixes of 50-100% of their length, then the articles: each article
    meets shorter texts, above and below the threshold."""
    articles = [
        r["title"] + "\n\n" + r["text"] for r in generate(StreamSpec(documents=600, seed=3))
    ]
    rng = random.Random(4)
    prefixes = [
        Document(f"p{i}", t[: int(len(t) * rng.uniform(0.5, 1.0))]) for i, t in enumerate(articles)
    ]
    full = [Document(f"a{i}", t) for i, t in enumerate(articles)]
    return [prefixes[:300], prefixes[300:], full[:300], full[300:]]


@pytest.mark.parametrize("containment", [0.0, 0.8], ids=["jaccard", "containment"])
def test_verdicts_are_those_of_verifying_every_candidate(
    monkeypatch: pytest.MonkeyPatch, containment: float
) -> None:
    config = DedupConfig(containment=containment)
    batches = stream_with_prefixes()

    def run() -> tuple[list[Verdict], Deduplicator]:
        dedup = Deduplicator(DedupIndex(MemoryBackend(), IndexParams.of(config)), config)
        dedup.set_cache.max_bytes = 0  # every set asked for is rebuilt or skipped
        return decide_all(dedup, batches), dedup

    pruned, dedup = run()
    with monkeypatch.context() as patch:
        patch.setattr(deciding, "needed_records", lambda *args: None)
        every, plain = run()
    assert pruned == every
    assert sum(v.is_duplicate for v in pruned) > 300
    assert plain.set_cache.skipped == 0
    assert dedup.set_cache.skipped > 50  # prefixes below ~0.8 of an article's length
    assert dedup.set_cache.rebuilt + dedup.set_cache.skipped == plain.set_cache.rebuilt
