"""The index's state lock: readers (checks) share it, the writer's swap excludes them, and
a waiting writer holds new readers back."""

from __future__ import annotations

import threading
from collections.abc import Callable

from stream_dedup.core.config import DedupConfig
from stream_dedup.dedup import Deduplicator
from stream_dedup.dedup.check import check_texts
from stream_dedup.index import Backend, DedupIndex
from stream_dedup.index.params import IndexParams
from stream_dedup.index.state_lock import StateLock
from stream_dedup.models import Document
from tests.index.test_dedup import article, edit

#: Long enough for a thread that is free to go on to have gone on, on a loaded machine.
WAIT_S = 10.0


def in_thread(work: Callable[[], object]) -> tuple[threading.Thread, threading.Event]:
    """``work`` run on a new thread; the event is set once it returned."""
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def test_readers_share_the_lock() -> None:
    lock = StateLock()
    second = lock.reading()  # held here: a dropped context manager would leave
    with lock.reading():
        _, done = in_thread(second.__enter__)
        assert done.wait(WAIT_S)  # a second reader got in while the first is inside
        assert lock.readers == 2
        second.__exit__(None, None, None)
    assert lock.readers == 0


def test_the_writer_waits_for_readers_and_then_holds_new_readers_back() -> None:
    lock = StateLock()
    order: list[str] = []
    reader = lock.reading()
    reader.__enter__()

    def write() -> None:
        with lock.writing():
            order.append("writer")

    def read() -> None:
        with lock.reading():
            order.append("late reader")

    _, wrote = in_thread(write)
    assert not wrote.wait(0.3)  # the reader inside keeps the writer out
    while not lock._writer_waiting:  # the writer is queued now
        threading.Event().wait(0.01)
    _, read_late = in_thread(read)
    assert not read_late.wait(0.3)  # a new reader waits behind the writer
    reader.__exit__(None, None, None)
    assert wrote.wait(WAIT_S) and read_late.wait(WAIT_S)
    assert order == ["writer", "late reader"]
    assert lock.readers == 0


def test_a_check_is_answered_while_another_check_holds_the_reads_and_a_commit_waits(
    backend_factory: Callable[[], Backend],
) -> None:
    """The service's case: one check is inside its reads (as when it waits for the
    interpreter lock there), a batch's commit waits for it; a check that came before the
    commit is answered meanwhile, and the commit then completes with the verdicts of an
    index never checked."""
    config = DedupConfig()

    def open_one() -> Deduplicator:
        return Deduplicator(DedupIndex(backend_factory(), IndexParams.of(config)), config)

    checked, plain = open_one(), open_one()
    stories = [Document(f"s{i}", article(i)) for i in range(20)]
    for dedup in (checked, plain):
        dedup.process(stories)
    slow_reader = checked.index.consistent()
    slow_reader.__enter__()
    try:
        answers: list[object] = []
        asked = edit(article(3), 4, seed=1)
        _, answered = in_thread(
            lambda: answers.append(
                check_texts(checked.index, config, checked.plan, [asked], 3)[0][0].id
            )
        )
        assert answered.wait(WAIT_S)  # with one exclusive lock it waited for the first
        assert answers == ["s3"]
        batch = [Document(f"b{i}", edit(article(i), 3, seed=50 + i)) for i in range(10)]
        verdicts: list[object] = []
        _, committed = in_thread(lambda: verdicts.append(checked.process(batch).verdicts))
        assert not committed.wait(0.5)  # the commit's swap waits for the reads under way
    finally:
        slow_reader.__exit__(None, None, None)
    assert committed.wait(WAIT_S)
    assert verdicts == [plain.process(batch).verdicts]
    assert checked.index.stats().documents == 30
