"""The lock between an index's writer and its readers on other threads: readers share it,
the writer's swap excludes them.

The service answers checks on its HTTP threads while its loop commits batches into the
same index (:meth:`~stream_dedup.index.reads.IndexReads.consistent`). With one plain lock
the checks excluded *each other*: a check holds it across its reads, and every step of
those reads needs the interpreter lock, which the loop thread holds while it decides a
batch, so one check held the state lock for many interpreter switches (5 ms each by
default) while the other checks, and the loop's own commit, queued behind it. Under
ingest at 1,000 docs/s, half of the samples of the HTTP threads were waits on that lock
(py-spy, ``docs/benchmarks.md``, 2026-11-26). Readers change nothing, so they need only
be kept away from the writer's swap of counters, epochs and filters, not from one another.

The writer goes first: once it waits, new readers wait behind it, so a steady stream of
checks cannot hold a commit back for longer than the reads already under way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["StateLock"]


class StateLock:
    """Shared for readers (:meth:`reading`), exclusive for the writer (:meth:`writing`).

    Not reentrant: a reader must not take :meth:`writing`, nor the writer :meth:`reading`.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer_waiting = 0
        self._writing = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the lock shared with other readers: no writer is inside meanwhile."""
        with self._cond:
            while self._writing or self._writer_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the lock alone: the readers inside have left, and new ones wait."""
        with self._cond:
            self._writer_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writer_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    @property
    def readers(self) -> int:
        """Readers inside now (for tests and diagnostics; changes as soon as read)."""
        return self._readers
