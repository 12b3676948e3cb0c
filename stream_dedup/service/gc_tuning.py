"""The garbage collector's schedule while the service loop runs.

A batch of 2,000 documents allocates hundreds of thousands of container objects (verdicts,
records, event fields) that reference counting frees; nearly none are in reference cycles.
Python's collector still runs whenever enough containers were allocated, which is in the
middle of a batch, when tens of thousands of them are alive, and each run re-examines them
all. Even with the young generation collected only every 50,000 allocations, about one
collection runs per batch of 2,000 documents, and it finds nothing to free: the loop's
time spent re-examining live objects for no gain.

So while the loop runs, the objects that exist at its start are frozen (``gc.freeze``, as
long-running Python servers do: they leave every collection), automatic collection is
off, and the loop calls :func:`collect_due` between batches: every
:data:`COLLECT_EVERY_S` seconds it runs one full collection, which frees whatever cycles
did form (a caught exception that references its own frame, say) within that time.
Between batches little is alive, so such a collection is cheap.

Several services may run in one process (the tests do): the settings are changed by the
first to :func:`enter` and restored by the last to :func:`leave`.
"""

from __future__ import annotations

import gc
import threading
import time

#: Seconds (monotonic clock) between two collections while the loop runs.
COLLECT_EVERY_S = 2.0

_lock = threading.Lock()
_users = 0
_was_enabled = True
_last_collect = 0.0


def enter() -> None:
    """Collect, freeze what exists and stop automatic collection (the first caller only)."""
    global _users, _was_enabled, _last_collect
    with _lock:
        if _users == 0:
            _was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()
            gc.disable()
            _last_collect = time.monotonic()
        _users += 1


def collect_due(now: float | None = None) -> bool:
    """Between batches: collect if :data:`COLLECT_EVERY_S` passed since the last time.

    Returns whether it collected. Does nothing outside :func:`enter` / :func:`leave`.
    """
    global _last_collect
    now = time.monotonic() if now is None else now
    with _lock:
        if _users == 0 or now - _last_collect < COLLECT_EVERY_S:
            return False
        _last_collect = now
    gc.collect()
    return True


def leave() -> None:
    """Undo :func:`enter` once every caller has left."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            gc.unfreeze()
            if _was_enabled:
                gc.enable()
