"""An index another process writes, read here as it commits: the service's check process.

The service answers checks from a helper process so that a check's Python never waits for
the interpreter lock of the process deciding batches (``docs/check.md``). That process
opens the index as a :class:`FollowerIndex`:

- on RocksDB, a *secondary instance* of the writer's database: read-only, taking no lock,
  and brought up to the writer's last write by :meth:`FollowerIndex.follow`
  (RocksDB's ``TryCatchUpWithPrimary``: it replays the writer's log and manifest since
  the last catch-up). A column family created after it opened stays invisible to it, so
  when the committed timeline names an epoch it does not hold (retention opened one) or
  holds one it no longer names (retention let it go), it is reopened;
- on Redis, its own client: the records are read live, and following re-reads the
  counters and epochs.

Either way the writer commits a batch in one atomic write, so a follower sees a batch
whole or not at all, and never a batch being decided. It holds no key filter (it cannot
know the writer's new keys without reading them): every read asks the backend, which for
a check's few dozen keys costs less than keeping a filter in step.

Following has two steps. The catch-up itself (RocksDB replays the writer's log into its
own memtables: as much work as the writer's write, 10-30 ms of CPU for a 2,000-document
batch, hundreds of milliseconds of wall time on a loaded machine) takes no lock of ours,
but rocksdict keeps the interpreter lock for the whole call: checks on other threads of
the process wait for its end (``docs/check.md``), and a check whose reads straddle it may
see the new records with the counters and epochs of the commit before (a view one batch
older in part, never a wrong one, as in the writer's process). Then, under
the index's state lock (:class:`~.state_lock.StateLock`), as a writer's swap: the
counters and epochs re-read, and a reopen when the epochs changed; checks wait for that
part only (a read of a few keys; a reopen, tens of milliseconds, once per epoch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from stream_dedup.errors import IndexStoreError
from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.store import DedupIndex
from stream_dedup.index.timeline_store import stored_epochs

__all__ = ["FollowerIndex"]

#: Reopenings of a view in one follow before giving up (see ``_hold_committed_epochs``).
_REOPENS = 5


class FollowerIndex(DedupIndex):
    """An index opened to read what another process commits (see the module docstring).

    :meth:`follow` brings it up to the writer's last commit (the check process calls it
    when the service says it committed, and once a second). Nothing may be written
    through a follower.
    """

    _unfiltered = True

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend, None)
        self._following = threading.Lock()  # one catch-up at a time
        self.catch_ups = 0  # how many times it followed (for tests and diagnostics)
        # Opening races the writer as a reopen does: it may name an epoch it did not open.
        if getattr(backend, "catch_up", None) is not None and self._hold_committed_epochs(True):
            with self._state_lock.writing():
                self._load_state()

    def follow(self) -> None:
        """Bring the view up to the writer's last commit (see the module docstring)."""
        backend = self._backend
        catch_up: Callable[[], bool] | None = getattr(backend, "catch_up", None)
        with self._following:
            caught = catch_up() if catch_up is not None else True
            with self._state_lock.writing():
                if catch_up is not None:
                    self._hold_committed_epochs(caught)
                self._load_state(since=self._counters["indexed"])
            self.catch_ups += 1

    def _hold_committed_epochs(self, caught: bool) -> bool:
        """Reopen the view until it holds exactly the epochs its committed timeline names.

        A reopen lists the writer's column families, then opens the database with them;
        a batch that opens a new epoch can commit in between, and the view then names an
        epoch whose families it did not open. Each try sees a later commit, and a writer
        opens at most one epoch per batch, so a few suffice. Whether it reopened.
        """
        backend = self._backend
        for tries in range(_REOPENS):
            if caught:
                raw = backend.get_many([keys.EPOCHS])[0]
                held = set(backend.epochs())
                if (set(stored_epochs(raw).numbers()) | {0} if raw else held) == held:
                    return tries > 0
            backend.reopen()  # type: ignore[attr-defined]
            caught = True
        raise IndexStoreError(
            f"{backend.location}: the index's epochs changed at each of {_REOPENS} reopenings "
            "of its view; the check process is started again"
        )

    def prepare(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        raise RuntimeError("a follower index is read-only: the process that owns it writes")
