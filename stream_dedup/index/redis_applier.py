"""Applying one instance's writes to the shared index's record hashes, on a thread of its own.

A write of the shared index is whole at its commit point (its redo record,
:mod:`.redis_redo`): every reader inside a lease or ``as_of`` reads through a record not
applied yet, and a crash leaves it to the next applier. Applying it (some 35,000 fields
of a 2,000-document batch into the 256 record hashes) is Redis working for tens of
milliseconds, which a lone instance spent waiting, a third of its wall time. So the
backend hands it to this applier and the batch goes on: its events are delivered and the
next batch decided meanwhile.

* **In commit order.** One thread runs the applies one after another, so a write is
  applied only after this instance's earlier ones; the version rule of :mod:`.redis_redo`
  orders them against the other instances'.
* **Own writes are read back.** A read that overlays no redo record (outside a lease and
  ``as_of``, or after the instance's own commit point inside one) waits for the applies
  of its own writes first (:meth:`Applier.pending_after`, :meth:`Applier.wait`).
* **A failed apply loses nothing.** Its record stays waiting: the next write applies it
  first (a later apply, once it ran to its end, covers every earlier one), and
  :meth:`Applier.wait` applies it on the caller's thread, raising as a failed write. It
  is logged and counted (:attr:`Applier.failures`, the service's
  ``stream_dedup_index_apply_failures_total``): records left waiting make every lease
  read through them until a later apply succeeds.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from stream_dedup.index.redis_redo import RedoQueue
from stream_dedup.index.redis_resp import load_kernel

__all__ = ["Applier"]

_log = logging.getLogger(__name__)

#: ``failing(operation)``: Redis errors inside raised as the index's (``redis_client``).
Failing = Callable[[str], contextlib.AbstractContextManager[None]]


class Applier:
    """Applies the writes waiting at each of this instance's commit points, in order."""

    def __init__(self, queue: RedoQueue, epoch_set: bytes, failing: Failing) -> None:
        self._queue, self._epoch_set, self._failing = queue, epoch_set, failing
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="redis-apply")
        #: The last write handed over (its version, its apply), None once known applied.
        self._last: tuple[int, Future[None]] | None = None
        #: Applies that failed on the thread (each left its record waiting).
        self.failures = 0

    def warm_up(self) -> Future[None]:
        """Load the compiled loop the applies pack with, on the thread, ahead of the first
        write (which waits for it there, not on the caller's thread)."""
        return self._thread.submit(self._load)

    @staticmethod
    def _load() -> None:
        try:
            load_kernel()
        except Exception as exc:  # the first apply loads it again, and fails as a write
            _log.warning("loading the apply's compiled loop failed: %s", exc)

    def submit(self, version: int, waiting: list[int]) -> None:
        """Apply ``waiting`` (the versions waiting at ``version``'s commit point, it among
        them) after the writes handed over before it."""
        self._last = (version, self._thread.submit(self._apply, version, waiting))

    def _apply(self, version: int, waiting: list[int]) -> None:
        try:
            with self._failing("writing"):
                self._queue.apply(waiting, self._epoch_set)
        except Exception as exc:
            self.failures += 1
            _log.warning("applying write %d failed; its redo record waits: %s", version, exc)
            raise

    def after(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the writes handed over so far are applied (or failed to
        be): on the thread, after them; at once where none is pending. For readers in
        other processes, which read the record hashes without any redo record."""
        if self._last is None:
            callback()
        else:
            self._thread.submit(callback)

    def pending_after(self, version: int) -> bool:
        """Whether a write of this instance newer than ``version`` may not be applied."""
        return self._last is not None and self._last[0] > version

    def wait(self) -> None:
        """Return once every write handed over is applied; one the thread could not apply
        is applied here, its error raised as a failed write."""
        if self._last is None:
            return
        if self._last[1].exception() is not None:
            # only the last apply's outcome tells: it applies whatever waits before it
            with self._failing("applying a write"):
                self._queue.apply(self._queue.waiting(), self._epoch_set)
        self._last = None

    def close(self) -> None:
        """Finish what was handed over (a write Redis refused stays in its redo record, for
        the next opening or writer), then stop the thread."""
        try:
            self.wait()
        except Exception as exc:
            _log.warning("closing with a write not applied yet (its redo record waits): %s", exc)
        self._thread.shutdown(wait=True)
