"""The containment kernels against plain models: sampling, votes, intersections."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import pytest

from stream_dedup.core import jit
from stream_dedup.core.containment import (
    ALWAYS,
    ALWAYS_VOTES,
    MIN_VOTES,
    SIGMAS,
    SampledBuckets,
    pair_intersections,
    sample_keys,
    sample_unknown,
    sampled,
    spans,
    vote,
)


def test_sampling_is_consistent_and_near_its_rate() -> None:
    rng = np.random.default_rng(3)
    big = np.unique(rng.integers(0, 2**32, 40_000, dtype=np.uint64)).astype(np.uint32)
    part = big[::3]
    # A value sampled for a set is sampled for every set that holds it.
    assert set(sampled(part, 16, 1).tolist()) == set(sampled(big, 16, 1).tolist()) & set(
        part.tolist()
    )
    assert sampled(big, 16, 1).size == pytest.approx(big.size / 16, rel=0.08)
    assert sampled(big, 16, 2).tolist() != sampled(big, 16, 1).tolist()  # the seed counts
    at = np.array([0, 100], dtype=np.int64)
    length = np.array([100, big.size - 100], dtype=np.int64)
    for compiled in (False, True):  # numpy's passes, and the compiled one
        with jit.forced(compiled):
            pos, values = sample_keys(big, at, length, 16, 1)
        assert values.tolist() == sampled(big, 16, 1).tolist()
        assert pos.tolist() == [0 if v in set(big[:100].tolist()) else 1 for v in values.tolist()]


def test_values_known_full_are_left_out_as_sampled() -> None:
    """``skip`` leaves out exactly the occurrences of its values, in both forms, and
    counts them: what sampling everything and dropping them after gives."""
    rng = np.random.default_rng(4)
    flat = rng.integers(0, 2**32, 30_000, dtype=np.uint64).astype(np.uint32)
    flat[10_000:20_000] = flat[:10_000]  # repeated values: a skipped one occurs twice
    at = np.array([0, 10_000, 20_000], dtype=np.int64)
    length = np.full(3, 10_000, dtype=np.int64)
    all_pos, all_values = sample_keys(flat, at, length, 16, 1)
    skip = np.unique(all_values[::3])
    dropped = np.isin(all_values, skip)
    assert dropped.sum() > skip.size  # skipped values occur in two sets
    for compiled in (False, True):
        with jit.forced(compiled):
            pos, values, skipped = sample_unknown(flat, at, length, 16, 1, skip)
            assert sample_unknown(flat, at, length, 16, 1, None)[2] == 0
        assert values.tolist() == all_values[~dropped].tolist()
        assert pos.tolist() == all_pos[~dropped].tolist()
        assert skipped == int(dropped.sum())


def test_spans() -> None:
    starts = np.array([5, 0, 9, 2], dtype=np.int64)
    lengths = np.array([2, 0, 3, 1], dtype=np.int64)
    assert spans(starts, lengths).tolist() == [5, 6, 9, 10, 11, 2]
    assert spans(starts[:0], lengths[:0]).tolist() == []


def model(occ, held, mine_len, docnum, voting, cap, limit, level):  # type: ignore[no-untyped-def]
    """Documents one by one, buckets as lists: what :func:`vote` computes at once."""
    buckets = {k: list(m) for k, m in held.items()}
    grown = {k: mine_len[k] for k in held}
    out, appended = [], set()
    by_pos: dict[int, list[int]] = defaultdict(list)
    for p, k in occ:
        by_pos[p].append(k)
    for p in sorted(by_pos):
        votes: dict[int, int] = defaultdict(int)
        for k in by_pos[p]:
            if voting[p] and len(buckets[k]) < cap:
                for e in buckets[k]:
                    votes[e] += 1
        ranked = sorted(
            (e for e, n in votes.items() if n >= MIN_VOTES), key=lambda e: (-votes[e], e)
        )
        s = sum(1 for k in by_pos[p] if voting[p] and len(buckets[k]) < cap)
        spread = SIGMAS * math.sqrt(s * level * (1 - level))
        floor = max(MIN_VOTES, math.floor(level * s - spread))
        out += [
            (p, e, votes[e])
            for r, e in enumerate(ranked[:limit])
            if (r < ALWAYS and votes[e] >= ALWAYS_VOTES) or votes[e] >= floor
        ]
        for k in by_pos[p]:
            if docnum[p] >= 0 and grown[k] < cap:
                buckets[k].append(docnum[p])
                grown[k] += 1
                appended.add((p, k))
    return out, appended


@pytest.mark.parametrize("compiled", [False, True])
def test_below_the_floor_the_first_few_need_enough_votes(compiled: bool) -> None:
    # One document with 20 voting values: a container at 0.8 shares >= 10 of them.
    # Earlier document 1 shares 4 (kept: among the first ALWAYS, with ALWAYS_VOTES),
    # document 2 shares 3 (left out), document 3 shares 12 (above the floor).
    members = {1: range(4), 2: range(4, 7), 3: range(7, 19)}
    held = [[d for d, keys in members.items() if k in keys] for k in range(20)]
    lens = np.array([len(h) for h in held], dtype=np.int64)
    buckets = SampledBuckets(
        np.cumsum(lens) - lens, lens, np.array([d for h in held for d in h], dtype=np.int64), lens
    )
    pos, key = np.zeros(20, dtype=np.int64), np.arange(20, dtype=np.int64)
    one = np.array([50], dtype=np.int64)
    with jit.forced(compiled):
        got = vote(pos, key, buckets, one, np.array([True]), 64, 20, 0.8)
    assert ALWAYS_VOTES == 4
    assert list(zip(got.docnum.tolist(), got.votes.tolist(), strict=True)) == [(3, 12), (1, 4)]
    assert got.appended.all()


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_votes_equal_the_one_by_one_model(seed: int, compiled: bool) -> None:
    rng = random.Random(seed)
    n_keys, n_docs, cap, limit = 12, 30, 5, 6
    held = {k: sorted(rng.sample(range(100), rng.randint(0, 6))) for k in range(n_keys)}
    mine_len = {k: rng.randint(0, len(m)) for k, m in held.items()}
    occ = sorted({(p, rng.randrange(n_keys)) for p in range(n_docs) for _ in range(4)})
    docnum = np.array([100 + p if rng.random() < 0.8 else -1 for p in range(n_docs)])
    voting = np.array([rng.random() < 0.7 for _ in range(n_docs)])
    lens = np.array([len(held[k]) for k in range(n_keys)], dtype=np.int64)
    buckets = SampledBuckets(
        np.cumsum(lens) - lens,
        lens,
        np.array([e for k in range(n_keys) for e in held[k]], dtype=np.int64),
        np.array([mine_len[k] for k in range(n_keys)], dtype=np.int64),
    )
    pos = np.array([p for p, _ in occ], dtype=np.int64)
    key = np.array([k for _, k in occ], dtype=np.int64)
    level = rng.choice([0.3, 0.8])
    want, appended = model(occ, held, mine_len, docnum.tolist(), voting.tolist(), cap, limit, level)
    assert want  # the case votes at all
    # Occurrences in batch order (as sampling gives them), and shuffled.
    shuffled = list(range(len(occ)))
    rng.shuffle(shuffled)
    for order in (list(range(len(occ))), shuffled):
        with jit.forced(compiled):
            got = vote(
                pos[order], key[order], buckets, docnum.astype(np.int64), voting, cap, limit, level
            )
        pairs = zip(got.pos.tolist(), got.docnum.tolist(), got.votes.tolist(), strict=True)
        assert list(pairs) == want
        assert {occ[o] for o, a in zip(order, got.appended.tolist(), strict=True) if a} == appended


@pytest.mark.parametrize("compiled", [False, True])
def test_intersections(compiled: bool) -> None:
    rng = np.random.default_rng(5)
    sets = [
        np.unique(rng.integers(0, 300, rng.integers(0, 120))).astype(np.uint32) for _ in range(8)
    ]
    flat = np.concatenate(sets)
    lengths = np.array([s.size for s in sets], dtype=np.int64)
    at = np.cumsum(lengths) - lengths
    a, b = rng.integers(0, 8, 20), rng.integers(0, 8, 20)
    with jit.forced(compiled):
        got = pair_intersections(flat, at[a], lengths[a], flat, at[b], lengths[b])
    want = [np.intersect1d(sets[i], sets[j]).size for i, j in zip(a, b, strict=True)]
    assert got.tolist() == want


def test_intersections_give_up_only_below_what_is_needed() -> None:
    rng = np.random.default_rng(8)
    sets = [
        np.unique(rng.integers(0, 200, rng.integers(1, 150))).astype(np.uint32) for _ in range(10)
    ]
    flat = np.concatenate(sets)
    lengths = np.array([s.size for s in sets], dtype=np.int64)
    at = np.cumsum(lengths) - lengths
    a, b = rng.integers(0, 10, 40), rng.integers(0, 10, 40)
    exact = [np.intersect1d(sets[i], sets[j]).size for i, j in zip(a, b, strict=True)]
    need = rng.integers(0, 80, 40).astype(np.int64)
    with jit.forced(False):
        got = pair_intersections(flat, at[a], lengths[a], flat, at[b], lengths[b], need)
    for g, e, n in zip(got.tolist(), exact, need.tolist(), strict=True):
        assert g == e if e >= n else g < n
