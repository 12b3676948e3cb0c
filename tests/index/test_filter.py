"""The key filter: no false negatives, the false-positive rate it is sized for, and an
index whose filtered bucket reads equal plain reads, before and after a reopen."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import Backend, DedupIndex, RocksBackend, keys
from stream_dedup.index.backend import OrderedPuts
from stream_dedup.index.epoch_filters import EpochFilters
from stream_dedup.index.filter import (
    BITS_PER_KEY,
    FILE_MAGIC,
    MIN_CAPACITY,
    KeyFilter,
    bucket_fingerprints,
    key_fingerprints,
)
from stream_dedup.index.params import IndexParams
from stream_dedup.index.store import FILTER_FILE
from stream_dedup.models import Document


def random_keys(n: int, seed: int, bands: int = 18) -> list[bytes]:
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, np.iinfo(np.uint64).max, size=(n, bands), dtype=np.uint64)
    return keys.bucket_keys(hashes)


def false_positive_rate(filt: KeyFilter, seed: int) -> float:
    probes = random_keys(20_000, seed)  # 360,000 keys never added
    return float(filt.may_hold(bucket_fingerprints(probes)).mean())


@pytest.fixture(params=["memory", "rocks"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Key filters belong to single-writer backends: a shared index keeps none."""
    kind: str = request.param
    return kind


def test_every_added_key_is_held_and_the_false_positive_rate_is_as_sized() -> None:
    filt = KeyFilter(0)
    added = random_keys(MIN_CAPACITY // 18, seed=1)  # fills the filter to its capacity
    filt.add(bucket_fingerprints(added))
    assert filt.layers == 1 and filt.count == len(added)
    assert filt.nbytes == MIN_CAPACITY * BITS_PER_KEY // 8
    assert filt.may_hold(bucket_fingerprints(added)).all()
    # Split block Bloom filters at 10 bits per key: about 1% (0.8% in theory, full).
    assert 0.002 < false_positive_rate(filt, seed=2) < 0.015


def test_a_full_filter_grows_a_layer_and_still_holds_every_key() -> None:
    filt = KeyFilter(0)
    batches = [random_keys(20_000, seed=10 + i) for i in range(8)]  # 2.9 M keys
    for batch in batches:
        filt.add(bucket_fingerprints(batch))
    assert filt.layers == 2
    assert filt.count == sum(map(len, batches))
    for batch in batches:
        assert filt.may_hold(bucket_fingerprints(batch)).all()
    assert false_positive_rate(filt, seed=3) < 0.02


def test_an_empty_filter_holds_nothing() -> None:
    filt = KeyFilter(5)
    assert not filt.may_hold(bucket_fingerprints(random_keys(1000, seed=4))).any()
    assert filt.may_hold(bucket_fingerprints([])).size == 0


def test_fingerprints_separate_bands_and_refuse_other_keys() -> None:
    same_hash = np.full((1, 4), 12345, dtype=np.uint64)
    assert np.unique(bucket_fingerprints(keys.bucket_keys(same_hash))).size == 4
    with pytest.raises(ValueError, match="bucket keys"):
        bucket_fingerprints([keys.doc_key(1) + b"xx"])  # 11 bytes, but a document key
    with pytest.raises(ValueError, match="bucket keys"):
        bucket_fingerprints([keys.verdict_key("an id")])


def kijiji_index(path: Path, docs: list[Document], batch: int) -> Deduplicator:
    config = DedupConfig()
    dedup = Deduplicator(DedupIndex(RocksBackend(path), IndexParams.of(config)), config)
    for lo in range(0, len(docs), batch):
        dedup.process(docs[lo : lo + batch])
    return dedup


def test_filtered_bucket_reads_equal_plain_reads_before_and_after_reopening(
    tmp_path: Path, kijiji_ads: list[tuple[str, str]]
) -> None:
    docs = [Document(i, c) for i, c in kijiji_ads]
    first, rest = docs[:1500], docs[1500:]
    dedup = kijiji_index(tmp_path / "index", first, batch=500)
    probe = dedup.sketch(rest).bucket_keys + dedup.sketch(first).bucket_keys
    held = dedup.index.read(probe)
    assert dedup.index.read_buckets(probe) == held
    assert 0 < sum(v is not None for v in held) < len(held)  # hits and misses both
    lookups = [keys.verdict_key(d.id) for d in docs] + dedup.sketch(docs).exact_keys
    looked_up = dedup.index.read(lookups)
    assert dedup.index.read_lookups(lookups) == looked_up
    assert 0 < sum(v is not None for v in looked_up) < len(looked_up)
    backend = dedup.index._backend
    stored = sum(1 for kind in (b"b", b"v", b"x") for _ in backend.scan_keys(kind))
    assert dedup.index.load_filter().count >= stored
    dedup.index.close()

    # Closing saved the filter beside the index; it is moved aside here, so that the
    # reopened index rebuilds it from the keys on disk (a crash leaves no saved filter).
    saved = tmp_path / "index" / FILTER_FILE
    assert saved.stat().st_size > dedup.index.load_filter().nbytes
    saved.rename(tmp_path / "kept-filter")
    config = DedupConfig()
    reopened = Deduplicator(DedupIndex(RocksBackend(tmp_path / "index"), None), config)
    progress: list[int] = []
    assert reopened.index.load_filter(progress.append).count == stored
    assert len(progress) == 3 and progress[-1] == stored  # a chunk per kind of key
    assert reopened.index.load_filter(progress.append).count == stored  # built once
    assert reopened.index.read_buckets(probe) == held
    assert reopened.index.read_lookups(lookups) == looked_up
    for lo in range(0, len(rest), 300):
        reopened.process(rest[lo : lo + 300])
    assert reopened.index.read_buckets(probe) == reopened.index.read(probe)
    assert reopened.index.read_lookups(lookups) == reopened.index.read(lookups)
    assert all(v is not None for v in reopened.index.read_lookups(lookups[: len(docs)]))
    reopened.index.close()


def test_every_committed_bucket_key_reaches_the_filter(
    backend_factory: Callable[[], Backend],
) -> None:
    """Buckets committed before the filter is built are found by its scan; buckets
    committed after, whether as ordered bucket puts or among plain puts, by the write;
    verdict and exact-text keys likewise."""
    index = DedupIndex(backend_factory(), IndexParams.of(DedupConfig()))
    before, plain, ordered, never = (random_keys(50, seed=20 + i) for i in range(4))
    index.commit(dict.fromkeys(before, b"\x01" * 8), {})
    assert index.read_buckets(before) == [b"\x01" * 8] * len(before)  # built here, by scan
    index.commit(dict.fromkeys(plain, b"\x02" * 8), {})
    in_order = sorted(ordered)
    index.apply(index.prepare({}, {}, ordered=OrderedPuts(in_order, [b"\x03" * 8] * len(in_order))))
    assert index.read_buckets(plain) == [b"\x02" * 8] * len(plain)
    assert index.read_buckets(ordered) == [b"\x03" * 8] * len(ordered)
    assert index.read_buckets(never) == [None] * len(never)
    assert index.load_filter().count == 3 * 50 * 18
    verdicts = [keys.verdict_key(f"id-{i}") for i in range(40)]
    texts = [keys.exact_key(i.to_bytes(16, "big")) for i in range(40)]
    index.commit(dict.fromkeys(verdicts[:20] + texts[:20], b"\x04"), {})
    found = index.read_lookups(verdicts + texts)
    assert found == ([b"\x04"] * 20 + [None] * 20) * 2
    with pytest.raises(ValueError, match="verdict and exact-text keys only"):
        index.read_lookups([keys.doc_key(1)])
    index.close()


def test_fingerprints_handed_in_must_match_the_keys(
    backend_factory: Callable[[], Backend],
) -> None:
    index = DedupIndex(backend_factory(), IndexParams.of(DedupConfig()))
    some = random_keys(3, seed=30)
    fps = bucket_fingerprints(some)
    assert index.read_buckets(some, fps) == [None] * len(some)
    with pytest.raises(ValueError, match="one fingerprint per bucket key"):
        index.read_buckets(some, fps[:-1])
    with pytest.raises(ValueError, match="one fingerprint per ordered put"):
        in_order = sorted(some)
        index.prepare(
            {}, {}, ordered=OrderedPuts(in_order, [b"x"] * 3), ordered_fingerprints=fps[:1]
        )
    index.close()


def test_a_closed_index_reopens_with_its_saved_filter_and_a_stale_one_is_rebuilt(
    tmp_path: Path, kijiji_ads: list[tuple[str, str]]
) -> None:
    """Closing saves the filter; the next opening loads it (no scan) and removes the file.
    A filter saved before a later write (a crash after more batches, another program
    writing the index) is not used: the filter is built from the keys on disk."""
    docs = [Document(i, c) for i, c in kijiji_ads[:1200]]
    dedup = kijiji_index(tmp_path / "index", docs[:800], batch=400)
    built = dedup.index.load_filter()
    probe = dedup.sketch(docs).bucket_keys
    lookups = [keys.verdict_key(d.id) for d in docs] + dedup.sketch(docs).exact_keys
    dedup.index.close()
    saved = tmp_path / "index" / FILTER_FILE
    assert saved.exists()

    index = DedupIndex(RocksBackend(tmp_path / "index"), None)
    progress: list[int] = []
    loaded = index.load_filter(progress.append)
    assert progress == []  # loaded, not scanned
    assert loaded.count == built.count and loaded.nbytes == built.nbytes
    assert not saved.exists()  # it would describe an index that moves on from here
    assert index.read_buckets(probe) == index.read(probe)
    assert index.read_lookups(lookups) == index.read(lookups)
    stale = tmp_path / "stale-filter"
    index.close()
    saved.rename(stale)  # the filter as of 800 documents

    # More documents are committed by a process that never saves its filter (as if
    # killed), then the stale file is put back: it is not used.
    writer = Deduplicator(DedupIndex(RocksBackend(tmp_path / "index"), None), DedupConfig())
    writer.process(docs[800:])
    writer.index._filters = EpochFilters(writer.index._backend)  # nothing to save, as if killed
    writer.index.close()
    assert not saved.exists()
    stale.rename(saved)
    index = DedupIndex(RocksBackend(tmp_path / "index"), None)
    rebuilt = index.load_filter(progress.append)
    assert len(progress) == 3 and rebuilt.count > built.count
    assert not saved.exists()
    assert index.read_buckets(probe) == index.read(probe)
    assert all(v is not None for v in index.read_lookups(lookups[: len(docs)]))
    index.close()


def test_a_damaged_saved_filter_is_rebuilt(tmp_path: Path) -> None:
    index = DedupIndex(RocksBackend(tmp_path / "index"), IndexParams.of(DedupConfig()))
    index.commit(dict.fromkeys(random_keys(20, seed=30), b"\x01" * 8), {"documents": 20})
    held = index.load_filter().count
    index.close()
    saved = tmp_path / "index" / FILTER_FILE
    saved.write_bytes(saved.read_bytes()[:-100])  # cut short
    index = DedupIndex(RocksBackend(tmp_path / "index"), None)
    progress: list[int] = []
    assert index.load_filter(progress.append).count == held
    assert progress  # scanned
    index.close()
    saved.write_bytes(b"something else entirely")
    index = DedupIndex(RocksBackend(tmp_path / "index"), None)
    assert index.load_filter().count == held
    index.close()


def test_key_fingerprints_are_a_fixed_function_of_the_bytes() -> None:
    """Saved filters depend on it: the same in every process (unlike ``hash``), and
    pinned here, so a change of the function is a deliberate change of FILE_MAGIC."""
    probe = [b"v", keys.verdict_key("id-1"), keys.verdict_key("id-2"), b"v" + bytes(15)]
    code = (
        "from stream_dedup.index.filter import key_fingerprints;"
        f"print(key_fingerprints({probe!r}).tolist())"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1
    here = key_fingerprints(probe).tolist()
    assert runs == {f"{here}\n"}
    assert len(set(here)) == len(probe)
    assert FILE_MAGIC == b"SDKEYFILTER1\n"
    assert here == [reference_key_hash(k) for k in probe]


def reference_key_hash(key: bytes) -> int:
    """The key hash written out in Python: the length, then 8-byte little-endian words."""
    mask = (1 << 64) - 1

    def mix(h: int) -> int:
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & mask
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & mask
        return h ^ (h >> 31)

    h = mix(len(key) ^ 0x9E3779B97F4A7C15)
    for at in range(0, len(key), 8):
        h = mix(h ^ int.from_bytes(key[at : at + 8], "little"))
    return h
