"""Verification sets and exact Jaccard: what a duplicate verdict rests on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stream_dedup.core import jit, match
from stream_dedup.core.match import similarity_at_least
from stream_dedup.core.normalize import normalize
from stream_dedup.core.shingles import ShingleSets, ShingleSpec, shingle_sets
from stream_dedup.core.verify import exact_jaccard, verification_sets
from stream_dedup.tools.generate import StreamSpec, generate


def reference_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = set(a.tolist()), set(b.tolist())
    return len(sa & sb) / len(sa | sb)


def test_verification_sets_are_the_distinct_high_halves_of_each_set() -> None:
    sets = ShingleSets.from_list(
        [
            np.array([1, 2, (5 << 32) + 1, (5 << 32) + 9, 7 << 32], dtype=np.uint64),
            np.zeros(0, dtype=np.uint64),
            np.array([(5 << 32) + 3], dtype=np.uint64),
            np.array([(1 << 64) - 1], dtype=np.uint64),
        ]
    )
    out = verification_sets(sets)
    assert [v.tolist() for v in out] == [[0, 5, 7], [], [5], [(1 << 32) - 1]]
    assert all(v.dtype == np.dtype("<u4") for v in out)


def test_verification_sets_of_an_empty_batch() -> None:
    assert verification_sets(ShingleSets.from_list([])) == []
    empty = verification_sets(ShingleSets.from_list([np.zeros(0, dtype=np.uint64)] * 2))
    assert [v.size for v in empty] == [0, 0]


def test_exact_jaccard_matches_set_arithmetic() -> None:
    a = np.array([1, 3, 5, 7], dtype=np.uint32)
    b = np.array([3, 4, 5, 8, 9], dtype=np.uint32)
    assert exact_jaccard(a, b) == 2 / 7
    assert exact_jaccard(a, a) == 1.0
    assert exact_jaccard(a, np.zeros(0, dtype=np.uint32)) == 0.0


@pytest.mark.parametrize("form", [jit.compiled, jit.python])
def test_similarity_at_least_is_exact_jaccard_above_the_threshold_and_minus_one_below(
    form: Callable[[Any], Any],
) -> None:
    """Every pair and threshold, including pairs exactly at it: same float, or -1, in
    numba's compiled form and in Python's."""
    similarity_at_least = form(match.similarity_at_least)
    rng = np.random.default_rng(11)
    checked = at_threshold = 0
    for _ in range(400):
        na, nb = rng.integers(0, 60, size=2)
        common = int(rng.integers(0, min(na, nb) + 1))
        pool = rng.choice(1 << 20, size=na + nb, replace=False).astype(np.uint32)
        a = np.sort(pool[:na])
        b = np.sort(np.concatenate([pool[:common], pool[na : na + nb - common]]))
        exact = exact_jaccard(a, b)
        # Thresholds on a grid, and the pair's own similarity (a match exactly at it).
        for threshold in (0.0, 0.3, 0.5, 0.8, 0.9, 1.0, exact):
            got = similarity_at_least(a, b, threshold)
            if exact >= threshold:
                assert got == exact
                at_threshold += exact == threshold and exact > 0
            else:
                assert got == -1.0
            checked += 1
    assert checked == 2800 and at_threshold > 300


def test_similarity_at_least_on_a_stranger_and_a_near_duplicate() -> None:
    """-1 for a pair far below the threshold; the exact value for a near-duplicate."""
    rng = np.random.default_rng(5)
    pool = rng.choice(1 << 31, size=2000, replace=False).astype(np.uint32)
    a = np.sort(pool[:1000])
    stranger = np.sort(np.concatenate([pool[:100], pool[1000:1900]]))
    near = np.sort(np.concatenate([pool[:950], pool[1000:1050]]))
    assert similarity_at_least(a, stranger, 0.8) == -1.0
    assert similarity_at_least(a, near, 0.8) == exact_jaccard(a, near) == 950 / 1050


def test_32_bit_verification_agrees_with_64_bit_jaccard_on_news_pairs() -> None:
    """Cutting hashes to 32 bits changes Jaccard only through rare collisions.

    On pairs of a generated news stream (nearby articles, many of them edited copies of
    one story) the 32-bit Jaccard equals the 64-bit one to within one shingle of the union.
    """
    docs = generate(StreamSpec(documents=300, seed=3))
    texts = [normalize(f"{d['title']}\n{d['text']}") for d in docs]
    sets64 = shingle_sets(texts, ShingleSpec(), 1)
    sets32 = verification_sets(sets64)
    list64 = sets64.as_list()
    compared = similar = 0
    for i in range(0, len(texts), 3):
        for j in range(i + 1, min(i + 60, len(texts))):
            j64 = reference_jaccard(list64[i], list64[j])
            j32 = exact_jaccard(sets32[i], sets32[j])
            union = len(set(list64[i].tolist()) | set(list64[j].tolist()))
            assert abs(j32 - j64) <= 1.0 / union + 1e-12
            compared += 1
            similar += j64 >= 0.5
    assert compared > 5000 and similar > 30
