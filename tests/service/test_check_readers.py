"""The check process's two readers (real RocksDB secondary instances in real processes, a
real writer index on disk): checks answered while a reader catches up and while one is
killed, views that never go back, the previous active reader caught up only once its
checks are answered, and nothing written to the index."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import check_texts
from stream_dedup.service.check_metrics import CheckMetrics
from stream_dedup.service.check_readers import Readers
from tests.index.test_dedup import article, edit
from tests.index.test_follower import batch, files_digest, writer

CONFIG = DedupConfig()


def wait_until(what: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name) or 0.0


@pytest.fixture
def written(tmp_path: Path) -> Iterator[Deduplicator]:
    """A writer index on disk holding one batch of 50 documents (``b0-*``)."""
    dedup = writer(tmp_path / "index", CONFIG)
    dedup.process(batch(0))
    yield dedup
    dedup.index.close()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def readers(
    written: Deduplicator, registry: CollectorRegistry, tmp_path: Path
) -> Iterator[Readers]:
    """Both readers of the written index, serving."""
    pair = Readers(tmp_path / "index", CONFIG, ("WARNING", "json", 2), CheckMetrics(registry))
    pair.start()
    try:
        wait_until(lambda: pair.serving() == 2)
        yield pair
    finally:
        pair.close()


def found(readers: Readers, text: str) -> list[str]:
    return [m.id for m in check_texts(readers.read, CONFIG, CONFIG.band_plan(), [text], 3)[0]]


def test_checks_answer_as_the_writer_and_see_a_commit_after_one_turn(
    written: Deduplicator, readers: Readers, registry: CollectorRegistry
) -> None:
    plan = CONFIG.band_plan()
    asked = [article(3), article(70)]  # in batch 0; in batch 1, not committed yet
    assert found(readers, asked[0]) == ["b0-3"] and found(readers, asked[1]) == []
    written.process(batch(1))
    assert found(readers, asked[1]) == []  # not followed yet: the view stays
    readers.follow()
    got = check_texts(readers.read, CONFIG, plan, asked, 3)
    assert got == check_texts(written.index, CONFIG, plan, asked, 3)
    assert [m.id for m in got[1]] == ["b1-20"]
    assert readers.documents() == 100
    # One turn is two catch-ups, one per reader; both now see batch 1.
    assert sample(registry, "stream_dedup_check_follow_seconds_count") == 2
    for _ in range(2):
        readers.follow()
        assert found(readers, asked[1]) == ["b1-20"]  # whichever reader is active


def test_readers_run_the_compiled_kernels(readers: Readers) -> None:
    """A reader loads the compiled kernels before it says ready, so a check's reads never
    run the Python ones (small inputs would otherwise stay in Python, at a cost of the
    order of the RocksDB reads): numba's compiler is mapped into each reader process."""
    for pid in readers.pids():
        assert pid is not None
        maps = Path(f"/proc/{pid}/maps").read_text(encoding="ascii", errors="replace")
        assert "llvmlite" in maps, f"reader {pid} has not loaded the compiled kernels"


def test_the_previous_reader_catches_up_only_once_its_checks_are_answered(
    written: Deduplicator, readers: Readers, registry: CollectorRegistry
) -> None:
    """A check in flight on the active reader holds back that reader's catch-up, not the
    turn's first half: the standby catches up, becomes active and answers new checks
    with the new batch meanwhile."""
    held = readers._take()  # a check in flight on the active reader
    written.process(batch(1))
    turn = threading.Thread(target=readers.follow)
    turn.start()
    try:
        wait_until(lambda: sample(registry, "stream_dedup_check_follow_seconds_count") == 1)
        assert found(readers, article(70)) == ["b1-20"]  # from the reader just caught up
        time.sleep(0.3)
        assert turn.is_alive()  # the previous active waits for its check
        assert sample(registry, "stream_dedup_check_follow_seconds_count") == 1
    finally:
        readers._give(held)
    turn.join(30)
    assert not turn.is_alive()
    assert sample(registry, "stream_dedup_check_follow_seconds_count") == 2


def test_checks_are_answered_while_a_reader_catches_up_a_large_batch(
    written: Deduplicator, readers: Readers
) -> None:
    """A batch of 2,000 documents takes the catching-up reader tens of milliseconds:
    checks sent meanwhile are answered, by the other reader, from the view before it
    until the swap and from the new one after, never going back."""
    written.process(batch(1, 2000))
    asked = article(2000 + 950)  # batch 1's document b1-950
    answers: list[tuple[float, float, bool]] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            started = time.perf_counter()
            seen = found(readers, asked) == ["b1-950"]
            answers.append((started, time.perf_counter(), seen))

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(0.2)
    began = time.perf_counter()
    readers.follow()
    ended = time.perf_counter()
    time.sleep(0.2)
    done.set()
    asker.join(30)
    seen = [s for _, _, s in answers]
    assert seen == sorted(seen) and seen[0] is False and seen[-1] is True
    during = [a for a in answers if a[0] >= began and a[1] <= ended]
    assert during, "no check was answered while the readers caught up"


def test_a_killed_reader_is_started_again_and_checks_go_on(
    written: Deduplicator, readers: Readers, registry: CollectorRegistry
) -> None:
    errors: list[BaseException] = []
    answered = [0]
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            try:
                assert found(readers, article(3)) == ["b0-3"]
                answered[0] += 1
            except BaseException as exc:  # collected, asserted below
                errors.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        time.sleep(0.3)
        first = readers.pids()
        victim = first[readers._active]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: readers.serving() == 1 or victim not in readers.pids(), 10)
        before = answered[0]
        written.process(batch(1))
        readers.follow()  # one reader serving: it catches up, checks held back
        wait_until(lambda: answered[0] > before + 5, 30)
        assert found(readers, article(70)) == ["b1-20"]
        wait_until(lambda: readers.serving() == 2)
    finally:
        done.set()
        asker.join(30)
    assert not errors
    assert victim not in readers.pids() and None not in readers.pids()
    assert sample(registry, "stream_dedup_check_reader_restarts_total") == 1
    assert sample(registry, "stream_dedup_check_readers") == 2
    readers.follow()
    assert found(readers, article(70)) == ["b1-20"]  # the new reader opened after batch 1


def test_readers_that_keep_dying_are_given_up(written: Deduplicator, tmp_path: Path) -> None:
    """Past ``http.check_restarts`` deaths in the window, :attr:`Readers.failed` says why
    (the check process then exits, and its service starts it again)."""
    registry = CollectorRegistry()
    pair = Readers(tmp_path / "index", CONFIG, ("WARNING", "json", 1), CheckMetrics(registry))
    pair.start()
    try:
        wait_until(lambda: pair.serving() == 2)
        for _ in range(2):
            pid = next(p for p in pair.pids() if p is not None)
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda pid=pid: pid not in pair.pids(), 10)
        wait_until(lambda: pair.failed is not None, 30)
        assert "http.check_restarts" in (pair.failed or "")
    finally:
        pair.close()


def test_readers_write_nothing_to_the_index(tmp_path: Path) -> None:
    """Readers opened, checks answered, turns taken, readers closed: every file of the
    writer's directory holds the bytes it held before (the writer closed, so that its
    own background work changes nothing meanwhile)."""
    dedup = writer(tmp_path / "index", CONFIG)
    dedup.process(batch(0))
    dedup.index.close()
    before = files_digest(tmp_path / "index")
    registry = CollectorRegistry()
    pair = Readers(tmp_path / "index", CONFIG, ("WARNING", "json", 2), CheckMetrics(registry))
    pair.start()
    try:
        wait_until(lambda: pair.serving() == 2)
        for _ in range(3):
            assert found(pair, article(3)) == ["b0-3"]
            pair.follow()
    finally:
        pair.close()
    assert files_digest(tmp_path / "index") == before


def test_the_front_scores_payloads_compressed_with_the_index_dictionary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index trains a payload dictionary on its first texts and later payloads name
    it. The front never opens the index: it gets the dictionary from a reader, and
    scores as the writer does."""
    from stream_dedup.core import payload_dictionary

    dedup = writer(tmp_path / "index", CONFIG)
    try:
        for b in range(5):
            dedup.process(batch(b, 500))
        assert dedup.index.payload_dictionary() is not None
        asked = [edit(article(4 * 500 + 7), 3, 1), article(2 * 500 + 9)]
        plan = CONFIG.band_plan()
        expected = check_texts(dedup.index, CONFIG, plan, asked, 2)
        assert [m.id for m in expected[0]][:1] == ["b4-7"]
        # This process knows the dictionary from the writer: forget it, as a front would.
        monkeypatch.setattr(payload_dictionary, "_known", {})
        monkeypatch.setattr(payload_dictionary, "_sources", [])
        metrics = CheckMetrics(CollectorRegistry())
        pair = Readers(tmp_path / "index", CONFIG, ("WARNING", "json", 2), metrics)
        pair.start()
        try:
            assert pair.wait_serving()
            assert check_texts(pair.read, CONFIG, plan, asked, 2) == expected
        finally:
            pair.close()
    finally:
        dedup.index.close()
