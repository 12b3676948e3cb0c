"""The verification payload: compressed text that gives back exactly the sketch's sets."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard

from stream_dedup.core import jit
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.payload import (
    ZSTD,
    ZSTD_DICTIONARY,
    ZSTD_MAGICLESS,
    decode_text,
    encode_joined,
    encode_texts,
    payload_sets,
    rebuild_sets,
    set_size_bounds,
)
from stream_dedup.core.payload_dictionary import train
from stream_dedup.core.set_cache import SetCache
from stream_dedup.core.sketch import sketch
from stream_dedup.errors import IndexCorruptError
from stream_dedup.tools.generate import StreamSpec, generate
from tests.core.test_sketch import EDGE_CASES, random_texts


def news(n: int) -> list[str]:
    return [r["title"] + "\n\n" + r["text"] for r in generate(StreamSpec(documents=n, seed=5))]


@pytest.mark.parametrize(
    "config",
    [DedupConfig(), DedupConfig(shingle_size=3), DedupConfig(shingle_kind="word")],
    ids=["char-5", "char-3", "word-3"],
)
def test_rebuilt_sets_are_the_sketch_sets(config: DedupConfig) -> None:
    texts = EDGE_CASES + random_texts(300, 1) + news(200)
    sk = sketch(texts, config, config.band_plan())
    assert len(sk.payloads) == len(sk.live) > 200
    assert all(p[0] == ZSTD_MAGICLESS for p in sk.payloads)
    rebuilt = rebuild_sets([decode_text(p) for p in sk.payloads], config)
    for mine, theirs in zip(rebuilt, sk.sets, strict=True):
        assert mine.dtype == theirs.dtype
        assert np.array_equal(mine, theirs)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize(
    "config",
    [DedupConfig(), DedupConfig(shingle_size=3), DedupConfig(shingle_kind="word")],
    ids=["char-5", "char-3", "word-3"],
)
def test_sets_rebuilt_from_payloads_are_the_sketch_sets(
    config: DedupConfig, compiled: bool
) -> None:
    """The fused rebuild (UTF-8 hashed in the kernel, lone surrogates included) and the
    reference path give the sketch's sets, and the bounds from the frame headers hold."""
    texts = EDGE_CASES + random_texts(300, 2) + news(100)
    sk = sketch(texts, config, config.band_plan())
    with jit.forced(compiled):
        flat, sizes = payload_sets(sk.payloads, config)
    assert sizes.tolist() == sk.set_len.tolist()
    assert flat.dtype == sk.set_flat.dtype
    assert np.array_equal(flat, np.concatenate(sk.sets))
    bounds = set_size_bounds(sk.payloads, config.shingle)
    assert (bounds >= sizes).all()
    if config.shingle.kind == "char":  # tight for ASCII texts of distinct grams
        abc = sketch(["abcdefghij"], config, config.band_plan())
        assert set_size_bounds(abc.payloads, config.shingle).tolist() == abc.set_len.tolist()


def test_size_bounds_read_both_codecs_and_refuse_others() -> None:
    text = "a story of a ship \ud800 and a storm"
    raw = text.encode("utf-8", "surrogatepass")
    (payload,) = encode_texts(raw, [0], [len(raw)])
    old = bytes([ZSTD]) + zstandard.ZstdCompressor(level=1).compress(raw)
    spec = DedupConfig().shingle
    assert set_size_bounds([payload, old], spec).tolist() == [len(raw) - 4] * 2
    with pytest.raises(IndexCorruptError, match="codec"):
        set_size_bounds([b"\x07abc"], spec)
    with pytest.raises(IndexCorruptError, match="frame header"):
        set_size_bounds([bytes([ZSTD]) + b"not a frame"], spec)


def test_size_bounds_and_rebuilt_sets_read_dictionary_payloads() -> None:
    config = DedupConfig()
    texts = news(400)
    dictionary = train(texts[:300])
    assert dictionary is not None
    sk = sketch(texts[300:], config, config.band_plan(), dictionary)
    assert all(p[0] == ZSTD_DICTIONARY for p in sk.payloads)
    bounds = set_size_bounds(sk.payloads, config.shingle)
    flat, sizes = payload_sets(sk.payloads, config)
    assert sizes.tolist() == sk.set_len.tolist()
    assert np.array_equal(flat, np.concatenate(sk.sets))
    assert (bounds >= sizes).all() and (bounds < 4 * sizes).all()


@pytest.mark.parametrize("trained", [False, True], ids=["plain", "dictionary"])
def test_a_batch_compressed_at_once_is_each_text_compressed_alone(trained: bool) -> None:
    """The sketch compresses a batch in one call: each payload must be byte for byte the
    one a text compressed alone gets (payloads already stored, their sizes, and the
    frame-header bounds all rest on it), an empty text included."""
    texts = [*news(300), "", "a \ud800 lone surrogate", "x"]
    dictionary = train(texts[:200]) if trained else None
    assert (dictionary is not None) == trained
    raws = [t.encode("utf-8", "surrogatepass") for t in texts]
    lengths = [len(r) for r in raws]
    starts = np.cumsum(lengths) - lengths
    utf8 = b"".join(raws)
    joined, sizes = encode_joined(utf8, starts.tolist(), lengths, dictionary)
    alone = encode_texts(utf8, starts.tolist(), lengths, dictionary)
    assert joined == b"".join(alone)
    assert sizes.tolist() == [len(p) for p in alone]
    ends = np.cumsum(sizes).tolist()
    assert [decode_text(joined[e - n : e]) for e, n in zip(ends, sizes.tolist(), strict=True)] == (
        texts
    )
    assert encode_joined(b"", [], [], dictionary)[0] == b""


def test_payload_is_a_fraction_of_the_set() -> None:
    config = DedupConfig()
    sk = sketch(news(300), config, config.band_plan())
    text_bytes = sum(map(len, sk.payloads))
    set_bytes = 4 * int(sk.set_len.sum())
    assert text_bytes < set_bytes / 5  # ~600 bytes against ~4,300 for a news article


def test_signature_verification_makes_no_payloads() -> None:
    config = DedupConfig(verify="signature")
    assert sketch(news(5), config, config.band_plan()).payloads == []


def test_cache_rebuilds_once_and_keeps_within_its_budget() -> None:
    config = DedupConfig()
    sk = sketch(news(100), config, config.band_plan())
    one_set = int(sk.set_len.max()) * 4 + max(map(len, sk.payloads))
    cache = SetCache(20 * one_set, config)
    nums = list(range(100))
    first = cache.sets(nums[:10], sk.payloads[:10])
    again = cache.sets(nums[:10], sk.payloads[:10])
    assert (cache.asked, cache.rebuilt) == (20, 10)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    for lo in range(10, 100, 5):  # five new texts a call, and the first text every time
        rebuilt = cache.rebuilt
        cache.sets([0, *nums[lo : lo + 5]], [sk.payloads[0], *sk.payloads[lo : lo + 5]])
        assert cache.rebuilt - rebuilt <= 5  # the first text is never rebuilt: it is renewed
        assert cache.nbytes <= cache.max_bytes
    assert 5 < len(cache) < 60  # the oldest generations went
    assert sk.payloads[1] not in {p for p in sk.payloads[80:]}
    rebuilt = cache.rebuilt
    cache.sets(nums[:2], sk.payloads[:2])
    assert cache.rebuilt == rebuilt + 1  # the first text kept, the second one dropped
    for got, want in zip(cache.sets(nums, sk.payloads), sk.sets, strict=True):
        assert np.array_equal(got, want)


def test_kept_sets_are_found_without_rebuilding() -> None:
    config = DedupConfig()
    sk = sketch(news(20), config, config.band_plan())
    cache = SetCache(1 << 20, config)
    nums = np.arange(20, dtype=np.int64) + 100
    cache.keep_spans(nums, sk.payloads, sk.set_flat, sk.set_at, sk.set_len)
    got = cache.sets(nums.tolist(), sk.payloads)
    assert cache.rebuilt == 0
    assert all(np.array_equal(a, b) for a, b in zip(got, sk.sets, strict=True))


def test_a_docnum_storing_another_text_is_rebuilt() -> None:
    """A docnum given again to another document (a shared index's batch decided again
    elsewhere) must not find the set kept for the first one."""
    config = DedupConfig()
    sk = sketch(news(4), config, config.band_plan())
    assert len(set(sk.payloads)) == 4
    cache = SetCache(1 << 20, config)
    cache.keep_spans(np.arange(4, dtype=np.int64), sk.payloads, sk.set_flat, sk.set_at, sk.set_len)
    swapped = [sk.payloads[1], sk.payloads[0], sk.payloads[2], sk.payloads[3]]
    got = cache.sets([0, 1, 2, 3], swapped)
    assert cache.rebuilt == 2
    want = [sk.sets[1], sk.sets[0], sk.sets[2], sk.sets[3]]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_broken_payload_is_a_corrupt_index() -> None:
    with pytest.raises(IndexCorruptError, match="codec"):
        decode_text(b"\x07abc")
    with pytest.raises(IndexCorruptError, match="decompress"):
        decode_text(bytes([ZSTD]) + b"not a zstd frame")
    with pytest.raises(IndexCorruptError, match="decompress"):
        decode_text(bytes([ZSTD_MAGICLESS]) + b"\xff" * 12)


def test_format_4_payloads_with_zstd_magic_still_decode() -> None:
    """Format 5 writes frames without zstd's magic number; format 4's, with it, still read."""
    text = "a story of a ship, a storm and a port \ud800 again " * 9
    (payload,) = encode_texts(
        text.encode("utf-8", "surrogatepass"), [0], [len(text.encode("utf-8", "surrogatepass"))]
    )
    old = bytes([ZSTD]) + zstandard.ZstdCompressor(level=1, write_checksum=False).compress(
        text.encode("utf-8", "surrogatepass")
    )
    assert payload[0] == ZSTD_MAGICLESS
    assert len(payload) == len(old) - 4
    assert old[1:5] == b"\x28\xb5\x2f\xfd" and payload[1:5] == old[5:9]
    assert decode_text(payload) == decode_text(old) == text


def test_sets_asked_out_of_docnum_order_come_back_in_the_order_asked() -> None:
    """A check asks for its candidates ranked, not by docnum: the sets rebuilt and kept
    must still be each document's own."""
    config = DedupConfig()
    sk = sketch(news(12), config, config.band_plan())
    order = [7, 2, 11, 0, 5, 9, 1, 3, 10, 4, 8, 6]
    cache = SetCache(1 << 20, config)
    for _ in range(2):  # rebuilt, then found
        got = cache.sets([100 + i for i in order], [sk.payloads[i] for i in order])
        assert all(np.array_equal(g, sk.sets[i]) for g, i in zip(got, order, strict=True))
    assert (cache.asked, cache.rebuilt) == (24, len(set(sk.payloads)))


def served(cache: SetCache, docnums: list[int]) -> list[np.ndarray | None]:
    """The sets ``cache.committed_spans`` serves for ``docnums`` (``None``: not served)."""
    source, flats, at, length = cache.committed_spans(docnums)
    return [
        None if s < 0 else flats[s][a : a + n]
        for s, a, n in zip(source.tolist(), at.tolist(), length.tolist(), strict=True)
    ]


def test_committed_sets_are_served_only_below_the_trusted_count() -> None:
    """Sets served without their records' payloads are those of docnums below the count
    ``trust_below`` was given; the generations of a batch never committed (docnums from
    that count on) are dropped, so a later batch under the same docnums cannot find them."""
    config = DedupConfig()
    sk = sketch(news(8), config, config.band_plan())
    cache = SetCache(1 << 20, config)
    assert served(cache, [0, 1]) == [None, None]  # nothing vouched for yet
    first = np.arange(4, dtype=np.int64)
    cache.keep_spans(first, sk.payloads[:4], sk.set_flat, sk.set_at, sk.set_len)
    cache.trust_below(4)  # the batch of docnums 0-3 committed
    at, length = sk.set_at[4:], sk.set_len[4:]
    cache.keep_spans(first + 4, sk.payloads[4:], sk.set_flat, at, length)
    got = served(cache, [1, 3, 5, 9])
    assert [g is None for g in got] == [False, False, True, True]  # 5: not committed yet
    assert np.array_equal(got[0], sk.sets[1]) and np.array_equal(got[1], sk.sets[3])
    assert cache.asked == 2 and cache.rebuilt == 0
    cache.trust_below(4)  # the batch of 4-7 failed: its docnums are given out again
    assert len(cache) == 6  # 0-3, and 1 and 3 renewed (found in the older half); 4-7 gone
    assert cache.sets([1, 3], sk.payloads[1:4:2]) and cache.rebuilt == 0
    cache.trust_below(8)  # another batch committed 4-7, with other texts: none kept here
    assert served(cache, [4, 5, 6, 7]) == [None] * 4
    for got_set, want in zip(served(cache, [0, 1, 2, 3]), sk.sets[:4], strict=True):
        assert got_set is not None and np.array_equal(got_set, want)


def test_a_docnum_held_in_two_generations_serves_each_text_its_own_set() -> None:
    """A docnum kept twice (given out again on a shared index) is found by payload in
    either generation, and once the newer generation is dropped, the older one still
    serves its text."""
    config = DedupConfig()
    sk = sketch(news(8), config, config.band_plan())
    cache = SetCache(1 << 20, config)
    nums = np.arange(4, dtype=np.int64)
    cache.keep_spans(nums, sk.payloads[:4], sk.set_flat, sk.set_at[:4], sk.set_len[:4])
    cache.keep_spans(nums, sk.payloads[4:], sk.set_flat, sk.set_at[4:], sk.set_len[4:])
    for first in (True, False):
        got = cache.sets([0, 1, 2, 3], sk.payloads[:4] if first else sk.payloads[4:])
        want = sk.sets[:4] if first else sk.sets[4:]
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert cache.rebuilt == 0
    cache.trust_below(0)  # a single writer's batch never committed: both generations go
    assert len(cache) == 0
    cache.sets([0], sk.payloads[:1])
    assert cache.rebuilt == 1
