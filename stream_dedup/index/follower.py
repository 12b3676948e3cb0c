"""An index another process writes, read here as it commits: the service's check process.

The service answers checks from a helper process so that a check's Python never waits for
the interpreter lock of the process deciding batches (``docs/check.md``). That process
opens the index as a :class:`FollowerIndex`:

- on RocksDB, a *secondary instance* of the writer's database: read-only, taking no lock,
  and brought up to the writer's latest write by :meth:`FollowerIndex.follow`
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

Following runs under the index's state lock (:class:`~.state_lock.StateLock`) as a
writer's swap does: checks wait for it (a catch-up takes about a millisecond), and no read
runs on a family being reopened or a timeline being replaced.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from stream_dedup.index import keys
from stream_dedup.index.backend import Backend
from stream_dedup.index.store import DedupIndex
from stream_dedup.index.timeline_store import stored_epochs

__all__ = ["FollowerIndex"]


class FollowerIndex(DedupIndex):
    """An index opened to read what another process commits (see the module docstring).

    ``moved`` says whether the writer has committed since it was last asked (the service
    tells its check process after each commit); :meth:`consistent` follows first when it
    has, so a check sees every batch committed before it began. Nothing may be written
    through a follower.
    """

    _unfiltered = True

    def __init__(self, backend: Backend, moved: Callable[[], bool] | None = None) -> None:
        super().__init__(backend, None)
        self._moved = moved if moved is not None else (lambda: True)
        self._following = threading.Lock()  # one catch-up at a time; checks wait for it
        self.catch_ups = 0  # how many times it followed (for tests and diagnostics)

    @contextlib.contextmanager
    def consistent(self) -> Iterator[None]:
        """Follow the writer if it committed since, then read as any reader does."""
        self.follow()
        with super().consistent():
            yield

    def follow(self, force: bool = False) -> bool:
        """Bring the view up to the writer's last commit, when ``moved()`` says it
        committed (or ``force``); whether it followed."""
        with self._following:
            if not (self._moved() or force):
                return False
            with self._state_lock.writing():
                catch_up: Callable[..., None] | None = getattr(self._backend, "catch_up", None)
                if catch_up is not None:
                    catch_up()
                    raw = self._backend.get_many([keys.EPOCHS])[0]
                    if raw is not None:  # reopen when the live epochs changed
                        catch_up(stored_epochs(raw).numbers())
                self._load_state(since=self._counters["indexed"])
            self.catch_ups += 1
            return True

    def prepare(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        raise RuntimeError("a follower index is read-only: the process that owns it writes")
