"""LSH banding: the (b, r) criterion, datasketch's choice for contrast, band keys."""

from __future__ import annotations

import hashlib
import itertools

import datasketch
import numpy as np
import pytest

from stream_dedup.core import jit
from stream_dedup.core.bands import (
    BandPlan,
    band_hashes,
    candidate_probability,
    choose_bands,
    datasketch_choice,
    explicit_bands,
    similarity_table,
)
from stream_dedup.core.normalize import normalize
from stream_dedup.core.shingles import ShingleSpec, shingle_set
from stream_dedup.core.signature import SIG_DTYPE, signatures
from stream_dedup.index.keys import bucket_keys, bucket_order, bucket_shared

from .test_signature import TEXT


def test_default_plan_for_threshold_08() -> None:
    plan = choose_bands(0.8, 128)
    assert (plan.bands, plan.rows) == (18, 7)
    assert plan.num_perm == 128
    assert plan.unused == 128 - 126 == 2
    assert plan.probability(0.8) >= 0.95
    assert plan.probability(0.8) == pytest.approx(0.98553, abs=1e-4)
    assert plan.probability(0.5) == pytest.approx(0.13167, abs=1e-5)  # far below T: rare
    assert plan.knee == pytest.approx((1 / 18) ** (1 / 7))


@pytest.mark.parametrize("num_perm", [64, 128, 256])
@pytest.mark.parametrize("threshold", [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95])
def test_plan_is_the_steepest_that_keeps_recall_at_threshold(
    threshold: float, num_perm: int
) -> None:
    plan = choose_bands(threshold, num_perm)
    assert plan.bands * plan.rows <= num_perm
    assert plan.bands == num_perm // plan.rows  # whole bands: more bands only raise P
    assert plan.probability(threshold) >= 0.95
    for rows in range(plan.rows + 1, num_perm + 1):
        assert candidate_probability(threshold, num_perm // rows, rows) < 0.95, rows


def test_recall_target_is_a_parameter() -> None:
    strict = choose_bands(0.8, 128, recall_at_threshold=0.99)
    assert strict.probability(0.8) >= 0.99
    assert strict.rows < choose_bands(0.8, 128).rows


@pytest.mark.parametrize(
    ("threshold", "num_perm", "recall"),
    [(0.05, 16, 0.95), (0.0, 128, 0.95), (1.5, 128, 0.95), (0.8, 0, 0.95), (0.8, 128, 1.0)],
)
def test_impossible_or_invalid_requests_raise(
    threshold: float, num_perm: int, recall: float
) -> None:
    with pytest.raises(ValueError):
        choose_bands(threshold, num_perm, recall)


def test_datasketch_choice_matches_datasketch() -> None:
    ours = datasketch_choice(0.8, 128)
    lsh = datasketch.MinHashLSH(threshold=0.8, num_perm=128)
    assert (ours.bands, ours.rows) == (lsh.b, lsh.r) == (9, 13)
    assert ours.probability(0.8) == pytest.approx(0.40, abs=0.01)
    # The point of our criterion: datasketch's pick misses most pairs at exactly J = T.
    assert choose_bands(0.8, 128).probability(0.8) > 2 * ours.probability(0.8)


@pytest.mark.parametrize(("threshold", "num_perm"), [(0.5, 64), (0.9, 128)])
def test_datasketch_choice_matches_datasketch_elsewhere(threshold: float, num_perm: int) -> None:
    ours = datasketch_choice(threshold, num_perm)
    lsh = datasketch.MinHashLSH(threshold=threshold, num_perm=num_perm)
    assert (ours.bands, ours.rows) == (lsh.b, lsh.r)


def test_explicit_bands_validation() -> None:
    plan = explicit_bands(20, 6, 128, 0.8)
    assert plan == BandPlan(20, 6, 128, 0.8)
    assert plan.unused == 8
    assert explicit_bands(128, 1, 128, 0.8).unused == 0
    for bands, rows, num_perm in [(0, 5, 128), (5, 0, 128), (-1, 5, 128), (17, 8, 128)]:
        with pytest.raises(ValueError):
            explicit_bands(bands, rows, num_perm, 0.8)
    with pytest.raises(ValueError, match="65535"):
        explicit_bands(70_000, 1, 70_000, 0.8)


@pytest.mark.parametrize(("s", "b", "r"), [(0.8, 18, 7), (0.5, 9, 13), (0.3, 32, 4), (0.99, 1, 1)])
def test_candidate_probability_formula(s: float, b: int, r: int) -> None:
    assert candidate_probability(s, b, r) == pytest.approx(1 - (1 - s**r) ** b, rel=1e-12)
    assert candidate_probability(0.0, b, r) == 0.0
    assert candidate_probability(1.0, b, r) == 1.0


def test_candidate_probability_monotone_and_similarity_table() -> None:
    plan = choose_bands(0.8, 128)
    table = similarity_table(plan)
    sims = [s for s, _ in table]
    probs = [p for _, p in table]
    assert sims[0] == pytest.approx(0.1) and sims[-1] == pytest.approx(1.0)
    assert all(b > a for a, b in itertools.pairwise(probs))
    assert probs[-1] == 1.0
    assert similarity_table(plan, [0.8]) == [(0.8, plan.probability(0.8))]


def test_band_hashes_deterministic_and_golden() -> None:
    """Band keys are persisted (bucket keys): pinned like the signature bytes."""
    plan = choose_bands(0.8, 128)
    sig = signatures([shingle_set(normalize(TEXT), ShingleSpec(), 1)], 128, 1)
    keys = band_hashes(sig, plan, 1)
    assert keys.shape == (1, 18)
    assert keys.dtype == np.uint64
    np.testing.assert_array_equal(keys, band_hashes(sig.copy(), plan, 1))
    assert keys[0, :2].tolist() == [7921842781879051505, 4160216529064252478]
    assert (
        hashlib.sha256(keys.tobytes()).hexdigest()
        == "26fdcacb54cd8a811930f77ea5288cbff666508c2d6c4319589ca652593d864b"
    )
    assert not np.array_equal(keys, band_hashes(sig, plan, 2))


@pytest.mark.parametrize("plan", [BandPlan(18, 7, 128, 0.8), BandPlan(5, 3, 16, 0.5)])
@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_band_hashes_compiled_kernel_gives_the_numpy_form_bytes(plan: BandPlan, n: int) -> None:
    """The compiled band hash (used once numba is loaded: the service, a check) and the
    numpy form store the same bucket keys: bit for bit, for any signature values."""
    rng = np.random.default_rng(n)
    sigs = rng.integers(0, 2**32, size=(n, plan.num_perm), dtype=np.uint64).astype(SIG_DTYPE)
    with jit.forced(False):
        reference = band_hashes(sigs, plan, 7)
    with jit.forced(True):
        compiled = band_hashes(sigs, plan, 7)
    assert compiled.shape == (n, plan.bands)
    np.testing.assert_array_equal(compiled, reference)
    if n:
        with jit.forced(True):
            assert not np.array_equal(band_hashes(sigs, plan, 8), reference)


def test_band_keys_differ_between_bands_with_equal_values() -> None:
    """The band number is hashed in, so equal rows in two bands are two different buckets."""
    plan = choose_bands(0.8, 128)
    sig = np.zeros((1, 128), dtype=SIG_DTYPE)
    keys = band_hashes(sig, plan, 1)
    assert np.unique(keys).size == plan.bands
    assert len(set(bucket_keys(keys))) == plan.bands


def test_bucket_order_lists_the_keys_in_ascending_byte_order() -> None:
    rng = np.random.default_rng(5)
    hashes = rng.integers(0, 2**64, size=(300, 18), dtype=np.uint64)
    hashes[7] = hashes[3]  # equal keys (a repeated document) sit side by side
    hashes[:, 4] &= 0xFF  # small hashes: byte order must not follow the string length
    keys = bucket_keys(hashes)
    order = bucket_order(hashes).tolist()
    assert sorted(order) == list(range(len(keys)))
    assert [keys[j] for j in order] == sorted(keys)


def test_band_key_depends_only_on_its_own_rows() -> None:
    plan = choose_bands(0.8, 128)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**32, size=(1, 128), dtype=np.uint64).astype(SIG_DTYPE)
    b = a.copy()
    b[0, 3 * plan.rows + 2] ^= 1  # one value in band 3
    b[0, 127] ^= 1  # an unused value: in no band
    ka, kb = band_hashes(a, plan, 1)[0], band_hashes(b, plan, 1)[0]
    assert [i for i in range(plan.bands) if ka[i] != kb[i]] == [3]
    batch = band_hashes(np.vstack([a, b]), plan, 1)
    np.testing.assert_array_equal(batch, np.vstack([ka, kb]))


def test_bucket_shared_lists_every_repeated_key_with_its_first_position() -> None:
    rng = np.random.default_rng(9)
    hashes = rng.integers(0, 2**64, size=(200, 18), dtype=np.uint64)
    hashes[150] = hashes[20]  # a repeated document: all 18 keys shared
    hashes[90, 5] = hashes[30, 5]  # one shared band
    hashes[120, 5] = hashes[30, 5]  # three documents in one bucket
    hashes[60, 6] = hashes[10, 5]  # equal hash in another band: a different key
    hashes[199, 17] = hashes[0, 0]  # the last position of the batch, in another band
    keys = bucket_keys(hashes)
    first: dict[bytes, int] = {}
    for j, k in enumerate(keys):
        first.setdefault(k, j)
    counts = {k: keys.count(k) for k in first}
    want = sorted((j, first[k]) for j, k in enumerate(keys) if counts[k] > 1)
    got = sorted(map(tuple, bucket_shared(hashes, bucket_order(hashes)).tolist()))
    assert got == want
    assert len(want) == 2 * 18 + 3
    assert bucket_shared(hashes[:1], bucket_order(hashes[:1])).shape == (0, 2)
