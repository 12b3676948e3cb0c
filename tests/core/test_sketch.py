"""The compiled sketch path gives exactly what the reference functions give."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stream_dedup.core import jit
from stream_dedup.core._kernels import WHITESPACE, drop_repeats
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.sketch import _sketch_char, _sketch_numpy, sketch
from stream_dedup.index.filter import bucket_fingerprints
from stream_dedup.tools.generate import StreamSpec, generate

EDGE_CASES = [
    "",
    " ",
    "  \n\t \r\x0b\x0c ",
    "a",
    "ab",
    "abcd",
    "abcde",
    " a b ",
    "hello   world  ",
    "x\u3000\u3000y\u2028z\u2029",
    "\x1c\x1dq\x85 r\xa0s\u1680t\u2000\u200au\u202f\u205fv",
    "\ufb01ve \u2460 \uff21\uff22",  # NFKC: ligature, circled digit, full width
    "Stra\u00dfe \u0130stanbul \u03a3\u039f\u03a3",  # casefold: sharp s, dotted I, final sigma
    "e\u0301 \u00e9",  # combining accent vs precomposed
    "\ud800abc\udfff",  # lone surrogates (JSON can carry them)
    "\U0001f600 emoji \U0001f600\U0001f600 \U00010348",
    "\u200b\u200c\u200d zero width (not whitespace)",
    "tab\tsep\tvalues\n\n\nand lines\r\n",
]


def random_texts(n: int, seed: int) -> list[str]:
    """Texts drawn from an alphabet rich in whitespace and multi-byte characters."""
    rng = random.Random(seed)
    alphabet = [chr(c) for c in np.flatnonzero(WHITESPACE).tolist()] + list(
        "abcdeé ßİΣς\u0301\u3000\ufb01\U0001f600\ud800"
    )
    return ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(n)]


def assert_same(texts: list[str], config: DedupConfig) -> None:
    live, flat, sizes, sigs, digests, utf8 = _sketch_char(texts, config)
    ref_live, ref_flat, ref_sizes, ref_sigs, ref_digests, ref_utf8 = _sketch_numpy(texts, config)
    assert live == ref_live
    cut = [utf8[0][s : s + n] for s, n in zip(utf8[1], utf8[2], strict=True)]
    assert cut == [ref_utf8[0][s : s + n] for s, n in zip(ref_utf8[1], ref_utf8[2], strict=True)]
    assert np.array_equal(sigs, ref_sigs)
    assert sizes.tolist() == ref_sizes.tolist()
    assert len(sizes) == (len(live) if config.verify == "exact" else 0)
    assert np.array_equal(flat, ref_flat)
    assert digests == ref_digests


@pytest.mark.parametrize("k", [1, 3, 5, 9])
def test_edge_cases_match_the_reference(k: int) -> None:
    assert_same(EDGE_CASES, DedupConfig(shingle_size=k))


def test_random_unicode_matches_the_reference() -> None:
    for seed in range(5):
        assert_same(random_texts(400, seed), DedupConfig())


@pytest.mark.slow
def test_every_whitespace_character_collapses_like_str_split() -> None:
    texts = [f"a{chr(c)}{chr(c)}b{chr(c)}" for c in range(0x3001) if chr(c).isspace()]
    texts += [f"a{chr(c)}b" for c in range(0x3001)]
    assert_same(texts, DedupConfig())
    assert sys.maxunicode >= 0x3000 and WHITESPACE.sum() == sum(
        chr(c).isspace() for c in range(sys.maxunicode + 1)
    )


def test_news_and_ads_match_the_reference(kijiji_ads: list[tuple[str, str]]) -> None:
    news = [f"{d['title']}\n{d['text']}" for d in generate(StreamSpec(documents=500, seed=5))]
    assert_same(news, DedupConfig())
    assert_same([content for _, content in kijiji_ads], DedupConfig())
    assert_same(news[:200], DedupConfig(verify="signature", num_perm=64))


def test_sketch_lines_up_live_documents_with_their_keys() -> None:
    config = DedupConfig()
    sk = sketch(["first text here", "", "   ", "second one"], config, config.band_plan())
    assert sk.live == [0, 3]
    assert sk.sigs.shape == (2, config.num_perm)
    assert len(sk.bucket_keys) == 2 * config.band_plan().bands
    assert len(sk.exact_keys) == len(sk.sets) == 2
    # The fingerprints the worker computes from the band hashes are the keys' own.
    assert np.array_equal(sk.bucket_fingerprints, bucket_fingerprints(sk.bucket_keys))


@pytest.mark.parametrize("compiled", [True, False])
def test_a_sketch_without_payloads_has_the_same_keys_sets_and_signatures(compiled: bool) -> None:
    """What a check sketches (``payloads=False``: it stores nothing) differs from a
    batch's sketch only by the payloads it leaves out."""
    config = DedupConfig()
    texts = ["first text here", "", "second one, a little longer than the first"]
    with jit.forced(compiled):
        full = sketch(texts, config, config.band_plan())
        bare = sketch(texts, config, config.band_plan(), payloads=False)
    assert len(full.payloads) == 2 and all(full.payloads)
    assert bare.payloads == []
    assert bare.live == full.live and bare.exact_keys == full.exact_keys
    assert bare.bucket_keys == full.bucket_keys
    np.testing.assert_array_equal(bare.sigs, full.sigs)
    np.testing.assert_array_equal(bare.set_flat, full.set_flat)
    np.testing.assert_array_equal(bare.bucket_fingerprints, full.bucket_fingerprints)


@pytest.mark.parametrize("form", [jit.compiled, jit.python])
def test_drop_repeats_keeps_each_value_of_a_run_once_and_respects_empty_runs(
    form: Callable[[Any], Any],
) -> None:
    rng = np.random.default_rng(7)
    runs_of = [np.sort(rng.integers(0, 6, rng.integers(0, 12))).astype("<u4") for _ in range(50)]
    runs_of += [np.empty(0, dtype="<u4"), np.array([5], dtype="<u4"), np.array([2, 2, 2], "<u4")]
    values = np.concatenate(runs_of)
    runs = np.concatenate([[0], np.cumsum([r.size for r in runs_of])]).astype(np.int64)
    flat, sizes = form(drop_repeats)(values, runs)
    expected = [np.unique(r) for r in runs_of]
    assert sizes.tolist() == [e.size for e in expected]
    assert np.array_equal(flat, np.concatenate(expected))
