"""The loop's garbage-collector schedule: set once, restored by the last user, and cycles
are still collected between batches."""

from __future__ import annotations

import gc
import time
import weakref

from stream_dedup.service import gc_tuning


def test_nested_users_restore_the_settings_when_the_last_leaves() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    gc_tuning.enter()
    try:
        assert not gc.isenabled()
        assert gc.get_freeze_count() > frozen
        gc_tuning.enter()
        gc_tuning.leave()
        assert not gc.isenabled()  # one user is still in
    finally:
        gc_tuning.leave()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    gc_tuning.leave()  # an unmatched leave changes nothing
    assert gc.isenabled()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_cycles_are_collected_when_due_and_not_before() -> None:
    gc_tuning.enter()
    try:
        node = _Node()
        alive = weakref.ref(node)
        del node
        start = time.monotonic()
        assert not gc_tuning.collect_due(start)  # entered just now: not due
        assert alive() is not None  # automatic collection is off
        assert gc_tuning.collect_due(start + gc_tuning.COLLECT_EVERY_S + 1)
        assert alive() is None
        assert not gc_tuning.collect_due(start + gc_tuning.COLLECT_EVERY_S + 2)
    finally:
        gc_tuning.leave()
    assert not gc_tuning.collect_due(time.monotonic() + 1e6)  # outside the loop: never
