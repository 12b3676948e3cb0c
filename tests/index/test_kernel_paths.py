"""The Python forms of the kernels decide exactly as the compiled ones.

A small batch runs the kernels as plain Python so that a short run never loads numba
(:mod:`stream_dedup.core.jit`). Here the same stream goes through both paths, in small
batches, over the real ads and the generated news, for each verification mode and shingle
kind, on a memory and a RocksDB index: the verdicts, the events built from them, the
work counted, every index byte and the saved key filter must be the same.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rocksdict import AccessType, Options, Rdict

from stream_dedup.core import jit
from stream_dedup.core._kernels import drop_repeats, intersection_at_least
from stream_dedup.core.config import DedupConfig
from stream_dedup.core.lookup_keys import fingerprints
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import DedupIndex, MemoryBackend, open_index
from stream_dedup.index.filter import KeyFilter, key_fingerprints
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from stream_dedup.models import Document, Verdict
from stream_dedup.service.events import Source, event
from stream_dedup.tools.generate import StreamSpec, generate
from tests.corpus import kijiji_contents

#: Small batches: the size the Python forms are for, and many batches, so that documents
#: match across batches (the index) and within them (the batch's own appends).
BATCH = 16


def ads() -> list[Document]:
    return [Document(f"ad-{i}", text) for i, text in enumerate(kijiji_contents())]


def news() -> list[Document]:
    return [Document(r["id"], r["title"] + "\n" + r["text"]) for r in generate(StreamSpec(600))]


CORPORA = {"ads": ads, "news": news}


def rocks_bytes(path: Path) -> dict[str, dict[bytes, bytes]]:
    """Every key and value of a closed RocksDB index, by column family."""
    opts = Options(raw_mode=True)
    families = Rdict.list_cf(str(path), opts)
    db = Rdict(
        str(path),
        opts,
        column_families={f: Options(raw_mode=True) for f in families if f != "default"},
        access_type=AccessType.read_only(),
    )
    try:
        return {
            f: dict((db if f == "default" else db.get_column_family(f)).items()) for f in families
        }
    finally:
        db.close()


def run(
    docs: list[Document],
    config: DedupConfig,
    where: Path | None,
    compiled: bool,
    retention: Retention | None = None,
) -> tuple[list[Verdict], list[Any], Any]:
    """Decide ``docs`` in batches on one path: verdicts, per-batch work, the index's bytes."""
    memory = MemoryBackend()
    params = IndexParams.of(config)
    if where is None:
        index = DedupIndex(memory, params, retention=retention)
    else:
        index = open_index(where, params, retention=retention)
    dedup = Deduplicator(index, config)
    verdicts: list[Verdict] = []
    work: list[Any] = []
    with jit.forced(compiled):
        for at in range(0, len(docs), BATCH):
            result = dedup.process(docs[at : at + BATCH])
            verdicts += result.verdicts
            stats = result.stats
            work.append((stats.candidates, stats.verifications, stats.truncated_lookups))
            points = [p.tolist() for p in result.points or ()]
            work.append((stats.bucket_evictions, stats.exact_hits, points))
        if where is None:
            stored: Any = {e: dict(memory.scan_prefix(b"", e)) for e in memory.epochs()}
        index.close()  # a RocksDB index saves its key filter (built on this path) here
    if where is not None:
        filters = {f.name: f.read_bytes() for f in where.glob("keyfilter*.bin")}
        assert filters  # keyfilter.bin, or one per epoch under retention
        stored = (rocks_bytes(where), filters)
    return verdicts, work, stored


def events(verdicts: list[Verdict]) -> list[tuple[Any, ...]]:
    source = Source("in", 0, 0, None, None, None, [])
    return [(e.key, e.value, e.headers) for e in (event(v, source, None, "out") for v in verdicts)]


@pytest.mark.slow
@pytest.mark.parametrize("corpus", sorted(CORPORA))
@pytest.mark.parametrize("store", ["memory", "rocks"])
@pytest.mark.parametrize(
    ("shingle", "verify"), [("char", "exact"), ("char", "signature"), ("word", "exact")]
)
def test_the_python_path_decides_and_stores_what_the_compiled_one_does(
    corpus: str, store: str, shingle: str, verify: str, tmp_path: Path
) -> None:
    docs = CORPORA[corpus]()
    config = DedupConfig(shingle_kind=shingle, verify=verify)  # type: ignore[arg-type]
    paths = {c: (None if store == "memory" else tmp_path / str(c)) for c in (False, True)}
    py_verdicts, py_work, py_stored = run(docs, config, paths[False], compiled=False)
    verdicts, work, stored = run(docs, config, paths[True], compiled=True)
    assert py_verdicts == verdicts
    assert events(py_verdicts) == events(verdicts)
    assert py_work == work
    assert py_stored == stored
    duplicates = sum(v.is_duplicate for v in verdicts)
    assert 0.2 * len(docs) < duplicates < 0.7 * len(docs)  # both corpora are full of matches
    assert any(0 < (v.similarity or 0) < 1 for v in verdicts)  # and not only exact texts


def test_word_signature_verification_too(tmp_path: Path) -> None:
    docs = news()[:300]
    config = DedupConfig(shingle_kind="word", verify="signature")
    assert run(docs, config, None, compiled=False) == run(docs, config, None, compiled=True)


def test_retention_expires_the_same_documents_on_both_paths(tmp_path: Path) -> None:
    """A window on the documents' clock and a document limit: the matching pass's cutoffs
    and change points, in both forms (the ads are timed one minute apart)."""
    docs = [Document(d.id, d.content, 60_000 * i) for i, d in enumerate(ads()[:1200])]
    retention = Retention(window=6 * 3600, max_documents=500)
    config = DedupConfig()
    py = run(docs, config, tmp_path / "py", compiled=False, retention=retention)
    compiled = run(docs, config, tmp_path / "compiled", compiled=True, retention=retention)
    assert py == compiled
    _, work, _ = compiled
    assert sum(len(points[0]) for _, _, points in work[1::2]) > 1  # the clock moved on


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    """numba looks unloaded to :func:`jit.runs_compiled` (whatever earlier tests loaded);
    ``drop_repeats`` is compiled first, as numba must not be imported a second time."""
    jit.compiled(drop_repeats)
    numba = sys.modules.pop("numba", None)
    try:
        yield
    finally:
        if numba is not None:
            sys.modules["numba"] = numba


@pytest.mark.usefixtures("fresh_choice")
def test_a_small_batch_runs_python_and_a_large_one_compiled() -> None:
    assert not jit.runs_compiled(documents=jit.SMALL_BATCH)
    assert jit.runs_compiled(documents=jit.SMALL_BATCH + 1)
    assert not jit.runs_compiled(items=jit.SMALL_ITEMS)
    assert jit.runs_compiled(items=jit.SMALL_ITEMS + 1)
    assert jit.choose(drop_repeats, documents=1) is not jit.compiled(drop_repeats)
    assert jit.choose(drop_repeats, documents=jit.SMALL_BATCH + 1) is jit.compiled(drop_repeats)
    with jit.forced(True):
        assert jit.runs_compiled(documents=1)
        with jit.forced(False):
            assert not jit.runs_compiled(documents=10**6)
        assert jit.runs_compiled(documents=1)


def test_once_numba_is_loaded_every_batch_runs_compiled() -> None:
    jit.compiled(drop_repeats)
    assert "numba" in sys.modules
    assert jit.runs_compiled(documents=1)


def test_only_kernels_are_compiled() -> None:
    with pytest.raises(TypeError, match="not marked as a kernel"):
        jit.compiled(run)


def test_hashes_wrap_the_same_on_both_paths() -> None:
    """The 64-bit mixes overflow on purpose: Python's numpy scalars must wrap like numba."""
    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 2**64 - 1, 500, dtype=np.uint64, endpoint=True)
    bands = rng.integers(0, 40, 500).astype(np.uint16)
    keys = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in range(0, 40)]
    with jit.forced(False):
        py_fps, py_keys = fingerprints(bands, hashes), key_fingerprints(keys)
        py_filter = KeyFilter(0)
        py_filter.add(py_fps)
        py_held = py_filter.may_hold(hashes)
    with jit.forced(True):
        fps, keys_fps = fingerprints(bands, hashes), key_fingerprints(keys)
        filt = KeyFilter(0)
        filt.add(fps)
        held = filt.may_hold(hashes)
    assert np.array_equal(py_fps, fps) and np.unique(fps).size == 500
    assert np.array_equal(py_keys, keys_fps) and np.unique(keys_fps).size == 40
    assert np.array_equal(py_held, held) and filt.may_hold(fps).all()
    assert all(np.array_equal(a, b) for a, b in zip(py_filter._layers, filt._layers, strict=True))
    a = np.array([1, 3, 5, 7, 9], dtype="<u4")
    b = np.array([3, 4, 5, 9], dtype="<u4")
    assert jit.python(intersection_at_least)(a, b, 1) == 3
    assert jit.compiled(intersection_at_least)(a, b, 1) == 3
    assert jit.python(intersection_at_least)(a, b, 4) == -1
