"""The garbage collector's settings while the service loop runs.

A batch of 2,000 documents allocates hundreds of thousands of short-lived containers
(verdicts, records, event fields), nearly none of them in reference cycles. At Python's
default threshold (700 allocations) the collector runs hundreds of times per batch, and its
older generations re-scan everything loaded at start-up (numba, numpy, the Kafka
bindings): measured on the batch path, about a third of the time spent building a batch's
events, and a tenth of deciding it. While the loop runs, the objects that exist at its
start are frozen (``gc.freeze``, as long-running Python servers do), which takes them out
of every collection, and the young generation is collected every
:data:`YOUNG_THRESHOLD` allocations. Cycles are still collected, in larger, rarer steps.

Several services may run in one process (the tests do): the settings are changed by the
first to :func:`enter` and restored by the last to :func:`leave`.
"""

from __future__ import annotations

import gc
import threading

#: Allocations of container objects between two young-generation collections.
YOUNG_THRESHOLD = 50_000

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None


def enter() -> None:
    """Freeze what exists and raise the young threshold (the first caller only)."""
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = gc.get_threshold()
            gc.collect()
            gc.freeze()
            gc.set_threshold(YOUNG_THRESHOLD, _saved[1], _saved[2])
        _users += 1


def leave() -> None:
    """Undo :func:`enter` once every caller has left."""
    global _users, _saved
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and _saved is not None:
            gc.unfreeze()
            gc.set_threshold(*_saved)
            _saved = None
