"""Shingling: vectorised k-gram hashes agree with a plain-Python reference of the same sets."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dedup.core import shingles
from stream_dedup.core.hashing import mix_seed
from stream_dedup.core.normalize import normalize
from stream_dedup.core.shingles import ShingleSpec, shingle_batch, shingle_set

M64 = (1 << 64) - 1
POLY = 0x9E3779B97F4A7C15


def fmix64_ref(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


def char_shingles_ref(text: str, k: int) -> set[str]:
    """The string shingles the module docstring promises: k-grams, or the whole short text."""
    if not text:
        return set()
    if len(text) < k:
        return {text}
    return {text[i : i + k] for i in range(len(text) - k + 1)}


def char_hash_ref(gram: str, seed: int) -> int:
    """``fmix64(poly(code points + 1) + seed_mix)`` in plain Python integers."""
    acc = 0
    for ch in gram:
        acc = (acc * POLY + ord(ch) + 1) & M64
    return fmix64_ref((acc + int(mix_seed(seed, shingles.SHINGLE_SALT))) & M64)


def word_grams_ref(text: str, k: int) -> set[tuple[str, ...]]:
    words = text.split(" ") if text else []
    if not words:
        return set()
    if len(words) < k:
        return {tuple(words)}
    return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}


def assert_sorted_distinct(arr: np.ndarray) -> None:
    assert arr.dtype == np.uint64
    assert np.all(arr[1:] > arr[:-1])


@pytest.fixture(scope="module")
def kijiji_texts(kijiji_ads: list[tuple[str, str]]) -> list[str]:
    return [normalize(content) for _, content in kijiji_ads]


def test_distinct_hashes_match_distinct_string_shingles_on_real_ads(
    kijiji_texts: list[str],
) -> None:
    sets = shingle_batch(kijiji_texts, ShingleSpec(), seed=1)
    assert len(sets) == len(kijiji_texts)
    total = 0
    for text, hashed in zip(kijiji_texts, sets, strict=True):
        assert_sorted_distinct(hashed)
        assert hashed.size == len(char_shingles_ref(text, 5)), text
        total += hashed.size
    assert total > 500_000  # the check ran over real, long ads


def test_hash_values_follow_the_documented_polynomial(kijiji_texts: list[str]) -> None:
    texts = [*kijiji_texts[:40], "ab", "abcd", "abcde", "città più"]
    for seed in (1, 12345):
        for text, hashed in zip(texts, shingle_batch(texts, ShingleSpec(), seed), strict=True):
            expected = sorted(char_hash_ref(g, seed) for g in char_shingles_ref(text, 5))
            assert hashed.tolist() == expected


@pytest.mark.parametrize("text", ["a", "ok", "hi!", "abcd", "é"])
def test_short_text_is_exactly_one_shingle(text: str) -> None:
    hashed = shingle_set(text, ShingleSpec(), 1)
    assert hashed.size == 1
    assert int(hashed[0]) == char_hash_ref(text, 1)


def test_short_texts_differ_from_each_other_and_from_grams() -> None:
    spec = ShingleSpec()
    assert shingle_set("ok", spec, 1)[0] != shingle_set("ko", spec, 1)[0]
    assert shingle_set("abcd", spec, 1)[0] not in shingle_set("abcde", spec, 1)
    assert shingle_set("abcde", spec, 1).size == 1  # exactly k characters: one full gram
    assert shingle_set("abcdef", spec, 1).size == 2


@pytest.mark.parametrize("spec", [ShingleSpec(), ShingleSpec("word", 3)])
def test_empty_text_has_no_shingles(spec: ShingleSpec) -> None:
    empty = shingle_set("", spec, 1)
    assert empty.size == 0
    assert empty.dtype == np.uint64
    assert shingle_batch([], spec, 1) == []
    assert [s.size for s in shingle_batch(["", "", ""], spec, 1)] == [0, 0, 0]


def test_word_ngrams_match_reference(kijiji_texts: list[str]) -> None:
    spec = ShingleSpec("word", 3)
    texts = [*kijiji_texts[:300], "one", "one two", "one two three", "a b a b a b"]
    for text, hashed in zip(texts, shingle_batch(texts, spec, 1), strict=True):
        assert_sorted_distinct(hashed)
        assert hashed.size == len(word_grams_ref(text, 3)), text
    assert shingle_set("a b a b a b", spec, 1).size == 2  # "a b a" and "b a b"
    assert shingle_set("one two", spec, 1).size == 1  # fewer words than k: one shingle


def test_word_ngrams_depend_on_word_order_and_not_on_characters_within_grams() -> None:
    spec = ShingleSpec("word", 2)
    a = shingle_set("red fox runs", spec, 1)
    b = shingle_set("fox red runs", spec, 1)
    assert np.intersect1d(a, b).size == 0
    # The same word bigram in two texts is the same hash.
    assert np.intersect1d(a, shingle_set("a red fox", spec, 1)).size == 1


def test_lone_surrogates_are_shingled_not_fatal() -> None:
    """JSON input can carry lone surrogates (``"\\ud800"``); shingling must not fail."""
    text = "abc \ud800 def"
    assert shingle_set(text, ShingleSpec(), 1).size == len(char_shingles_ref(text, 5))
    assert shingle_set(text, ShingleSpec("word", 2), 1).size == 2


@pytest.mark.parametrize("spec", [ShingleSpec(), ShingleSpec("word", 2)])
def test_batch_equals_one_at_a_time(kijiji_texts: list[str], spec: ShingleSpec) -> None:
    """Result of a document is independent of its batch: lengths, chunking and order."""
    rng = np.random.default_rng(7)
    huge = " ".join(kijiji_texts[:60])  # tens of KB in the same batch as 1-char texts
    texts = [*kijiji_texts[:600], huge, "", "a", "ok", "hi there", huge[:9000], ""]
    order = rng.permutation(len(texts))
    texts = [texts[i] for i in order]
    batch = shingle_batch(texts, spec, 3)
    shuffled_back = shingle_batch(texts[::-1], spec, 3)[::-1]
    for text, a, b in zip(texts, batch, shuffled_back, strict=True):
        single = shingle_set(text, spec, 3)
        np.testing.assert_array_equal(a, single)
        np.testing.assert_array_equal(b, single)
    assert max(len(t) for t in texts) > 20 * 1024


def test_deterministic_for_a_seed_and_seed_sensitive(kijiji_texts: list[str]) -> None:
    text = kijiji_texts[0]
    one = shingle_set(text, ShingleSpec(), 1)
    np.testing.assert_array_equal(one, shingle_set(text, ShingleSpec(), 1))
    other = shingle_set(text, ShingleSpec(), 2)
    assert other.size == one.size
    assert np.intersect1d(one, other).size == 0
    words1 = shingle_set(text, ShingleSpec("word", 3), 1)
    words2 = shingle_set(text, ShingleSpec("word", 3), 2)
    assert np.intersect1d(words1, words2).size == 0


@pytest.mark.parametrize(("kind", "k"), [("char", 0), ("char", 65), ("word", -1), ("bytes", 5)])
def test_invalid_spec_rejected(kind: str, k: int) -> None:
    with pytest.raises(ValueError):
        ShingleSpec(kind, k)  # type: ignore[arg-type]
