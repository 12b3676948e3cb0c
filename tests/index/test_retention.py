"""Retention: the window on the stream's clock, ``max_documents``, epochs dropped whole,
restarts (graceful and kill -9) and replays, over both backends."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.errors import ConfigError
from stream_dedup.index import Backend, DedupIndex, open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import (
    NO_CLOCK,
    SLICES,
    Retention,
    first_held,
    format_duration,
    parse_duration,
)
from stream_dedup.models import Document, VerdictKind
from tests.index.test_dedup import article, edit

DUP, UNIQUE = VerdictKind.DUPLICATE, VerdictKind.UNIQUE
CONFIG = DedupConfig()
HOUR_MS = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms


def build(backend: Backend, retention: Retention) -> Deduplicator:
    return Deduplicator(DedupIndex(backend, IndexParams.of(CONFIG), retention), CONFIG)


def doc(i: int | str, text: str, time_ms: int | None) -> Document:
    return Document(str(i), text, time_ms)


def stream(n: int, start: int = 0, step_ms: int = 1000) -> list[Document]:
    """``n`` unrelated articles one ``step_ms`` apart."""
    return [
        doc(i, article(10_000 + i, words=60), T0 + i * step_ms) for i in range(start, start + n)
    ]


def verdict_of(dedup: Deduplicator, document: Document) -> tuple[str, str | None]:
    """What ``document`` would be decided now (decided, not committed)."""
    v = dedup.decide([document]).verdicts[0]
    return v.verdict.value, v.duplicate_of


def test_durations_parse_and_print() -> None:
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("12h") == 43200 and parse_duration(" 90m ") == 5400
    assert parse_duration("45") == 45 and parse_duration(7) == 7
    assert parse_duration("none") == 0 and parse_duration("") == 0 and parse_duration(None) == 0
    assert format_duration(30 * 86400) == "30d" and format_duration(90) == "90s"
    for bad in ("30 days", "-1d", "1.5h", "d"):
        with pytest.raises(ConfigError, match="not a duration"):
            parse_duration(bad)
    with pytest.raises(ConfigError, match="max_documents"):
        Retention(max_documents=-1)


@pytest.mark.parametrize("zero", ["0", "0d", "0h", " 0s ", "00w", 0])
def test_a_zero_duration_is_an_error_that_says_what_to_write(zero: str | int) -> None:
    with pytest.raises(ConfigError, match="window of zero") as caught:
        parse_duration(zero, "--retention")
    assert caught.value.key == "--retention"
    assert "'none'" in caught.value.problem and "leave the option out" in caught.value.problem


def test_first_held_is_the_first_docnum_decided_inside_the_window() -> None:
    points_doc = np.array([0, 10, 20], dtype=np.int64)
    points_clock = np.array([100, 200, 300], dtype=np.int64)
    window = Retention(window=100)
    assert first_held(points_doc, points_clock, 300, 30, window) == 10  # clock 200 is held
    assert first_held(points_doc, points_clock, 301, 30, window) == 20
    assert first_held(points_doc, points_clock, 200, 30, window) == 0
    assert first_held(points_doc, points_clock, 999, 30, window) == 30  # everything expired
    assert first_held(points_doc, points_clock, NO_CLOCK, 30, window) == 0
    both = Retention(window=100, max_documents=5)
    assert first_held(points_doc, points_clock, 300, 30, both) == 25


def test_a_copy_inside_the_window_is_a_duplicate_and_one_after_it_is_unique(
    backend_factory: Callable[[], Backend],
) -> None:
    dedup = build(backend_factory(), Retention(window=24 * 3600))
    a, b = article(1), article(2)
    dedup.process([doc("a", a, T0), doc("b", b, T0 + 1000)])
    # The clock moves with the documents decided: 23 h 59 min later, a is still held.
    late = T0 + 24 * HOUR_MS - 60_000
    dedup.process([doc("filler-1", article(3), late)])
    assert verdict_of(dedup, doc("a-copy", edit(a, 3, 5), late)) == ("duplicate", "a")
    assert verdict_of(dedup, doc("a-exact", a, late)) == ("duplicate", "a")
    # One second past a's window (a was decided at T0): a has expired, b (T0 + 1 s) not yet.
    past = T0 + 24 * HOUR_MS + 1000
    dedup.process([doc("filler-2", article(4), past)])
    assert verdict_of(dedup, doc("a-copy", edit(a, 3, 5), past)) == ("unique", None)
    assert verdict_of(dedup, doc("a-exact", a, past)) == ("unique", None)
    assert verdict_of(dedup, doc("b-copy", b, past)) == ("duplicate", "b")
    # An expired text indexed again becomes the one its later copies point at.
    dedup.process([doc("a-again", a, past)])
    assert verdict_of(dedup, doc("a-third", a, past + 1000)) == ("duplicate", "a-again")
    stats = dedup.index.stats()
    assert stats.expired == 1 and stats.held == stats.indexed - 1
    assert stats.clock == past // 1000 and stats.oldest_time == (T0 + 1000) // 1000


def test_the_window_applies_document_by_document_inside_one_batch(
    backend_factory: Callable[[], Backend],
) -> None:
    dedup = build(backend_factory(), Retention(window=60))
    a = article(1)
    batch = [
        doc("a", a, T0),
        doc("a-copy-1", a, T0 + 59_000),  # inside a's minute
        doc("filler", article(2), T0 + 61_000),  # moves the clock past it
        doc("a-copy-2", a, T0 + 62_000),
    ]
    got = [(v.id, v.verdict, v.duplicate_of) for v in dedup.process(batch).verdicts]
    assert got == [
        ("a", UNIQUE, None),
        ("a-copy-1", DUP, "a"),
        ("filler", UNIQUE, None),
        # a-copy-1 was decided at T0 + 59 s: still held, so the copy is its duplicate.
        ("a-copy-2", DUP, "a-copy-1"),
    ]


def test_max_documents_keeps_exactly_the_newest(backend_factory: Callable[[], Backend]) -> None:
    n = 40
    dedup = build(backend_factory(), Retention(max_documents=n))
    docs = stream(100)
    for lo in range(0, 100, 7):
        dedup.process(docs[lo : lo + 7])
    stats = dedup.index.stats()
    assert (stats.indexed, stats.held, stats.expired) == (100, n, 100 - n)
    texts = {d.id: d.content for d in docs}
    for i in range(100):  # the newest 40 (ids 60..99) are held, the others are not
        expected = ("duplicate", str(i)) if i >= 100 - n else ("unique", None)
        assert verdict_of(dedup, doc(f"copy-{i}", texts[str(i)], None)) == expected, i


def test_expired_epochs_are_dropped_whole_and_the_index_stays_bounded(tmp_path: Path) -> None:
    n = 64
    index = open_index(
        tmp_path / "index", IndexParams.of(CONFIG), retention=Retention(max_documents=n)
    )
    dedup = Deduplicator(index, CONFIG)
    backend = index._backend
    for lo in range(0, 1200, 20):
        dedup.process(stream(20, start=lo))
        live = index.timeline.numbers()
        assert backend.epochs() == [0, *live] or backend.epochs() == live
        assert len(live) <= SLICES + 2
        assert index.stats().held == min(lo + 20, n)
    # Epochs hold n / SLICES documents each: what is stored is the window and a slice or two.
    assert index.timeline.live_first >= 1200 - n - 2 * (n // SLICES) - 20
    stored = sum(1 for e in backend.epochs() for _ in backend.scan_keys(b"d", e))
    assert n <= stored <= n + 2 * (n // SLICES) + 20
    index.close()


def test_retention_survives_a_restart_and_may_be_changed(tmp_path: Path) -> None:
    path = tmp_path / "index"
    params = IndexParams.of(CONFIG)
    docs = stream(300)
    first = Deduplicator(open_index(path, params, retention=Retention(max_documents=100)), CONFIG)
    for lo in range(0, 300, 30):
        first.process(docs[lo : lo + 30])
    before = first.index.stats()
    probes = [doc(f"p{i}", docs[i].content, None) for i in range(0, 300, 7)]
    expected = [v.verdict for v in first.decide(probes).verdicts]
    first.index.close()

    again = Deduplicator(open_index(path, None, retention=Retention(max_documents=100)), CONFIG)
    assert again.index.stats().held == before.held == 100
    assert [v.verdict for v in again.decide(probes).verdicts] == expected
    again.index.close()
    # A smaller window applies at once; a larger one holds only what was not dropped yet.
    smaller = Deduplicator(open_index(path, None, retention=Retention(max_documents=10)), CONFIG)
    assert smaller.index.stats().held == 10
    assert verdict_of(smaller, doc("c", docs[280].content, None))[0] == "unique"
    assert verdict_of(smaller, doc("c", docs[295].content, None))[0] == "duplicate"
    smaller.index.close()
    larger = Deduplicator(open_index(path, None, retention=Retention()), CONFIG)
    held = larger.index.stats().held
    assert 100 <= held < 300 and held == 300 - larger.index.timeline.live_first
    larger.index.close()


def test_a_batch_decided_twice_gives_identical_verdicts_across_epoch_changes(
    backend_factory: Callable[[], Backend],
) -> None:
    dedup = build(backend_factory(), Retention(window=120, max_documents=50))
    rng = random.Random(3)
    bases = [article(500 + i, words=60) for i in range(40)]
    docs = []
    for i in range(400):
        text = edit(rng.choice(bases), 2, i) if rng.random() < 0.5 else article(900 + i, words=60)
        docs.append(doc(i, text, T0 + i * 2000 + rng.randint(-5000, 0)))  # some late
    opened = dropped = 0
    for lo in range(0, 400, 25):
        batch = docs[lo : lo + 25]
        before = dedup.index.timeline.numbers()
        first = dedup.decide(batch)
        second = dedup.decide(batch)
        assert first.verdicts == second.verdicts and first.puts == second.puts
        dedup.commit(second)
        after = dedup.index.timeline.numbers()
        opened += after[-1] != before[-1]
        dropped += after[0] != before[0]
    assert opened >= 5 and dropped >= 5
    assert all(v.replayed for v in dedup.decide(docs[-25:]).verdicts)  # held: replayed


def test_an_index_without_retention_keeps_its_layout_and_can_start_retention(
    tmp_path: Path,
) -> None:
    path = tmp_path / "index"
    plain = Deduplicator(open_index(path, IndexParams.of(CONFIG)), CONFIG)
    docs = stream(120)
    plain.process(docs[:60])
    assert plain.index.timeline.numbers() == [0]
    plain.index.close()
    kept = Deduplicator(open_index(path, None, retention=Retention(max_documents=30)), CONFIG)
    for lo in range(60, 120, 10):
        kept.process(docs[lo : lo + 10])
    assert kept.index.timeline.numbers()[0] > 0  # epoch 0 (the first 60) expired and went
    assert kept.index.stats().held == 30
    assert verdict_of(kept, doc("c", docs[10].content, None))[0] == "unique"
    assert verdict_of(kept, doc("c", docs[119].content, None))[0] == "duplicate"
    assert not list(kept.index._backend.scan_keys(b"b")) and not list(
        kept.index._backend.scan_keys(b"d")
    )
    kept.index.close()


WRITER = """
import os, sys
from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.index import open_index
from stream_dedup.index.params import IndexParams
from stream_dedup.index.retention import Retention
from tests.index.test_retention import stream
config = DedupConfig()
retention = Retention(window=40, max_documents=60)
index = open_index(sys.argv[1], IndexParams.of(config), retention=retention)
dedup = Deduplicator(index, config)
docs = stream(2000, step_ms=700)
for lo in range(index.counter("documents"), 2000, 10):  # resumes where it was killed
    dedup.process(docs[lo : lo + 10])
    print(lo + 10, flush=True)
"""


@pytest.mark.slow
def test_retention_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "index"
    reference = build_reference()
    root = Path(__file__).resolve().parents[2]
    for kill_after in (130, 370, 610):
        with subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WRITER), str(path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        ) as child:
            assert child.stdout is not None
            for line in child.stdout:
                if int(line) >= kill_after:
                    break
            child.send_signal(signal.SIGKILL)
            child.wait()
        index = open_index(path, None, retention=Retention(window=40, max_documents=60))
        stored = index.counter("indexed")
        # A batch killed before its commit may leave its new epoch behind, unlisted.
        assert set(index.timeline.numbers()) <= set(index._backend.epochs())
        dedup = Deduplicator(index, CONFIG)
        # The state after `stored` documents is the uninterrupted run's state then.
        assert index.stats().held == reference[stored][0]
        assert index.timeline.numbers() == reference[stored][1]
        probes = [doc(f"p{i}", d.content, None) for i, d in enumerate(stream(stored)[::9])]
        assert [v.verdict for v in dedup.decide(probes).verdicts] == reference[stored][2]
        index.close()


def build_reference() -> dict[int, tuple[int, list[int], list[VerdictKind]]]:
    """The uninterrupted run of WRITER: after each batch, documents held, live epochs,
    and the verdicts of probes of every ninth document so far."""
    index = open_index(
        None, IndexParams.of(CONFIG), retention=Retention(window=40, max_documents=60)
    )
    dedup = Deduplicator(index, CONFIG)
    docs = stream(2000, step_ms=700)
    out: dict[int, tuple[int, list[int], list[VerdictKind]]] = {}
    for lo in range(0, 2000, 10):
        dedup.process(docs[lo : lo + 10])
        probes = [doc(f"p{i}", d.content, None) for i, d in enumerate(docs[: lo + 10 : 9])]
        verdicts = [v.verdict for v in dedup.decide(probes).verdicts]
        out[lo + 10] = (index.stats().held, index.timeline.numbers(), verdicts)
    return out
