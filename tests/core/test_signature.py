"""Signatures: pinned bytes, and an unbiased Jaccard estimate at least as good as MinHash's."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from stream_dedup.core.normalize import normalize
from stream_dedup.core.shingles import ShingleSpec, shingle_batch, shingle_set
from stream_dedup.core.signature import SIG_DTYPE, estimate_jaccard, signatures

K = 128

TEXT = (
    "The city council approved the new transport budget on Tuesday after a long debate. "
    "Supporters said the plan would add three tram lines and extend night buses to the "
    "suburbs; critics warned that fares could rise by up to twelve percent next year. "
    "The mayor, speaking to reporters outside the town hall, promised a public consultation "
    "before any fare increase. Work on the first line is expected to begin in spring, "
    "with completion scheduled for 2027. Affittasi bilocale arredato, zona Termini: "
    "650 € al mese, spese incluse. Ｆｕｌｌｗｉｄｔｈ letters and ﬁ ligatures normalise too."
)
SHORT = "Ciao, Roma!"


def signature_of(text: str, num_perm: int = K, seed: int = 1) -> np.ndarray:
    return signatures([shingle_set(normalize(text), ShingleSpec(), seed)], num_perm, seed)


# GOLDEN VALUES. Signatures are persisted in every index (band keys, and the records under
# --verify signature). If one of these changes, existing indexes silently stop matching new
# documents: do not update the numbers, bump NORMALIZER_VERSION / SHINGLER_VERSION /
# SIGNATURE_SCHEME (whichever changed) so that old indexes refuse to open instead.
GOLDEN_TEXT_SHA256 = "48257e16c4845051d113724ab8d8c45cf37816c03882ef8b9781c978a78781d6"
GOLDEN_TEXT_HEAD = [3572483570, 3158827499, 2471548215, 4146447167, 4195751660]
GOLDEN_SHORT_SHA256 = "9c9b73c978e4539e31c5ec9d8c4579a211e09d831219cdbce246f3fc79a37c74"
GOLDEN_SHORT_HEAD = [1546977669, 113669996, 3446522365, 113669996, 1698665612]


def test_golden_signature_bytes() -> None:
    sig = signature_of(TEXT)
    assert sig.shape == (1, K)
    assert sig.dtype == SIG_DTYPE == np.dtype("<u4")
    assert sig[0, :5].tolist() == GOLDEN_TEXT_HEAD
    assert hashlib.sha256(sig.tobytes()).hexdigest() == GOLDEN_TEXT_SHA256


def test_golden_signature_bytes_of_a_densified_short_text() -> None:
    """7 shingles in 128 bins: almost every value comes from densification, also pinned."""
    sig = signature_of(SHORT)
    assert sig[0, :5].tolist() == GOLDEN_SHORT_HEAD
    assert hashlib.sha256(sig.tobytes()).hexdigest() == GOLDEN_SHORT_SHA256


def test_signature_depends_on_seed_and_num_perm() -> None:
    base = signature_of(TEXT)
    assert np.count_nonzero(base == signature_of(TEXT, seed=2)) < 5
    sig256 = signature_of(TEXT, num_perm=256)
    assert sig256.shape == (1, 256)
    assert not np.array_equal(sig256[:, :K], base)


def test_batch_equals_one_at_a_time(kijiji_ads: list[tuple[str, str]]) -> None:
    texts = [normalize(c) for _, c in kijiji_ads[:400]] + ["ok", "hi!", TEXT * 30]
    sets = shingle_batch(texts, ShingleSpec(), 1)
    batch = signatures(sets, K, 1)
    assert batch.shape == (len(texts), K)
    for row, s in zip(batch, sets, strict=True):
        np.testing.assert_array_equal(row, signatures([s], K, 1)[0])


def test_identical_sets_give_identical_signatures_despite_empty_bins() -> None:
    rng = np.random.default_rng(5)
    for size in (1, 2, 3, 10, 40, 5000):
        s = np.sort(rng.integers(0, 2**64, size=size, dtype=np.uint64))
        s = s[np.concatenate(([True], s[1:] != s[:-1]))]
        noise = [np.sort(rng.integers(0, 2**64, size=n, dtype=np.uint64)) for n in (7, 900)]
        a = signatures([s], K, 1)[0]
        b = signatures([noise[0], s.copy(), noise[1]], K, 1)[1]
        np.testing.assert_array_equal(a, b)
        assert estimate_jaccard(a, b) == 1.0


def test_single_element_set_fills_every_bin_with_its_value() -> None:
    h = np.array([0x0123456789ABCDEF], dtype=np.uint64)
    sig = signatures([h], K, 1)[0]
    assert sig.tolist() == [0x89ABCDEF] * K


def test_empty_set_raises() -> None:
    empty = np.zeros(0, dtype=np.uint64)
    with pytest.raises(ValueError, match="empty"):
        signatures([empty], K, 1)
    with pytest.raises(ValueError, match="empty"):
        signatures([np.array([1, 2], dtype=np.uint64), empty], K, 1)
    assert signatures([], K, 1).shape == (0, K)


def test_estimate_jaccard_is_fraction_of_equal_positions() -> None:
    a = np.arange(8, dtype=SIG_DTYPE)
    b = a.copy()
    b[:3] += 1
    assert estimate_jaccard(a, b) == 5 / 8
    assert estimate_jaccard(a, a) == 1.0


def known_jaccard_pairs(
    rng: np.random.Generator, j_target: float, size: int, pairs: int
) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """``pairs`` pairs of sorted, distinct random uint64 sets of ``size`` elements each.

    Each pair shares ``s`` elements and has ``p`` private ones per side, so the exact Jaccard
    is ``s / (s + 2p)`` (returned; as close to ``j_target`` as integers allow).
    """
    shared = round(size * 2 * j_target / (1 + j_target))
    private = size - shared
    exact = shared / (shared + 2 * private)
    vals = rng.integers(0, 2**64, size=(pairs, shared + 2 * private), dtype=np.uint64)
    a = np.sort(vals[:, : shared + private], axis=1)
    b = np.sort(np.concatenate([vals[:, :shared], vals[:, shared + private :]], axis=1), axis=1)
    # Distinct within each pair, so the Jaccard above is exact.
    union = np.sort(vals, axis=1)
    assert np.all(union[:, 1:] > union[:, :-1])
    return exact, list(a), list(b)


def estimates(
    rng: np.random.Generator, j: float, size: int, pairs: int
) -> tuple[float, np.ndarray]:
    exact, a, b = known_jaccard_pairs(rng, j, size, pairs)
    sa, sb = signatures(a, K, 1), signatures(b, K, 1)
    est = np.array([estimate_jaccard(x, y) for x, y in zip(sa, sb, strict=True)])
    return exact, est


@pytest.mark.parametrize("size", [300, 1000, 3000])
def test_estimate_unbiased_and_no_worse_than_classic_minhash(size: int) -> None:
    """Mean within 4 standard errors of J; RMSE <= 1.10 x classic MinHash's sqrt(J(1-J)/K)."""
    rng = np.random.default_rng(size)
    pairs = 1500
    for j in (0.2, 0.5, 0.8, 0.9):
        exact, est = estimates(rng, j, size, pairs)
        assert abs(exact - j) < 0.005
        stderr = est.std(ddof=1) / np.sqrt(pairs)
        assert abs(est.mean() - exact) <= 4 * stderr, (size, exact, est.mean())
        rmse = float(np.sqrt(np.mean((est - exact) ** 2)))
        classic = float(np.sqrt(exact * (1 - exact) / K))
        assert rmse <= 1.10 * classic, (size, exact, rmse / classic)
        assert rmse > 0.5 * classic  # the estimate really varies: K values, not an oracle


@pytest.mark.parametrize("size", [20, 60])
def test_estimate_unbiased_on_small_sets_with_densified_bins(size: int) -> None:
    rng = np.random.default_rng(100 + size)
    pairs = 3000
    for j in (0.2, 0.5, 0.8, 0.9):
        exact, est = estimates(rng, j, size, pairs)
        stderr = est.std(ddof=1) / np.sqrt(pairs)
        assert abs(est.mean() - exact) <= 4 * stderr, (size, exact, est.mean())
